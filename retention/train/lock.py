"""One run per folder: an exclusive lock (flock) on a file in the run folder, held while the run trains.

The operating system releases the lock when its process ends, however it ends (kill -9 included), so a stale
file never blocks a rerun; the file holds who took the lock (pid, host, time) for the message a second run gets.
A lock file that is a symbolic link is refused, never followed. The file is never deleted (deleting a lock file
others may have opened would let two runs hold "the" lock).
"""

import fcntl
import json
import os
import socket
import time


class RunFolderBusy(RuntimeError):
    """Another process is training in the same run folder."""


class RunLock:
    """`with RunLock(run_dir, name):` holds `run_dir/name` locked, or raises RunFolderBusy at once naming the folder
    and the process that holds it."""

    def __init__(self, run_dir: str, name: str = "train.lock"):
        self.run_dir = os.path.abspath(run_dir)
        self.path = os.path.join(self.run_dir, name)

    def __enter__(self):
        os.makedirs(self.run_dir, exist_ok=True)
        try:  # a symbolic link is never followed: its target may be any file outside the run folder
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as e:
            if not os.path.islink(self.path):
                raise
            raise ValueError(
                f"the run lock {self.path} is a symbolic link (to {os.readlink(self.path)!r}): the trainer writes "
                "only files inside the run folder. Remove the link and rerun."
            ) from e
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._holder()
            os.close(self.fd)
            raise RunFolderBusy(
                f"another run is training in {self.run_dir} ({holder}; lock file {self.path}): two runs in one folder "
                "would overwrite each other's checkpoints. Wait for it to end, stop it, or use another folder "
                "(hydra.run.dir=...)."
            ) from None
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, json.dumps(holder).encode(), 0)
        return self

    def _holder(self) -> str:
        """Who holds the lock, as the file says."""
        try:
            holder = json.loads(os.pread(self.fd, 4096, 0) or b"{}")
            return f"pid {holder['pid']} on host {holder['host']}, since {holder['since']}"
        except (ValueError, KeyError):
            return "a process that has not written its name yet"

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)

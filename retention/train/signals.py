"""Stop requests: SIGTERM (preemption), SIGINT (Ctrl-C) and SIGUSR2 (submitit's "time is up, requeue") make the
loop save a checkpoint after the current step and exit.

One process decides alone. In a multi-process job with JAX's preemption service (jax.distributed starts it) a
local decision could have one process save while another trains on, so there SIGTERM is left to JAX (its notifier
tells every process), SIGINT and SIGUSR2 are passed on to it as SIGTERM, and all processes stop at the step JAX's
sync point names (Orbax's `CheckpointManager.reached_preemption`, asked every step by the loop).
"""

import signal

import jax


def jax_preemption_service() -> bool:
    """Whether this process is in a multi-process job with JAX's preemption service (jax.distributed.initialize
    starts it unless the jax_enable_preemption_service flag is off)."""
    return jax.process_count() > 1 and bool(jax.config.jax_enable_preemption_service)


class StopSignals:
    """Within the block, the stop signals only record their number in `.signum`; `exit()` then ends the process."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)

    def __enter__(self):
        self.signum = None
        self.forward = jax_preemption_service()
        ours = [s for s in self.SIGNALS if not (self.forward and s == signal.SIGTERM)]
        self.previous = {s: signal.signal(s, self._record) for s in ours}
        return self

    def _record(self, signum, frame):
        self.signum = signum
        if self.forward:  # JAX's notifier owns SIGTERM: it makes every process agree on the step to stop at
            signal.raise_signal(signal.SIGTERM)

    def exit(self, signum: int | None = None):
        """After the checkpoint is saved: hand the signal to the handler that was there before (submitit's USR2
        handler requeues the job; Python's own SIGINT handler is not called), then exit with 128 + the signal."""
        signum = signum or self.signum or signal.SIGTERM
        previous = self.previous.get(signum)
        self.__exit__()
        if callable(previous) and previous is not signal.default_int_handler:
            previous(signum, None)
        raise SystemExit(128 + signum)

    def __exit__(self, *exc):
        for s, handler in self.previous.items():
            signal.signal(s, handler)
        self.previous = {}

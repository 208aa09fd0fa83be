"""The token cache of a 200 MB corpus is built and read without holding the corpus: in a fresh process, the
peak of traced allocations (numpy's included) stays below a few read chunks while tokenising and below twice the
largest batch while drawing batches from the memory map."""

import json
import os
import subprocess
import sys

import numpy as np

from tests.train.common import ROOT

MEASURE = """
import json, sys, tracemalloc
from retention.data import Text, corpus
tracemalloc.start()
kwargs = dict(seq_len=4096, batch_size=16, path=sys.argv[1], eval_fraction=0.5, cache_dir=sys.argv[2])
data = Text(**kwargs)
build_peak = tracemalloc.get_traced_memory()[1]
tracemalloc.reset_peak()
data = Text(**kwargs)  # a cache hit: the memory maps only
biggest = 0
for i in range(4):
    for split in ("train", "eval"):
        b = data.batch(i, split=split, seq_len=4 * 4096)
        biggest = max(biggest, b.inputs.nbytes + b.targets.nbytes + b.segment_ids.nbytes)
        del b
read_peak = tracemalloc.get_traced_memory()[1]
ids = {s: len(v) for s, v in data.splits.items()}
print(json.dumps(dict(build_peak=build_peak, read_peak=read_peak, batch=biggest, ids=ids, chunk=corpus.CHUNK_BYTES)))
"""


def test_memory_stays_bounded_for_200mb(tmp_path):
    rng = np.random.default_rng(0)
    block = rng.integers(32, 127, size=1 << 20, dtype=np.uint8)
    block[rng.integers(0, 1 << 20, 20000)] = ord("\n")
    os.makedirs(tmp_path / "docs")
    for i in range(4):  # 4 files of 50 MiB
        with open(tmp_path / "docs" / f"{i}.txt", "wb") as f:
            for j in range(50):
                f.write(np.roll(block, i * 50 + j).tobytes())
    corpus_bytes = sum(os.path.getsize(tmp_path / "docs" / n) for n in os.listdir(tmp_path / "docs"))
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, str(tmp_path / "docs"), str(tmp_path / "cache")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert sum(got["ids"].values()) == corpus_bytes + 4  # every byte and an EOD per document
    assert got["read_peak"] < 2 * got["batch"], got
    assert got["build_peak"] < 8 * got["chunk"] < corpus_bytes / 6, got

"""Recall at long context: trained MQAR and passkey runs read at lengths far past their training, by the run's own
generator (retention/data/mqar.py, passkey.py) on eval-split draws from the comparison's TEST_OFFSET on (draws the
trainer's eval and learning-rate choice never saw), each row one sequence read by the model's Reader.

- MQAR: every row laid out far (far_fraction 1) with a gap of `gap_fraction * L` tokens between the last pair and
  the first query (`MQAR.batch(min_gap=...)`), so every query stands more than that many tokens after its key. A
  query is one labelled position (one key asked again; its value the target): a row holds num_kv_pairs of them,
  and ceil(queries / num_kv_pairs) rows give at least `queries`. accuracy: the share of queries right; exact
  match: the share of rows with every query right.
- passkey: a query is one row (one passkey: its five digits the labels), ceil(queries / depths) rows at each of
  the run's depths, so at least `queries` rows in all. exact match: the share of passkeys with all five digits
  right (per depth and over all); accuracy: the share of digits.
Rows are read in the fewest batches of at most max(1, batch_tokens // L) rows, all of one size (rows_and_batch).
"""

import dataclasses
import math
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp

from experiments.compare.presets import TEST_OFFSET
from experiments.long_context.models import Trained
from experiments.long_context.reader import Reader
from retention.train.config import make_dataset
from retention.train.step import SCALAR_SUMS, ratios
from retention.validation import check_int, check_number

TASKS = ("mqar", "passkey")


def rows_and_batch(queries: int, per_row: int, length: int, batch_tokens: int) -> tuple[int, int, int]:
    """How many rows hold at least `queries` queries of `per_row` each, read in how many batches of how many rows.

    Args:
        queries: the fewest queries to read.
        per_row: queries in one row.
        length: tokens per row (L).
        batch_tokens: tokens per batch, at least one row.

    Returns:
        (rows, batches, batch): rows = ceil(queries / per_row), in the fewest batches of at most
        max(1, batch_tokens // length) rows, each as small as that allows (so batches * batch - rows < batches).
    """
    for name, value in (("queries", queries), ("per_row", per_row), ("length", length)):
        check_int(name, value)
    check_int("batch_tokens", batch_tokens)
    rows = math.ceil(queries / per_row)
    batches = math.ceil(rows / max(1, batch_tokens // length))
    return rows, batches, math.ceil(rows / batches)


def _read(reader: Reader, make_batch: Callable[[int], object], batches: int) -> tuple[dict, float]:
    """(the scalar masked sums over batches 0..batches-1 of make_batch, the seconds they took)."""
    total, start = dict.fromkeys(SCALAR_SUMS, 0.0), time.perf_counter()
    for i in range(batches):
        b = make_batch(i)
        sums = jax.device_get(reader.sums(jnp.asarray(b.inputs), jnp.asarray(b.targets)))
        total = {k: total[k] + float(sums[k]) for k in SCALAR_SUMS}
    return total, time.perf_counter() - start


def _metrics(total: dict) -> dict:
    """accuracy, exact match, queries (labels) and rows of summed masked sums."""
    out = ratios(total)
    return {"accuracy": out["accuracy"], "exact_match": out["exact_match"], "labels": int(total["labels"])}


def mqar_recall(
    trained: Trained, reader_for: Callable[[int], Reader], length: int, queries: int, gap_fraction: float, batch_tokens
) -> dict:
    """MQAR recall of one run at `length` with the gap `gap_fraction * length` (module docstring).

    Args:
        trained: an MQAR run.
        reader_for: batch -> the model's Reader for [batch, length] rows.
        length: L.
        queries: at least this many queries.
        gap_fraction: the gap between the pairs and the first query, as a share of L, in [0, 1).
        batch_tokens: tokens per batch (rows_and_batch).

    Returns:
        {"queries", "sequences", "min_gap", "accuracy", "exact_match", "seconds", **the reader's cost}.
    """
    check_number("gap_fraction", gap_fraction, low=0, high=1, open_high=True)
    data_cfg = trained.config.data
    _, batches, batch = rows_and_batch(queries, data_cfg.num_kv_pairs, length, batch_tokens)
    data = make_dataset(dataclasses.replace(data_cfg, batch_size=batch, far_fraction=1.0), trained.config.seed)
    gap = round(gap_fraction * length)
    gap += gap % 2  # queries sit at even offsets: the generator rounds the gap up to even
    data.check_length(f"length with gap_fraction={gap_fraction}", length, gap)
    reader = reader_for(batch)
    make = lambda i: data.batch(TEST_OFFSET + i, seq_len=length, split="eval", min_gap=gap)
    total, seconds = _read(reader, make, batches)
    out = _metrics(total)
    return {
        "queries": out.pop("labels"),
        "sequences": batches * batch,
        "min_gap": gap,
        **out,
        "seconds": seconds,
        **reader.cost(),
    }


def passkey_recall(trained: Trained, reader_for: Callable[[int], Reader], length: int, queries: int, batch_tokens):
    """Passkey recall of one run at `length`, at each of its depths (module docstring).

    Args:
        trained: a passkey run.
        reader_for: batch -> the model's Reader for [batch, length] rows.
        length: L.
        queries: at least this many passkeys over all depths.
        batch_tokens: tokens per batch (rows_and_batch).

    Returns:
        {"queries" (passkeys), "exact_match", "accuracy" (digits), "depths": {depth: {"queries", "exact_match",
        "accuracy"}}, "seconds", **the reader's cost}.
    """
    data_cfg = trained.config.data
    depths = tuple(data_cfg.depths)
    _, batches, batch = rows_and_batch(math.ceil(queries / len(depths)), 1, length, batch_tokens)
    data = make_dataset(dataclasses.replace(data_cfg, batch_size=batch), trained.config.seed)
    reader = reader_for(batch)
    per_depth, totals, seconds = {}, dict.fromkeys(SCALAR_SUMS, 0.0), 0.0
    for depth in depths:
        make = lambda i, d=depth: data.batch(TEST_OFFSET + i, seq_len=length, split="eval", depth=d)
        total, took = _read(reader, make, batches)
        out = _metrics(total)
        per_depth[f"{depth:g}"] = {"queries": int(total["rows"]), **{k: out[k] for k in ("exact_match", "accuracy")}}
        totals = {k: totals[k] + total[k] for k in SCALAR_SUMS}
        seconds += took
    out = _metrics(totals)
    return {
        "queries": int(totals["rows"]),
        "exact_match": out["exact_match"],
        "accuracy": out["accuracy"],
        "depths": per_depth,
        "seconds": seconds,
        **reader.cost(),
    }

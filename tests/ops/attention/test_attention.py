"""The softmax-attention paths on one device on the case table (tests/ops/attention_cases.py): outputs and the
gradients in q, k, v against the float64 dense oracle, packed cases against each document run alone; every path
runs every case.

- blockwise: `softmax_attention(impl="xla")` at the default block size, `blockwise_attention` at the case's;
- dense: `softmax_attention(impl="reference")`;
- step: `softmax_attention_step` fed 1 token and 5 tokens at a time against `init_kv_cache` (T slots for full
  attention, window + n - 1 for a window: a ring buffer), with each piece's segment ids when packed.
"""

import jax.numpy as jnp
import pytest

from retention import init_kv_cache, softmax_attention, softmax_attention_step
from retention.ops.attention.blockwise import blockwise_attention
from tests.helpers import random_qkv
from tests.ops.attention_cases import cache_slots, case_ids, check_attention_path, stepped


@pytest.mark.parametrize("case", case_ids())
def test_blockwise(case):
    def path(q, k, v, segment_ids):
        if case.block is None:
            return softmax_attention(q, k, v, window=case.window, segment_ids=segment_ids, impl="xla")
        options = dict(window=case.window, segment_ids=segment_ids, block_size=case.block)
        return blockwise_attention(q, k, v, scale=case.d**-0.5, **options)

    check_attention_path(case, path)


@pytest.mark.parametrize("case", case_ids())
def test_dense_reference(case):
    path = lambda q, k, v, ids: softmax_attention(q, k, v, window=case.window, segment_ids=ids, impl="reference")
    check_attention_path(case, path)


STEP_PARAMS = [  # 5 tokens a step only where T > 5 (at T <= 5 it is one step, as the first step of 1 token); quick
    # tier: 1 token a step at T = 1, 5 a step elsewhere (a token a step at every T is a further case)
    pytest.param(case, n, id=f"{param.id}-n{n}", marks=[*param.marks, *([pytest.mark.slow] if n == 1 < case.T else [])])
    for n in (1, 5)
    for param in case_ids(lambda case, n=n: n == 1 or case.T > n)
    for case in param.values
]


@pytest.mark.parametrize("case,n", STEP_PARAMS)
def test_step(case, n):
    """n tokens a step; the scan's step compiles once, the rest of T % n tokens is one more step."""
    step = lambda cache, q, k, v, ids: softmax_attention_step(cache, q, k, v, window=case.window, segment_ids=ids)
    cache = init_kv_cache(case.B, case.H, case.d, cache_slots(case, n), case.dtype)
    check_attention_path(case, stepped(step, cache, n))


def test_auto_is_blockwise_on_cpu():
    q, k, v, _ = random_qkv(3, 1, 77, 4, 2, 8)
    assert jnp.array_equal(softmax_attention(q, k, v), softmax_attention(q, k, v, impl="xla"))

"""A prompt prefilled through the prefix cache (`prefill_cached`: the uncached rest fed block by block, a chunked
prefill from the cache, an entry at each block boundary) against the full prompt's forward logits (the training
path, an independent op): the returned snapshot's last logits, each stored entry's logits at its boundary, and the
logits of tokens run into the snapshot after it until the cache is full; a miss (prefilled from nothing) and a
hit that continues a rest of 580 tokens past a boundary, for A (every cache a KV cache: the rest in one step, each
entry cut from the snapshot after it), W and a hybrid with a convolution (a step per block). Blocks of 512 tokens
make a step fold the cached keys in more than one key block of its scores (only the filled are read), and A's
580-token step spans two query blocks. A bad prompt is refused naming the argument."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from retention.nn import LM, LMConfig
from retention.serve import PrefixCache
from retention.serve.prefix_prefill import prefill_cached
from retention.serve.snapshot import extend
from tests.helpers import rel_err

pytestmark = pytest.mark.integration  # the serving layer (retention.serve, snapshots): make test-integration

BASE = LMConfig(vocab_size=61, d_model=32, n_layers=2, pattern="A", n_heads=4, n_kv_heads=2, head_dim=8, window=5)
BLOCK, T, MORE = 512, 1100, 3  # 2 whole blocks and 76 tokens; max_len T + MORE: the cache full after MORE more
TOL = 1e-4  # float32 logits of another summation order (the repo's float32 bar: well under 1e-4)


def model_of(pattern: str) -> LM:
    return LM(dataclasses.replace(BASE, pattern=pattern, conv_size=4 if len(pattern) > 1 else 0), rngs=nnx.Rngs(0))


def tokens(seed: int, n: int) -> jax.Array:
    return jax.random.randint(jax.random.key(seed), (1, n), 0, BASE.vocab_size, dtype=jnp.int32)


@pytest.mark.parametrize("pattern", ["A", "W", pytest.param("PA", marks=pytest.mark.slow)])
def test_a_cached_prefill_equals_the_full_prompts_forward(pattern):
    model = model_of(pattern)
    step_tokens = BLOCK if pattern == "W" else 1  # a window's ring buffer holds a block's step
    cache = PrefixCache(1 << 30, BLOCK)
    first = tokens(1, T)
    second = jnp.concatenate([first[:, :BLOCK], tokens(2, 580)], axis=1)  # a block cached, 580 tokens to run
    reused = []
    for prompt in (first, second):  # a miss, then a hit
        before = cache.stats().tokens_reused
        snapshot = prefill_cached(model, cache, prompt, max_len=T + MORE, step_tokens=step_tokens)
        reused.append(cache.stats().tokens_reused - before)
        suffix = tokens(3, MORE)
        want = model(jnp.concatenate([prompt, suffix], axis=1))  # [1, n + MORE, V]
        n = prompt.shape[1]
        assert rel_err(snapshot.logits, want[:, n - 1]) < TOL
        for k in (BLOCK, 2 * BLOCK):
            done, entry = cache.longest(prompt[0, :k].tolist())
            assert done == k and rel_err(entry.logits, want[:, k - 1]) < TOL
        for i in range(MORE):  # token by token to the last slot
            snapshot = extend(model, snapshot, suffix[:, i : i + 1])
            assert rel_err(snapshot.logits, want[:, n + i]) < TOL
    assert reused == [0, BLOCK]


@pytest.mark.parametrize(
    "prompt, message",
    [
        (jnp.zeros((2, 8), jnp.int32), "prompt must be one row"),
        (jnp.zeros((8,), jnp.int32), "prompt must be an int array"),
        (jnp.zeros((1, 8), jnp.float32), "prompt must be an int array"),
        (jnp.zeros((1, 0), jnp.int32), "prompt is an empty prompt"),
        (jnp.zeros((1, 40), jnp.int32), "prompt has 40 tokens, more than max_len=32"),
        (jnp.full((1, 8), 61, jnp.int32), "prompt ids must be in"),
    ],
)
def test_a_bad_prompt_is_refused_naming_it(prompt, message):
    cache = PrefixCache(1 << 30, 4)
    with pytest.raises(ValueError, match=message):
        prefill_cached(model_of("A"), cache, prompt, max_len=32, step_tokens=1)
    assert cache.stats().entries == 0

"""Speculative decoding: the output equals the target's greedy `generate` token for token at every draft
acceptance, from a random draft (about none accepted) to the target as its own draft (all accepted); the
rolled-back snapshot continues as the accepted tokens run from the start; k beyond step_tokens is refused."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from retention import generate, prefill
from retention.nn import LM, LMConfig
from retention.serve.speculative import speculative_generate, verify

pytestmark = pytest.mark.integration  # the serving layer (retention.serve, snapshots): make test-integration

TARGET = LMConfig(vocab_size=61, d_model=32, n_layers=2, pattern="PW", n_heads=4, n_kv_heads=2, head_dim=8, window=5)
N, K = 13, 3


@pytest.mark.parametrize(
    "draft_seed", [pytest.param(None, marks=pytest.mark.slow), 1]
)  # None: the target drafts for itself
def test_speculative_output_equals_the_targets_greedy_decode(draft_seed):
    target = LM(TARGET, rngs=nnx.Rngs(0))
    draft = target if draft_seed is None else LM(dataclasses.replace(TARGET, pattern="P"), rngs=nnx.Rngs(draft_seed))
    prompt = jax.random.randint(jax.random.key(2), (1, 9), 0, TARGET.vocab_size, dtype=jnp.int32)
    want = np.asarray(generate(target, prompt, N, temperature=0.0).tokens[0, 9:])
    got = speculative_generate(target, draft, prompt, N, k=K)
    np.testing.assert_array_equal(got.tokens, want)
    if draft_seed is None:
        assert got.acceptance_rate == 1.0 and got.tokens_per_target_call == K + 1
    else:
        assert got.acceptance_rate < 0.5 and got.tokens_per_target_call < 2.5


def test_rolled_back_snapshot_continues_as_the_accepted_tokens_run_from_the_start():
    target = LM(TARGET, rngs=nnx.Rngs(0))
    prompt = jax.random.randint(jax.random.key(3), (1, 9), 0, TARGET.vocab_size, dtype=jnp.int32)
    g0, g1, g2 = np.asarray(generate(target, prompt, 3, temperature=0.0).tokens[0, 9:]).tolist()
    snapshot = prefill(target, prompt, max_len=40, step_tokens=K + 1)
    fed = jnp.array([[g0, g1, (g2 + 1) % TARGET.vocab_size, 7]], jnp.int32)  # d_1 right, d_2 wrong
    verified = verify(target, snapshot, fed)
    assert verified.accepted == 1 and verified.choices[:2].tolist() == [g1, g2]
    from_start = generate(target, jnp.concatenate([prompt, fed[:, :2]], axis=1), N, temperature=0.0)
    rolled_back = generate(target, fed[:, :0], N, temperature=0.0, start=verified.snapshot)
    np.testing.assert_array_equal(rolled_back.tokens[0], from_start.tokens[0, 11:])
    assert int(verified.snapshot.caches.length) == 11
    with pytest.raises(ValueError, match=r"k=3 drafts .* larger than the snapshot's step_tokens=2"):
        verify(target, prefill(target, prompt, max_len=32, step_tokens=2), fed)

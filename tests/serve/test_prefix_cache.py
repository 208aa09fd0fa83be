"""The engine's automatic prefix cache: a request whose prompt shares whole blocks with an earlier one continues from
the longest cached prefix and gets the tokens of its run alone (greedy `generate`), for every layer letter (P, A, W,
D, G, M) and a hybrid with a convolution, the hit and the tokens reused reported; the longest of several cached
prefixes is chosen; a small byte budget holds no more than it allows and evicts the least recently used entry; a
budget of 0 keeps nothing and changes nothing; a change of weights drops the entries (another model's state is never
continued); bad arguments are refused before any work, naming them; 32 requests submitted at once to 4 slots, with
prefixes shared in several ways, each equal their run alone; a growing cache (an A layer's keys and values, 4-bit
too, stacked layers too) is held once, a block per entry, so the bytes held grow linearly with the prompt and a
continuation joined from the blocks equals its run alone; a small budget evicts leaves first, so every held entry's
prefix stays whole and a hit after evictions equals its run alone; the trie's chained entries need their parents."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from retention import generate
from retention.nn import LM, LMConfig
from retention.serve import PrefixCache
from retention.serve.engine import Engine

pytestmark = pytest.mark.integration  # the serving layer (retention.serve, snapshots): make test-integration

BASE = LMConfig(
    vocab_size=61, d_model=32, n_layers=2, pattern="P", n_heads=4, n_kv_heads=2, head_dim=8, window=5,
    ssm_state_size=4,
)  # fmt: skip
MAX_LEN, BLOCK = 32, 4
BUDGET = 1 << 30  # room for every entry


def model_of(pattern: str, seed: int = 0) -> LM:
    return LM(dataclasses.replace(BASE, pattern=pattern, conv_size=4 if len(pattern) > 1 else 0), rngs=nnx.Rngs(seed))


def prompt(seed: int, T: int) -> jax.Array:
    return jax.random.randint(jax.random.key(seed), (1, T), 0, BASE.vocab_size, dtype=jnp.int32)


def alone(model: LM, prompt_1T, n: int) -> list[int]:
    """The request's greedy tokens, run alone by `generate` (the oracle)."""
    return np.asarray(generate(model, prompt_1T, n, temperature=0.0).tokens[0, prompt_1T.shape[1] :]).tolist()


def joined(*parts) -> jax.Array:
    return jnp.concatenate(parts, axis=1)


@pytest.mark.parametrize(
    "pattern", [*(pytest.param(p, marks=pytest.mark.slow) for p in "PA"), "W", "D", "G", "M", "PA"]
)
def test_a_request_sharing_a_prefix_continues_from_it_and_equals_its_run_alone(pattern):
    model = model_of(pattern)
    shared = prompt(1, 9)  # two whole blocks and one token
    first, second = joined(shared, prompt(2, 4)), joined(shared, prompt(3, 2))  # 13 and 11 tokens
    engine = Engine(model, slots=1, max_len=MAX_LEN, prefix_cache_bytes=BUDGET, prefix_block=BLOCK)
    a = engine.submit(first, max_new_tokens=6)
    stats = engine.cache_stats()
    assert (stats.hits, stats.misses, stats.tokens_reused, stats.entries) == (0, 1, 0, 3)  # prefixes of 4, 8, 12
    b = engine.submit(second, max_new_tokens=6)  # waits for the slot; joins after a leaves
    finished = engine.run()
    stats = engine.cache_stats()
    assert (stats.hits, stats.misses, stats.tokens_reused) == (1, 1, 8)  # the two shared blocks, not the 9th token
    assert stats.entries == 3 and 0 < stats.bytes_held <= BUDGET and stats.evictions == 0
    assert finished[a] == alone(model, first, 6)
    assert finished[b] == alone(model, second, 6)


def test_the_longest_cached_prefix_is_chosen():
    model = model_of("PA")
    shared = prompt(10, 12)
    engine = Engine(model, slots=1, max_len=MAX_LEN, prefix_cache_bytes=BUDGET, prefix_block=BLOCK)
    prompts = [
        joined(shared[:, :4], prompt(11, 5)),  # caches 4 (shared) and 8 (its own)
        joined(shared, prompt(12, 3)),  # continues from 4, caches 8 and 12 of the shared prefix
        joined(shared, prompt(13, 2)),  # 4, 8 and 12 cached: continues from 12
        shared[:, :8],  # exactly a cached prefix: nothing prefilled, the first token from its logits
    ]
    reused = []
    for p in prompts:
        before = engine.cache_stats().tokens_reused
        engine.submit(p, max_new_tokens=5)
        reused.append(engine.cache_stats().tokens_reused - before)
        engine.run()
    assert reused == [0, 4, 12, 8]
    assert engine.cache_stats().hits == 3
    assert [engine.finished[i] for i in range(4)] == [alone(model, p, 5) for p in prompts]


def test_a_small_budget_is_kept_and_the_least_recently_used_entry_evicted():
    model = model_of("P")  # every entry the same bytes: a P layer's state does not grow
    probe = Engine(model, slots=1, max_len=MAX_LEN, prefix_cache_bytes=BUDGET, prefix_block=BLOCK)
    probe.submit(prompt(20, 4), max_new_tokens=1)
    entry = probe.cache_stats().bytes_held
    budget = 2 * entry + entry // 2  # room for two entries
    engine = Engine(model, slots=1, max_len=MAX_LEN, prefix_cache_bytes=budget, prefix_block=BLOCK)
    a, b, c = prompt(21, 8), prompt(22, 4), prompt(23, 4)
    held = []

    def serve(p):
        engine.submit(p, max_new_tokens=3)
        engine.run()
        stats = engine.cache_stats()
        assert stats.bytes_held <= budget and stats.bytes_held == stats.entries * entry
        held.append(engine.prefix_cache.prefixes())

    serve(a)  # caches a[:4] and a
    serve(b)  # evicts a[:4], the least recently used
    serve(a)  # hits a: now b is the least recently used
    serve(c)  # evicts b
    serve(b)  # misses: evicts a, caches b again
    assert held == [[4, 8], [8, 4], [4, 8], [8, 4], [4, 4]]
    stats = engine.cache_stats()
    assert (stats.hits, stats.misses, stats.tokens_reused, stats.evictions) == (1, 4, 8, 3)
    assert [engine.finished[i] for i in range(5)] == [alone(model, p, 3) for p in (a, b, a, c, b)]


def test_the_lru_order_of_the_trie_itself():
    cache = PrefixCache(30, 2)
    assert cache.put([1, 2], "a", 10) and cache.put([1, 2, 3, 4], "ab", 10) and cache.put([5, 6], "c", 10)
    assert cache.longest([1, 2, 3, 4, 9]) == (4, "ab")  # the longest, and [1, 2] above it: now [5, 6] is oldest
    assert cache.prefixes() == [2, 2, 4]  # [5, 6], [1, 2], [1, 2, 3, 4]: least recently used first
    assert cache.put([7, 8], "d", 10)  # evicts [5, 6], not the shared [1, 2] a hit passed through
    assert cache.longest([5, 6]) == (0, None) and cache.longest([1, 2, 3]) == (2, "a")
    assert cache.put([1, 2, 3, 4], "ab", 10) and cache.put([7, 8], "d", 10)  # refreshes [7, 8] last
    assert cache.put([5, 6], "c", 10)  # evicts [1, 2] now, the oldest; [1, 2, 3, 4] stays reachable
    assert cache.longest([1, 2, 3]) == (0, None) and cache.longest([1, 2, 3, 4]) == (4, "ab")
    assert not cache.put([9, 9], "too big", 31) and cache.stats().entries == 3
    assert cache.put([7, 8], "d2", 10) and cache.longest([7, 8]) == (2, "d2")  # replaced, not a second entry
    stats = cache.stats()
    assert (stats.entries, stats.bytes_held, stats.evictions, stats.hits, stats.misses) == (3, 30, 2, 4, 2)
    cache.claim("another model")
    assert cache.stats().entries == 0 and cache.longest([1, 2, 3, 4]) == (0, None)


def test_a_budget_of_zero_keeps_nothing_and_changes_nothing():
    model = model_of("PA")
    shared = prompt(30, 8)
    prompts = [joined(shared, prompt(31, 3)), joined(shared, prompt(32, 2))]
    outputs = []
    for options in (dict(), dict(prefix_cache_bytes=0, prefix_block=BLOCK)):
        engine = Engine(model, slots=1, max_len=MAX_LEN, **options)
        ids = [engine.submit(p, max_new_tokens=5) for p in prompts]
        outputs.append([engine.run()[i] for i in ids])
        stats = engine.cache_stats()
        assert (stats.hits, stats.misses, stats.tokens_reused, stats.entries, stats.bytes_held) == (0, 0, 0, 0, 0)
    assert outputs[0] == outputs[1] == [alone(model, p, 5) for p in prompts]


def test_new_weights_drop_the_entries_made_with_the_old():
    model = model_of("PA")
    p = prompt(40, 9)
    engine = Engine(model, slots=1, max_len=MAX_LEN, prefix_cache_bytes=BUDGET, prefix_block=BLOCK)
    engine.submit(p, max_new_tokens=4)
    engine.run()
    nnx.update(model, nnx.state(model_of("PA", seed=1), nnx.Param))  # the same model object, other weights
    r = engine.submit(p, max_new_tokens=4)
    engine.run()
    stats = engine.cache_stats()
    assert (stats.hits, stats.misses, stats.entries) == (0, 2, 2)  # the old entries dropped, the new ones kept
    assert engine.finished[r] == alone(model, p, 4)


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(prefix_cache_bytes=-1), "prefix_cache_bytes must be an int >= 0, got -1"),
        (dict(prefix_cache_bytes=1.5), "prefix_cache_bytes must be an int >= 0, got 1.5"),
        (dict(prefix_cache_bytes=True), "prefix_cache_bytes must be an int >= 0, got True"),
        (dict(prefix_cache_bytes="1"), "prefix_cache_bytes must be an int >= 0, got '1'"),
        (dict(prefix_cache_bytes=1, prefix_block=0), "prefix_block must be an int >= 1, got 0"),
        (dict(prefix_cache_bytes=1, prefix_block=2.0), "prefix_block must be an int >= 1, got 2.0"),
    ],
)
def test_bad_arguments_are_refused_before_any_work(monkeypatch, options, message):
    model = model_of("P")
    made = []
    monkeypatch.setattr(LM, "init_caches", lambda *a, **k: made.append(a))
    with pytest.raises(ValueError, match=message):
        Engine(model, slots=1, max_len=MAX_LEN, **options)
    assert not made


def test_a_prefix_that_is_not_whole_blocks_is_refused():
    cache = PrefixCache(100, 4)
    for tokens in ([], [1, 2, 3], [1, 2, 3, 4, 5]):
        message = rf"a cached prefix must be k \* block=4 tokens \(k >= 1\), got {len(tokens)}"
        with pytest.raises(ValueError, match=message):
            cache.put(tokens, "x", 1)


def test_four_slots_serve_32_requests_at_once_with_prefix_reuse():
    model = model_of("PA")
    system, other = prompt(50, 8), prompt(51, 12)
    tails = [prompt(60 + i, 3) for i in range(32)]  # few shapes: few programs to compile for the oracle
    prompts = [joined(system if i % 4 else other, tails[i]) for i in range(32)]  # two shared prefixes
    prompts[5] = joined(prompts[1], prompt(99, 2))  # a whole earlier prompt as a prefix (8 + 3 tokens: 8 reused)
    news = [4] * 32
    engine = Engine(model, slots=4, max_len=MAX_LEN, prefix_cache_bytes=BUDGET, prefix_block=BLOCK)
    ids = [engine.submit(p, max_new_tokens=n) for p, n in zip(prompts, news)]
    finished = engine.run()
    stats = engine.cache_stats()
    assert stats.hits == 30 and stats.misses == 2  # the first of each shared prefix misses
    assert stats.tokens_reused == 23 * 8 + 7 * 12  # the system prompt's 8 tokens, the other's 12
    assert [finished[i] for i in ids] == [alone(model, p, n) for p, n in zip(prompts, news)]


def kv_bytes(model: LM) -> tuple[int, int]:
    """The bytes of a one-row snapshot per token its caches hold room for, and those of the rest (logits too)."""
    held = lambda slots: sum(x.nbytes for x in jax.tree.leaves(model.init_caches(1, slots)))
    per_token = held(2) - held(1)
    return per_token, held(1) - per_token + BASE.vocab_size * 4


@pytest.mark.parametrize(
    "pattern, options", [("A", {}), ("PA", {}), ("A", dict(kv_cache_bits=4)), ("A", dict(scan_layers=True))]
)
def test_a_growing_cache_is_held_once_so_the_bytes_grow_linearly_with_the_prompt(pattern, options):
    model = LM(dataclasses.replace(model_of(pattern).config, **options), rngs=nnx.Rngs(0))
    per_token, rest = kv_bytes(model)
    long = prompt(70, 8 * BLOCK)
    held = []
    for blocks in (4, 8):
        engine = Engine(model, slots=1, max_len=64, prefix_cache_bytes=BUDGET, prefix_block=BLOCK)
        engine.submit(long[:, : blocks * BLOCK], max_new_tokens=1)
        engine.run()
        held.append(engine.cache_stats().bytes_held)
        assert engine.cache_stats().entries == blocks
    # each entry: its block's keys and values and the fixed-size rest; a whole snapshot per block held 3.6x as much
    assert held == [4 * (BLOCK * per_token + rest), 8 * (BLOCK * per_token + rest)]
    follow = joined(long, prompt(71, 3))  # continues from the 8 blocks, joined from their entries
    r = engine.submit(follow, max_new_tokens=5)
    assert engine.run()[r] == alone(model, follow, 5) and engine.cache_stats().tokens_reused == 8 * BLOCK


def test_eviction_under_a_small_budget_keeps_every_held_prefix_whole():
    model = model_of("A")
    per_token, rest = kv_bytes(model)
    entry = BLOCK * per_token + rest
    engine = Engine(model, slots=1, max_len=MAX_LEN, prefix_cache_bytes=4 * entry + entry // 2, prefix_block=BLOCK)
    a, b = prompt(80, 13), prompt(81, 9)  # three blocks and two, and a token each
    held = []
    for p in (a, b, a, b):
        r = engine.submit(p, max_new_tokens=4)
        assert engine.run()[r] == alone(model, p, 4)
        held.append(engine.prefix_cache.prefixes())
        chains = []  # per prompt, the entries held on its prefixes of 1, 2, ... blocks
        for q in (a, b):
            ids = np.asarray(q[0]).tolist()
            chains.append([len(engine.prefix_cache.chain(ids[:n])) for n in range(BLOCK, len(ids), BLOCK)])
        # every entry's blocks are all held (leaves are evicted first): 1, 2, ... m entries, then none deeper
        assert all(c == [min(i + 1, c[-1]) for i in range(len(c))] for c in chains)
        assert sum(c[-1] for c in chains) == len(held[-1])
    # a: 4, 8, 12; b's 8 evicts a's 12, the least recently used leaf (a's 4 and 8 are needed by it)
    # a again: continues from its 8 and its 12 evicts b's 8; b again: continues from its 4, its 8 evicts a's 12
    assert held == [[4, 8, 12], [4, 8, 4, 8], [4, 4, 8, 12], [4, 8, 4, 8]]
    stats = engine.cache_stats()
    assert (stats.hits, stats.misses, stats.tokens_reused, stats.evictions) == (2, 2, 12, 3)
    assert stats.bytes_held == 4 * entry


def test_chained_entries_need_their_parents():
    cache = PrefixCache(40, 2)
    assert not cache.put([1, 2, 3, 4], "b", 10, chained=True)  # its parent [1, 2] is not cached
    assert cache.stats().entries == 0 and cache.chain([1, 2, 3, 4]) == []
    assert cache.put([1, 2], "a", 10, chained=True) and cache.put([1, 2, 3, 4], "ab", 10, chained=True)
    assert cache.put([5, 6], "c", 10, chained=True) and cache.put([5, 6, 7, 8], "cd", 10, chained=True)
    assert cache.longest([1, 2, 3, 4, 9]) == (4, "ab") and cache.chain([1, 2, 3, 4]) == ["a", "ab"]
    assert cache.put([1, 2, 3, 4, 5, 6], "abc", 10, chained=True)  # evicts [5, 6, 7, 8]: [5, 6] is needed by it
    assert cache.prefixes() == [2, 2, 4, 6] and cache.chain([5, 6, 7, 8]) == ["c"]
    assert not cache.put([1, 2, 3, 4, 5, 6, 7, 8], "abcd", 11, chained=True)  # 41 bytes with its prefixes
    assert cache.prefixes() == [2, 2, 4, 6]  # nothing evicted for it
    assert cache.put([1, 2], "a2", 10, chained=True)  # replacing an entry drops the chained entries below it
    assert cache.prefixes() == [2, 2] and cache.chain([1, 2, 3, 4, 5, 6]) == ["a2"]
    stats = cache.stats()
    assert (stats.entries, stats.bytes_held, stats.evictions) == (2, 20, 1)

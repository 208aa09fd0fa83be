"""The lm-eval adapter against an independent oracle (a full forward, log_softmax in float64): loglikelihood is
the continuation's summed log-probs and is_greedy whether each of its tokens is the argmax, context cut to
max_length from the left; loglikelihood_rolling is the full sequence's log-likelihood after EOD when the text fits
one window, else the sum over lm-eval's windows; generate_until is greedy argmax decoding cut before the first stop
string. Requests of many lengths run in few programs (one per power-of-two length bucket). Bad arguments raise
naming themselves."""

from types import SimpleNamespace

import numpy as np
import pytest
from lm_eval.api.instance import Instance

import retention.eval.lm_eval_adapter as adapter_module
from retention.data.tokenizer import ByteTokenizer
from retention.eval.lm_eval_adapter import RetentionLM, bucket
from tests.eval.common import BATCH, MAX_LENGTH

pytestmark = pytest.mark.integration  # run through lm-eval: make test-integration

SEED = int(np.random.SeedSequence().generate_state(1)[0])
EOD = ByteTokenizer.eod
ENC = lambda s: ByteTokenizer().encode(s).tolist()
RTOL = 1e-6  # the adapter's float32 log-probs at its padded shapes against the float64 oracle: at most 8e-8 seen


def words(rng, n_chars: int) -> str:
    """A random ASCII text of n_chars letters and spaces, starting and ending with a letter (n_chars > 0)."""
    chars = rng.choice(list("abcdefgh ijklmnop qrstuvw xyz"), n_chars)
    chars[0], chars[-1] = "a", "z"
    return "".join(chars)


def requests(kind: str, args: list[tuple]) -> list[Instance]:
    return [Instance(kind, {}, a, i) for i, a in enumerate(args)]


@pytest.fixture
def recorded(monkeypatch):
    """The shapes the adapter runs: [B, T] of every scoring call, (prompt [B, T0], max_new_tokens) of every
    generate call; a jitted function compiles once per distinct shape (the model and dtypes fixed)."""
    seen = {"scores": [], "generate": []}
    scores, generate = adapter_module._token_scores, adapter_module.generate

    def record_scores(graphdef, state, inputs, targets):
        seen["scores"].append(inputs.shape)
        return scores(graphdef, state, inputs, targets)

    def record_generate(model, prompt, n, **options):
        seen["generate"].append((prompt.shape, n))
        return generate(model, prompt, n, **options)

    monkeypatch.setattr(adapter_module, "_token_scores", record_scores)
    monkeypatch.setattr(adapter_module, "generate", record_generate)
    return seen


def test_bucket_by_hand():
    assert [bucket(n, 48) for n in (1, 16, 17, 32, 33, 48)] == [16, 16, 32, 32, 48, 48]
    assert bucket(5, 8) == 8


def test_loglikelihood_equals_the_summed_log_probs(adapter, oracle, recorded):
    rng = np.random.default_rng(SEED)
    sizes = [(5, 3), (12, 1), (20, 9), (3, 25), (40, 10), (2, 30), (17, 14), (9, 6), (1, 2)]
    pairs = [(words(rng, n), " " + words(rng, m)) for n, m in sizes] + [("", words(rng, 7))]
    got = adapter.loglikelihood(requests("loglikelihood", pairs))
    for (context, continuation), (logp, greedy) in zip(pairs, got):
        ids = ([EOD] if not context else ENC(context)) + ENC(continuation)
        want = oracle.score(ids[-(MAX_LENGTH + 1) : -1], ENC(continuation))  # the context cut from the left
        assert logp == pytest.approx(want[0], rel=RTOL) and greedy == want[1], (SEED, context, continuation)
    # many lengths, two programs: [BATCH, 16] and [BATCH, 32], each batch padded to BATCH rows
    assert set(recorded["scores"]) == {(BATCH, 16), (BATCH, 32)} and len(recorded["scores"]) == 3


def test_is_greedy_on_the_argmax_continuation(adapter, oracle):
    rng = np.random.default_rng(SEED)
    contexts = [rng.integers(0, 256, n).tolist() for n in (3, 9, 20)]
    greedy = [oracle.greedy(c, k) for c, k in zip(contexts, (1, 4, 6))]
    off = [g[:-1] + [(g[-1] + 1) % 256] for g in greedy]  # the last token another one
    got = adapter._loglikelihood_tokens([(None, c, g) for c, g in zip(contexts * 2, greedy + off)])
    assert [g for _, g in got] == [True] * 3 + [False] * 3, SEED
    for (c, g), (logp, _) in zip(zip(contexts * 2, greedy + off), got):
        assert logp == pytest.approx(oracle.score(c + g[:-1], g)[0], rel=RTOL), SEED


def rolling_oracle(oracle, ids: list[int], L: int) -> float:
    """lm-eval's rolling log-likelihood by its definition (lm_eval.api.model.LM.loglikelihood_rolling): each token
    predicted once; the first window predicts up to L tokens after EOD, each next one the next up to L tokens from
    the L tokens before its last (for 10 tokens and L = 4: [EOD 0 1 2] -> 0..3, [3 4 5 6] -> 4..7, [5 6 7 8] -> 8 9)."""
    first = min(L, len(ids))
    total = oracle.score([EOD] + ids[: first - 1], ids[:first])[0]
    done = first
    while done < len(ids):
        end = min(done + L, len(ids))
        total += oracle.score(ids[end - L - 1 : end - 1], ids[done:end])[0]
        done = end
    return total


def test_loglikelihood_rolling(adapter, oracle):
    rng = np.random.default_rng(SEED)
    texts = [words(rng, n) for n in (1, 20, MAX_LENGTH, MAX_LENGTH + 1, 90)]
    got = adapter.loglikelihood_rolling(requests("loglikelihood_rolling", [(t,) for t in texts]))
    for text, value in zip(texts[:3], got):  # one window: the full sequence after EOD
        ids = ENC(text)
        assert value == pytest.approx(oracle.score([EOD] + ids[:-1], ids)[0], rel=RTOL), (SEED, text)
    for text, value in zip(texts[3:], got[3:]):
        assert value == pytest.approx(rolling_oracle(oracle, ENC(text), MAX_LENGTH), rel=RTOL), (SEED, text)


def test_generate_until_is_greedy_and_stops_at_the_stop_string(adapter, oracle, recorded):
    rng = np.random.default_rng(SEED)
    contexts = [words(rng, n) for n in (30, 11, 5, 2)]  # the first cut to its last max_length - 10 = 22 tokens
    expected, full, args = [], [], []
    for i, context in enumerate(contexts):
        new = oracle.greedy(ENC(context)[-(MAX_LENGTH - 10) :], 10)
        new = new[: new.index(EOD)] if EOD in new else new  # EOD ends a generation
        text = ByteTokenizer().decode(new)
        stop = text[len(text) // 2] if i % 2 == 0 and text else "\x00never"
        expected.append(text[: text.index(stop)] if stop in text else text)
        full.append(text)
        until = [stop, ""] if i % 2 == 0 else None if i == 1 else stop  # a list, a string or none
        args.append((context, {"until": until, "max_gen_toks": 10}))
    got = adapter.generate_until(requests("generate_until", args))
    assert got == expected, SEED
    assert any(len(e) < len(f) for e, f in zip(expected, full)), SEED  # a stop string cut a text short
    assert recorded["generate"] == [((BATCH, 32), 10)]  # one batch, its prompts left-padded to 32


def test_generate_until_batches_by_max_gen_toks_and_prompt_bucket(adapter, monkeypatch):
    """The batching alone (generate stands in, every row ending at once): a batch per max_gen_toks and at most
    batch_size prompts, each padded to the bucket of its longest; each text back to its request."""
    calls = []

    def eod_at_once(model, prompt, n, *, prompt_lengths, **options):
        calls.append((prompt.shape, n, np.asarray(prompt_lengths).tolist()))
        first = np.asarray(prompt)[:, -1:]  # the row's last prompt token as its text, then EOD
        tokens = np.concatenate([np.asarray(prompt), first, np.full((len(first), n - 1), EOD)], axis=1)
        return SimpleNamespace(tokens=tokens, lengths=np.full(len(first), prompt.shape[1] + 2))

    monkeypatch.setattr(adapter_module, "generate", eod_at_once)
    sizes = [(3, 8), (20, 8), (9, 4), (2, 8), (5, 8), (17, 8), (1, 4)]  # (context chars, max_gen_toks)
    args = [("x" * (n - 1) + chr(97 + i), {"max_gen_toks": g}) for i, (n, g) in enumerate(sizes)]
    assert adapter.generate_until(requests("generate_until", args)) == [chr(97 + i) for i in range(len(sizes))]
    assert [(shape, n) for shape, n, _ in calls] == [((BATCH, 32), 8), ((BATCH, 16), 8), ((BATCH, 16), 4)]
    assert [lengths for _, _, lengths in calls] == [[20, 17, 5, 3], [2, 2, 2, 2], [9, 1, 9, 9]]  # empty rows: the first


def test_bad_arguments_raise_naming_them(tiny_model, tmp_path):
    byte = ByteTokenizer()
    with pytest.raises(ValueError, match=r"model_args must be among .*unknown \['colour'\]"):
        RetentionLM(model=tiny_model, tokenizer=byte, max_length=8, colour="red")
    with pytest.raises(FileNotFoundError, match="no_run_here"):
        RetentionLM(path=str(tmp_path / "no_run_here"))
    with pytest.raises(ValueError, match="max_length must be given"):
        RetentionLM(model=tiny_model, tokenizer=byte)
    with pytest.raises(ValueError, match="max_length must be an int >= 2, got 1"):
        RetentionLM(model=tiny_model, tokenizer=byte, max_length=1)
    with pytest.raises(ValueError, match="batch_size must be an int >= 1, got 'many'"):
        RetentionLM(model=tiny_model, tokenizer=byte, max_length=8, batch_size="many")
    with pytest.raises(ValueError, match="model must be an LM"):
        RetentionLM(model="gpt2", tokenizer=byte, max_length=8)
    with pytest.raises(ValueError, match="not both"):
        RetentionLM(path=str(tmp_path), model=tiny_model, tokenizer=byte)
    with pytest.raises(ValueError, match="step is for path"):
        RetentionLM(model=tiny_model, tokenizer=byte, max_length=8, step=3)
    wide = SimpleNamespace(vocab_size=300, eod=299)  # a tokenizer of more ids than the model has
    with pytest.raises(ValueError, match="vocab_size 300 is more than the model's 257"):
        RetentionLM(model=tiny_model, tokenizer=wide, max_length=8)


def test_bad_requests_raise_naming_them(adapter):
    with pytest.raises(ValueError, match="do_sample must be false"):
        adapter.generate_until(requests("generate_until", [("a", {"do_sample": True, "temperature": 0.7})]))
    with pytest.raises(ValueError, match="top_p"):
        adapter.generate_until(requests("generate_until", [("a", {"until": ["\n"], "top_p": 0.9})]))
    with pytest.raises(ValueError, match=f"max_gen_toks must be < max_length={MAX_LENGTH}, got {MAX_LENGTH}"):
        adapter.generate_until(requests("generate_until", [("a", {"max_gen_toks": MAX_LENGTH})]))
    with pytest.raises(ValueError, match=f"1 to max_length={MAX_LENGTH} continuation ids, got 1 and 40"):
        adapter.loglikelihood(requests("loglikelihood", [("a", "b" * 40)]))

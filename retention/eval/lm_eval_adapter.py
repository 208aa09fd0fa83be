"""lm-eval's `LM` interface (lm_eval.api.model, through its TemplateLM) over an `LM` and one of the project's
tokenizers (retention/data/tokenizer.py), registered with lm-eval as the model `retention`:

    python -m retention.eval --model retention --model_args path=RUN_DIR --tasks hellaswag --batch_size 16

    lm = RetentionLM(path=RUN_DIR)  # or RetentionLM(model=model, tokenizer=tokenizer, max_length=2048)
    results = lm_eval.simple_evaluate(model=lm, tasks=["hellaswag"])

- loglikelihood: log p(continuation | context) summed over the continuation's tokens (float32 log-probs summed in
  float64), and whether every continuation token is the argmax. TemplateLM splits each request into context and
  continuation ids the way it does for Hugging Face models (the context's trailing spaces move to the continuation;
  an empty context becomes the EOD token, the project's document boundary). A sequence longer than max_length
  keeps its last max_length tokens of context, as lm-eval's HFLM does.
- loglikelihood_rolling: a whole text's log-likelihood after the EOD token, in lm-eval's windows
  (utils.get_rolling_token_windows with context_len 1, made disjoint): each token predicted once, the first window
  from EOD, each later one with as much of the text before it as fits in max_length. (The trainer masks the
  target after an EOD, so a run's prediction of a document's first token is untrained; it counts, as a BOS-
  conditioned first token does for any model in lm-eval.)
- generate_until: greedy `retention.generate` (prefill and the token loop in one compiled function) for up to
  max_gen_toks tokens or the EOD token, the text cut before the first of the `until` strings; the context keeps its
  last max_length - max_gen_toks tokens.

Few programs compile: requests are sorted by length and run batch_size rows at a time (the last batch padded to
batch_size rows), each batch padded on the right (scoring) or the left (generation, a separate document) to a power of
two of at least MIN_BUCKET tokens, at most max_length: one scoring program per length bucket, one generation
program per prompt bucket and max_gen_toks.
"""

import os
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm import tqdm

try:
    import lm_eval.models  # noqa: F401  lm-eval's own models first: get_model adds them only to an empty registry
    from lm_eval import utils
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model
except ModuleNotFoundError as missing:  # lm-eval comes with the `eval` extra: name it
    raise ModuleNotFoundError(
        f"retention.eval needs {missing.name!r} (lm-eval): pip install 'retention-jax[eval]'", name=missing.name
    ) from missing

from retention.data.tokenizer import ByteTokenizer, HFTokenizer
from retention.generation import generate
from retention.load import load_run
from retention.nn import LM
from retention.train.config import Config
from retention.validation import check_int

MIN_BUCKET = 16  # the shortest padded length: short requests share one program
DEFAULT_BATCH_SIZE = 16  # batch_size="auto" (lm-eval's search for the largest that fits): max_batch_size, or this
DEFAULT_MAX_GEN_TOKS = 256  # generate_until's length when a task sets none (at most half of max_length)
MODEL_ARGS = ("path", "step", "max_length", "batch_size", "max_batch_size", "max_gen_toks", "device")


def bucket(n: int, max_length: int) -> int:
    """The padded length of n tokens: the power of two >= max(n, MIN_BUCKET), at most max_length."""
    return min(max(MIN_BUCKET, 1 << (n - 1).bit_length()), max_length)


def text_tokenizer(folder: str, cfg: Config, tokenizer: HFTokenizer | None):
    """The tokenizer a text run trained with: `load_run`'s (the run's tokenizer.json, checked), or bytes when the
    run used the byte tokenizer. ValueError for a run of another task."""
    if cfg.data.task != "text":
        raise ValueError(
            f"path must be a text run (data.task=text), got {folder!r}, a run of data.task={cfg.data.task}"
        )
    return ByteTokenizer() if tokenizer is None else tokenizer


def _batch_size(batch_size, max_batch_size) -> int:
    """lm-eval's batch_size (an int, its text, or "auto" / "auto:N") as rows per program."""
    if isinstance(batch_size, str) and batch_size.startswith("auto"):
        batch_size = DEFAULT_BATCH_SIZE if max_batch_size is None else max_batch_size
    elif isinstance(batch_size, str) and batch_size.isdigit():
        batch_size = int(batch_size)
    check_int("batch_size", batch_size)
    return batch_size


@partial(jax.jit, static_argnames=("graphdef",))
def _token_scores(graphdef, state, inputs_BT, targets_BT):
    """(log p(targets[b, t] | inputs[b, :t + 1]) [B, T] float32, whether that target is the argmax [B, T]) from one
    full forward of the model."""
    logits_BTV = nnx.merge(graphdef, state)(inputs_BT)
    logp_BTV = jax.nn.log_softmax(logits_BTV, axis=-1)
    target_logp_BT = jnp.take_along_axis(logp_BTV, targets_BT[..., None], axis=-1)[..., 0]
    return target_logp_BT, jnp.argmax(logits_BTV, axis=-1) == targets_BT


@register_model("retention")
class RetentionLM(TemplateLM):
    """lm-eval's model over an LM and its tokenizer: from a run or export folder (`path`, read by load_run at
    `step`, max_length the run's data.seq_len unless given), or from `model` and `tokenizer` objects (max_length
    then required). batch_size: rows per compiled program; max_gen_toks: generate_until's length when a
    task sets none (default DEFAULT_MAX_GEN_TOKS, at most max_length // 2).
    `device` is accepted because lm-eval's command line always passes one: the model runs where JAX puts it
    (JAX_PLATFORMS chooses). An unknown argument raises ValueError naming it."""

    def __init__(
        self,
        path: str | None = None,
        *,
        model: LM | None = None,
        tokenizer=None,
        step: int | None = None,
        max_length: int | None = None,
        batch_size: int | str = DEFAULT_BATCH_SIZE,
        max_batch_size: int | None = None,
        max_gen_toks: int | None = None,
        device: str | None = None,
        **unknown,
    ):
        super().__init__()
        if unknown:
            raise ValueError(f"model_args must be among {MODEL_ARGS}, got unknown {sorted(unknown)}")
        if path is not None:
            if model is not None or tokenizer is not None:
                raise ValueError("give path (a run or export folder) or model and tokenizer, not both")
            if not isinstance(path, str | os.PathLike) or not os.path.isdir(path):
                raise FileNotFoundError(f"path must be a run or export folder, got {path!r} (no such folder)")
            path = os.fspath(path)
            model, cfg, tokenizer = load_run(path, step)
            tokenizer = text_tokenizer(path, cfg, tokenizer)
            max_length = cfg.data.seq_len if max_length is None else max_length
        elif not isinstance(model, LM) or tokenizer is None:
            raise ValueError(f"model must be an LM with a tokenizer (or give path), got model={type(model).__name__}")
        elif step is not None:
            raise ValueError(f"step is for path (a run folder's checkpoint), got step={step!r} with a model object")
        if max_length is None:
            raise ValueError("max_length must be given with a model object (the longest sequence to score)")
        check_int("max_length", max_length, low=2)
        max_gen_toks = min(DEFAULT_MAX_GEN_TOKS, max_length // 2) if max_gen_toks is None else max_gen_toks
        check_int("max_gen_toks", max_gen_toks)
        if max_gen_toks >= max_length:
            raise ValueError(f"max_gen_toks must be < max_length={max_length}, got {max_gen_toks}")
        if tokenizer.vocab_size > model.config.vocab_size:
            raise ValueError(
                f"tokenizer must fit the model: its vocab_size {tokenizer.vocab_size} is more than the model's "
                f"{model.config.vocab_size}"
            )
        self.model, self.tokenizer, self._max_length = model, tokenizer, max_length
        self.batch_size, self.max_gen_toks = _batch_size(batch_size, max_batch_size), max_gen_toks
        self._graphdef, self._state = nnx.split(model)

    @property
    def eot_token_id(self) -> int:
        return int(self.tokenizer.eod)

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer.identity

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        """The tokenizer's ids of `string` (it adds no special tokens)."""
        return [int(i) for i in self.tokenizer.encode(string)]

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """(sum of log p(continuation ids), whether each is the argmax) per (key, context ids, continuation ids)."""
        rows = []
        for _, context, continuation in requests:
            if not 1 <= len(continuation) <= self.max_length or not context:
                raise ValueError(
                    f"a request must hold context ids and 1 to max_length={self.max_length} continuation ids, got "
                    f"{len(context)} and {len(continuation)}"
                )
            whole = (context + continuation)[-(self.max_length + 1) :]
            rows.append((whole[:-1], whole[1:], len(continuation)))
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]))
        out = [None] * len(rows)
        B = self.batch_size
        for start in tqdm(range(0, len(order), B), desc="loglikelihood batches", disable=disable_tqdm):
            chunk = order[start : start + B]
            T = bucket(len(rows[chunk[0]][0]), self.max_length)
            inputs, targets = np.zeros((B, T), np.int32), np.zeros((B, T), np.int32)
            scored = np.zeros((B, T), bool)
            for r, i in enumerate(chunk):
                ids, next_ids, n = rows[i]
                inputs[r, : len(ids)], targets[r, : len(ids)] = ids, next_ids
                scored[r, len(ids) - n : len(ids)] = True
            logp, greedy = jax.device_get(_token_scores(self._graphdef, self._state, inputs, targets))
            for r, i in enumerate(chunk):
                out[i] = (float(logp[r][scored[r]].astype(np.float64).sum()), bool(greedy[r][scored[r]].all()))
        for (key, _, _), result in zip(requests, out):
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, result)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Each text's log-likelihood after EOD, summed over lm-eval's disjoint rolling windows of max_length."""
        windows, owners = [], []
        for index, (text,) in enumerate(req.args for req in requests):
            pairs = utils.get_rolling_token_windows(
                token_list=self.tok_encode(text),
                prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length,
                context_len=1,
            )
            for context, continuation in map(utils.make_disjoint_window, pairs):
                windows.append((None, context, continuation))
                owners.append(index)
        totals = [0.0] * len(requests)
        for index, (logp, _) in zip(owners, self._loglikelihood_tokens(windows, disable_tqdm)):
            totals[index] += logp
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    def _generation_options(self, gen_kwargs: dict) -> tuple[list[str], int]:
        """(the stop strings, max_gen_toks) of a request's gen_kwargs; greedy only (do_sample false, temperature
        0), ValueError naming any other key."""
        options = dict(gen_kwargs)
        until = options.pop("until", None)
        until = [] if until is None else [until] if isinstance(until, str) else until
        if not isinstance(until, list | tuple) or not all(isinstance(s, str) for s in until):
            raise ValueError(f"gen_kwargs until must be a string or a list of strings, got {until!r}")
        max_gen = options.pop("max_gen_toks", self.max_gen_toks)
        check_int("gen_kwargs max_gen_toks", max_gen)
        if max_gen >= self.max_length:
            raise ValueError(f"gen_kwargs max_gen_toks must be < max_length={self.max_length}, got {max_gen}")
        if options.pop("do_sample", False) or options.pop("temperature", 0.0) != 0:
            raise ValueError(
                f"generate_until is greedy: gen_kwargs do_sample must be false and temperature 0, got {gen_kwargs}"
            )
        if options:
            raise ValueError(f"gen_kwargs must be among (until, max_gen_toks, do_sample, temperature), got {options}")
        return list(until), max_gen

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Each context's greedy continuation, up to EOD or max_gen_toks tokens, cut before its first stop string."""
        jobs = []
        for context, gen_kwargs in (req.args for req in requests):
            until, max_gen = self._generation_options(gen_kwargs)
            ids = self.tok_encode(context) or [self.prefix_token_id]
            jobs.append((ids[-(self.max_length - max_gen) :], until, max_gen))
        groups = {}  # by max_gen_toks, each longest prompt first
        for i in sorted(range(len(jobs)), key=lambda i: -len(jobs[i][0])):
            groups.setdefault(jobs[i][2], []).append(i)
        B = self.batch_size
        batches = [group[s : s + B] for group in groups.values() for s in range(0, len(group), B)]
        out = [None] * len(jobs)
        for chunk in tqdm(batches, desc="generate_until batches", disable=disable_tqdm):
            for i, text in zip(chunk, self._generate(chunk, jobs)):
                out[i] = text
        for req, text in zip(requests, out):
            self.cache_hook.add_partial("generate_until", req.args, text)
        return out

    def _generate(self, chunk: list[int], jobs: list) -> list[str]:
        """The texts of the jobs `chunk` (one max_gen_toks), run as one left-padded batch of batch_size rows."""
        max_gen = jobs[chunk[0]][2]
        T0 = bucket(max(len(jobs[i][0]) for i in chunk), self.max_length)
        prompt = np.zeros((self.batch_size, T0), np.int32)
        lengths = np.zeros(self.batch_size, np.int32)
        for r, i in enumerate(chunk + [chunk[0]] * (self.batch_size - len(chunk))):  # empty rows: the first again,
            ids = jobs[i][0]  # so they stop with it
            prompt[r, T0 - len(ids) :], lengths[r] = ids, len(ids)
        out = generate(
            self.model,
            jnp.asarray(prompt),
            max_gen,
            prompt_lengths=jnp.asarray(lengths),
            temperature=0.0,
            eos_id=self.eot_token_id,
        )
        tokens, ends = jax.device_get((out.tokens, out.lengths))
        texts = []
        for r, i in enumerate(chunk):
            new = tokens[r, T0 : ends[r]]
            new = new[:-1] if len(new) and new[-1] == self.eot_token_id else new
            text = self.tokenizer.decode(new)
            for stop in jobs[i][1]:
                if stop:
                    text = text.split(stop)[0]
            texts.append(text)
        return texts

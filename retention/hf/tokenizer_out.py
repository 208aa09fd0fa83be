"""An export's tokenizer and generation files, written by transformers: tokenizer_config.json and
special_tokens_map.json (the run's tokenizer as transformers' PreTrainedTokenizerFast) and generation_config.json
(its GenerationConfig), so that `AutoTokenizer.from_pretrained(OUT)` encodes a text to the run's ids and
`model.generate` ends and pads with the run's end-of-document token (EOD).

EOD is both the end token and the pad token: a pad token must be an id of the vocabulary (one past the embedding
fails in generate) and, padded on the left under an attention mask, any id does; EOD is the one token every
tokenizer of a text run has. A special token written in a text is text (split_special_tokens), as the run encodes
its documents; padding is on the left, as batched generation needs.

The bytes tokenizer has no tokenizer.json: `byte_tokenizer` builds one (byte fallback over the 256 byte tokens:
ids 0..255 the UTF-8 bytes, EOD 256, as ByteTokenizer). A run's tokenizer.json is kept as it is (load_run checks
its fingerprint), so one whose post-processor adds tokens around a text (a foreign file's BOS) makes AutoTokenizer
add them where the run did not: the export warns, naming them. transformers is imported here alone, on first use.
"""

import json
import logging
import os

from retention.data.tokenizer import EOD_TOKEN, ByteTokenizer

log = logging.getLogger(__name__)
TOKENIZER_CONFIG, SPECIAL_TOKENS = "tokenizer_config.json", "special_tokens_map.json"
GENERATION_CONFIG = "generation_config.json"


def _transformers():
    """The transformers module; ModuleNotFoundError naming the `train` extra when it is missing."""
    try:
        import transformers
    except ModuleNotFoundError as missing:
        raise ModuleNotFoundError(
            f"the export needs {missing.name!r} to write {TOKENIZER_CONFIG} and {GENERATION_CONFIG}: pip install "
            "'retention-jax[train]'",
            name=missing.name,
        ) from missing
    return transformers


def byte_tokenizer():
    """The bytes tokenizer (ByteTokenizer) as a `tokenizers.Tokenizer`: a BPE with no merges whose vocab is the 256
    byte tokens <0x00> .. <0xFF> (id the byte's value), so that, nothing split and no character a token of its own,
    byte fallback writes each UTF-8 byte of a text as its token; EOD_TOKEN the special token of id 256.

    Returns:
        a `tokenizers.Tokenizer` whose ids of any text are ByteTokenizer's.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models

    vocab = {f"<0x{b:02X}>": b for b in range(256)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True))
    tokenizer.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    tokenizer.add_special_tokens([AddedToken(EOD_TOKEN, special=True, normalized=False)])
    assert tokenizer.token_to_id(EOD_TOKEN) == ByteTokenizer.eod
    return tokenizer


def write_tokenizer_files(folder: str, tokenizer, eod: int) -> None:
    """Write `tokenizer` to `folder` as transformers saves it (tokenizer.json, tokenizer_config.json), with
    special_tokens_map.json (which transformers 5 reads but no longer writes) and generation_config.json; EOD the
    end and pad token, see the module docstring. Warns when the tokenizer's post-processor adds tokens around a text.

    Args:
        folder: an existing folder; the files in it of those names are replaced.
        tokenizer: the run's `tokenizers.Tokenizer` (an HFTokenizer's `.tokenizer`, or `byte_tokenizer()`).
        eod: the id of the run's end-of-document token in `tokenizer`.
    """
    token = tokenizer.id_to_token(eod) if isinstance(eod, int) and not isinstance(eod, bool) and eod >= 0 else None
    if token is None:
        raise ValueError(f"eod must be an id of the tokenizer (0 .. {tokenizer.get_vocab_size() - 1}), got {eod!r}")
    if added := tokenizer.encode("", add_special_tokens=True).tokens:
        log.warning(
            "the run's tokenizer.json has a post-processor that adds %s around a text, which the run's documents never "
            "had: AutoTokenizer.from_pretrained of the export adds them unless called with add_special_tokens=False",
            added,
        )
    transformers = _transformers()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token=token, pad_token=token, split_special_tokens=True, padding_side="left"
    )
    fast.save_pretrained(folder)
    with open(os.path.join(folder, SPECIAL_TOKENS), "w") as f:
        json.dump(fast.special_tokens_map, f, indent=2)
    transformers.GenerationConfig(eos_token_id=eod, pad_token_id=eod).save_pretrained(folder)

"""Export a run whole: `python -m retention.export RUN_DIR OUT [--step N]` writes OUT/model.safetensors, an HF-style
OUT/config.json (architecture, every size of the built model, the layer pattern, the mixer settings), the run's
OUT/tokenizer.json when it has one, and beside them OUT/run_record.json (the run's record: config, LMConfig,
parameter shapes; and the step). `retention.load_run(OUT)` reads it back, checked (retention/load.py).

A text run's export holds transformers' files of its tokenizer too (retention/hf/tokenizer_out.py):
tokenizer_config.json, special_tokens_map.json and generation_config.json, the end-of-document token (EOD) the end
and the pad token, and for the bytes tokenizer a tokenizer.json of its own; `AutoTokenizer.from_pretrained(OUT)`
then encodes a text to the run's ids. Every file is written readable by others (0644), the folder 0755.

A model whose layers are all A (Llama; Qwen2 with q/k/v biases; Qwen3 with QK-norm) or all W (Mistral) with no
short convolution is written in the Llama layout, which `transformers.AutoModelForCausalLM.from_pretrained(OUT)`
runs with no custom code; any other in the retention layout (architecture RetentionLM, one tensor per parameter
named by its key path), which load_run reads, and beside it OUT/configuration_retention.py and
OUT/modeling_retention.py (retention/hf/remote/: every layer letter in plain PyTorch, a reference implementation),
named by config.json's auto_map, so `AutoModelForCausalLM.from_pretrained(OUT, trust_remote_code=True)` runs it
and generates with its cache (retention/hf/config_out.py).

Integrity, as a checkpoint has it: the weights file's metadata holds the step, the record's sha256 and a checksum
pair per tensor (retention/checksum.py); run_record.json holds the record, its sha256 and the step, and
config.json the sha256 and step too, so a config.json or record of another run, a tensor with a flipped bit,
either file cut short or a tokenizer.json that is not the run's is refused on load. The folder is written aside (a
new folder beside OUT) and renamed into place: a reader finds the old export, the new one or none, never a mix of
two. OUT may not be a run folder (the run's checkpoints stay what load_run reads there), a symbolic link, or a
folder holding other files; nothing in it is followed or written through.
"""

import argparse
import json
import os
import shutil
import tempfile

from safetensors.numpy import save_file

from retention.checksum import tree_checksums
from retention.data.tokenizer import ByteTokenizer
from retention.hf.config_out import REMOTE_FILES, hf_config, hf_tensors
from retention.hf.tokenizer_out import (
    GENERATION_CONFIG,
    SPECIAL_TOKENS,
    TOKENIZER_CONFIG,
    byte_tokenizer,
    write_tokenizer_files,
)
from retention.load import (
    EXPORT_CONFIG,
    EXPORT_RECORD,
    EXPORT_WEIGHTS,
    TOKENIZER,
    is_run_folder,
    max_positions,
    read_run,
    run_tokenizer,
)
from retention.train.record import record_digest

EXPORT_FILES = (
    EXPORT_WEIGHTS,
    EXPORT_CONFIG,
    EXPORT_RECORD,
    TOKENIZER,
    TOKENIZER_CONFIG,
    SPECIAL_TOKENS,
    GENERATION_CONFIG,
    *REMOTE_FILES,
)
REMOTE_CODE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf", "remote")  # PyTorch, never imported here


def check_out(run_dir: str, out: str) -> None:
    """ValueError when `out` may not receive an export of `run_dir`: a run folder (that one or another), a
    symbolic link, or a folder holding files other than an export's."""
    if os.path.islink(out):
        raise ValueError(f"out must not be a symbolic link, got {out!r} (-> {os.readlink(out)!r})")
    if os.path.abspath(out) == os.path.abspath(run_dir) or is_run_folder(out):
        raise ValueError(
            f"out must be a folder of its own, got {out!r}, a run folder: an export there would hide the run's "
            "checkpoints from load_run. Export to another folder (e.g. <run>/export)."
        )
    if os.path.exists(out):
        if not os.path.isdir(out):
            raise ValueError(f"out must be a folder, got {out!r} (a file)")
        if others := sorted(set(os.listdir(out)) - set(EXPORT_FILES)):
            raise ValueError(f"out must be empty or an export folder, got {out!r} holding {others[:4]}")


def _hf_tokenizer(record: dict, tokenizer) -> tuple | None:
    """(the run's tokenizer as a `tokenizers.Tokenizer`, its end-of-document id): the run's tokenizer.json, or for a
    bytes run its equivalent (`byte_tokenizer`); None for a synthetic task, which has no tokenizer."""
    if tokenizer is not None:
        return tokenizer.tokenizer, tokenizer.eod
    return (byte_tokenizer(), ByteTokenizer.eod) if record["config"]["data"].get("task") == "text" else None


def export_run(run_dir: str, out: str, step: int | None = None) -> str:
    """Export a run whole (the module docstring): its weights, an HF-style config.json, its record and tokenizer
    (with transformers' tokenizer and generation files), replacing an export at `out` in one rename.

    Args:
        run_dir: the train.py run folder.
        out: a folder of its own: not a run folder, a symbolic link or a folder holding other files.
        step: the checkpoint's step; None: the newest intact one.

    Returns:
        out.
    """
    check_out(run_dir, out)
    loaded = read_run(run_dir, step)
    tokenizer = run_tokenizer(run_dir, loaded.record)  # checked against the record's fingerprint
    hf_tokenizer = _hf_tokenizer(loaded.record, tokenizer)
    layout, weights = hf_tensors(loaded.model)
    checksums, _ = tree_checksums(weights)
    digest = record_digest(loaded.record)
    metadata = {
        "format": "pt" if layout == "llama" else "retention",
        "layout": layout,
        "step": str(loaded.step),
        "record_sha256": digest,
        "checksums": json.dumps(checksums),
    }
    config = hf_config(
        loaded.model.config,
        max_position_embeddings=max_positions(loaded.record),
        eos_token_id=None if hf_tokenizer is None else hf_tokenizer[1],
    )
    config["retention_export"] = {"layout": layout, "step": loaded.step, "record_sha256": digest}
    parent, name = os.path.split(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    aside = tempfile.mkdtemp(dir=parent, prefix=f".{name}.export-")  # new and empty: nothing in it is a link
    try:
        save_file(weights, os.path.join(aside, EXPORT_WEIGHTS), metadata=metadata)
        with open(os.path.join(aside, EXPORT_CONFIG), "x") as f:
            json.dump(config, f, indent=2)
        with open(os.path.join(aside, EXPORT_RECORD), "x") as f:
            json.dump({"step": loaded.step, "record": loaded.record, "record_sha256": digest}, f, indent=2)
        if hf_tokenizer is not None:
            write_tokenizer_files(aside, *hf_tokenizer)
        if layout == "retention":  # the PyTorch model config.json's auto_map names, for trust_remote_code
            for file in REMOTE_FILES:
                shutil.copyfile(os.path.join(REMOTE_CODE, file), os.path.join(aside, file))
        if tokenizer is not None:  # the run's file, byte for byte, over transformers' copy: load_run checks it
            shutil.copyfile(os.path.join(run_dir, TOKENIZER), os.path.join(aside, TOKENIZER))
        for file in os.listdir(aside):
            os.chmod(os.path.join(aside, file), 0o644)  # safetensors writes its files private
        os.chmod(aside, 0o755)  # mkdtemp makes it private
        if os.path.exists(out):  # the old export moves out of the way, then the new one moves in
            old = tempfile.mkdtemp(dir=parent, prefix=f".{name}.old-")
            os.rename(out, os.path.join(old, name))
            os.rename(aside, out)
            shutil.rmtree(old)
        else:
            os.rename(aside, out)
    except BaseException:
        shutil.rmtree(aside, ignore_errors=True)
        raise
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", help="a train.py run folder (hydra.run.dir)")
    parser.add_argument("out", help="a folder of its own to write the export to")
    parser.add_argument("--step", type=int, default=None, help="a checkpoint's step (default: the newest intact)")
    args = parser.parse_args()
    try:
        print(f"wrote {export_run(args.run_dir, args.out, args.step)}")
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
    main()

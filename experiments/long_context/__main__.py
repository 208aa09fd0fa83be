"""The command line of experiments/long_context (see its __init__): `text` or `recall` over run folders.

python -m experiments.long_context text outputs/long_text/softmax/<date> outputs/long_text/power/<date>
python -m experiments.long_context text RUN --length 4096 --docs 2 --out /tmp/lc/text.json     # a smoke run
python -m experiments.long_context recall RUN ... --lengths 4096 16384 65536 --queries 512
python -m experiments.long_context text MORE_RUNS ... --merge    # add models to the JSON at --out (resumable)
python -m experiments.long_context mission --text TEXT_JSON --recall RECALL_JSON ...   # the one table and figure
"""

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

from experiments.compare.runs import write_json
from experiments.long_context.mission import mission_figure, mission_markdown, mission_rows
from experiments.long_context.models import ROPE_SCALINGS
from experiments.long_context.reader import PATHS, SEGMENT
from experiments.long_context.report import recall_figure, recall_markdown, text_figure, text_markdown
from experiments.long_context.run import recall_result, text_result
from retention.validation import check_int, check_number

LONG = 65536


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    kinds = parser.add_subparsers(dest="kind", required=True)
    text = kinds.add_parser("text", help="loss by position on whole long documents")
    text.add_argument("runs", nargs="+", help="text run folders (or exports)")
    text.add_argument("--length", type=int, default=LONG, help="tokens read from each document's start")
    text.add_argument("--docs", type=int, default=None, help="at most this many documents (default: all)")
    text.add_argument("--out", default="results/long_context/text.json")
    recall = kinds.add_parser("recall", help="MQAR and passkey recall at long lengths")
    recall.add_argument("runs", nargs="+", help="MQAR and passkey run folders (or exports)")
    recall.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384, LONG])
    recall.add_argument("--queries", type=int, default=512, help="at least this many queries a model and length")
    recall.add_argument("--gap-fraction", type=float, default=0.5, help="MQAR: pairs-to-queries gap, a share of L")
    recall.add_argument("--batch-tokens", type=int, default=LONG, help="tokens a batch (at least one row)")
    recall.add_argument("--out", default="results/long_context/recall.json")
    mission = kinds.add_parser("mission", help="one table and figure from a text JSON and recall JSONs")
    mission.add_argument("--text", default="results/long_context/text.json", help="a `text` result")
    mission.add_argument("--recall", nargs="+", default=["results/long_context/recall.json"], help="`recall` results")
    mission.add_argument("--out", default="results/long_context/mission.md", help="the page; its figure beside it")
    for sub in (text, recall):
        sub.add_argument("--rope", nargs="*", choices=ROPE_SCALINGS, default=["llama3"], help="RoPE scaling rows")
        sub.add_argument("--path", choices=PATHS, default="auto", help="forward, carry, or auto (forward if it fits)")
        sub.add_argument("--segment", type=int, default=SEGMENT, help="tokens a decode step on the carry path")
        sub.add_argument("--max-gib", type=float, default=32.0, help="auto: carry when the forward needs more")
        sub.add_argument("--merge", action="store_true", help="add these models to the JSON at --out (same setting)")
    return parser.parse_args(argv)


def check_args(args: argparse.Namespace) -> dict:
    """The options of the evaluation, each checked (a ValueError names the flag) before any run is read."""
    for folder in args.runs:
        if not os.path.isdir(folder):
            raise ValueError(f"runs must be run or export folders, got {folder!r} (not a folder)")
    check_int("--segment", args.segment)
    check_number("--max-gib", args.max_gib, low=0, open_low=True)
    options = {"rope": tuple(args.rope), "path": args.path, "segment": args.segment, "max_bytes": args.max_gib * 2**30}
    if args.kind == "text":
        check_int("--length", args.length)
        if args.docs is not None:
            check_int("--docs", args.docs)
        return {**options, "length": args.length, "docs": args.docs}
    for L in args.lengths:
        check_int("--lengths[i]", L, low=2)
    check_int("--queries", args.queries)
    check_number("--gap-fraction", args.gap_fraction, low=0, high=1, open_high=True)
    check_int("--batch-tokens", args.batch_tokens)
    return {
        **options,
        "lengths": sorted(set(args.lengths)),
        "queries": args.queries,
        "gap_fraction": args.gap_fraction,
        "batch_tokens": args.batch_tokens,
    }


def write_result(result: dict, out: Path, kind: str) -> str:
    """Write the result's JSON at `out` (non-finite numbers as null), its figure (.png) and Markdown page (.md)
    beside it; returns the page."""
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, result)
    clean = json.loads(out.read_text())  # as written
    if kind == "text":
        page = text_markdown(clean, text_figure(clean, out.with_suffix(".png")))
    else:
        page = recall_markdown(clean, recall_figure(clean, out.with_suffix(".png")))
    out.with_suffix(".md").write_text(page)
    return page


SETTING = {"text": ("length", "documents"), "recall": ("lengths", "queries", "gap_fraction", "batch_tokens")}


def merged(earlier: dict, result: dict, kind: str) -> dict:
    """`earlier` (a JSON this command wrote) with `result`'s models added after its own, a row read again (the same
    run folder and RoPE) replacing its earlier one; the commands of both kept in order. Rows are told apart by run
    and RoPE, not by label: the seeds of one model share a label.

    Args:
        earlier: the JSON at --out, as read back.
        result: this call's result, as written (non-finite numbers as null).
        kind: "text" or "recall".

    Returns:
        The merged result.

    Raises:
        ValueError: the two were read with another setting (text: length or documents; recall: lengths, queries,
            gap or batch), naming the first that differs.
    """
    for key in SETTING[kind]:
        if earlier.get(key) != result[key]:
            raise ValueError(
                f"--merge: {key} differs from the JSON at --out ({earlier.get(key)!r}, now {result[key]!r})"
            )
    key = lambda row: (row["run"], row["rope"])  # as models.Trained.key
    fresh = {key(row) for row in result["models"]}
    models = [row for row in earlier["models"] if key(row) not in fresh] + result["models"]
    commands = earlier["command"] if isinstance(earlier["command"], list) else [earlier["command"]]
    return {**result, "command": [*commands, result["command"]], "models": models}


def write_mission(text_path: str, recall_paths: list[str], out: Path) -> str:
    """The mission page (mission.py) from the JSONs at the given paths, its figure beside `out`; returns the page.

    Raises:
        ValueError: a path is not a file (naming the flag and the path).
    """
    for flag, path in (("--text", text_path), *(("--recall", p) for p in recall_paths)):
        if not os.path.isfile(path):
            raise ValueError(f"{flag} must be a JSON this command wrote, got {path!r} (not a file)")
    text = json.loads(Path(text_path).read_text())
    recalls = [json.loads(Path(p).read_text()) for p in recall_paths]
    lengths = sorted({n for result in recalls for n in result["lengths"]})
    rows = mission_rows(text, recalls)
    out.parent.mkdir(parents=True, exist_ok=True)
    page = mission_markdown(rows, lengths, text, recalls, mission_figure(text, rows, lengths, out.with_suffix(".png")))
    out.write_text(page)
    return page


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.kind == "mission":
        print(write_mission(args.text, args.recall, Path(args.out)))
        return
    options = check_args(args)
    command = shlex.join(["python", "-m", "experiments.long_context", *(sys.argv[1:] if argv is None else argv)])
    evaluate = text_result if args.kind == "text" else recall_result
    result = evaluate(args.runs, options, command)
    out = Path(args.out)
    if args.merge and out.exists():
        as_written = json.loads(json.dumps(result))  # tuples as lists, as the JSON at --out holds them
        result = merged(json.loads(out.read_text()), as_written, args.kind)
    print(write_result(result, out, args.kind))


if __name__ == "__main__":
    main()

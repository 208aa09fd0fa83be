"""The two evaluations over a list of run folders: `text_result` (the loss by position on whole long documents)
and `recall_result` (MQAR and passkey at long lengths). Every row is one run's model read as trained, plus one row
per RoPE scaling for a softmax model read past its training length (models.py)."""

from experiments.compare.run import machine
from experiments.long_context.models import Trained, load_trained, rope_variants
from experiments.long_context.position import eval_documents, position_losses
from experiments.long_context.reader import make_reader
from experiments.long_context.recall import mqar_recall, passkey_recall


def _same_documents(first: tuple[Trained, dict, list], other: tuple[Trained, dict, list]) -> None:
    """ValueError unless two runs read the same documents by the same rule (names and sha256)."""
    (a, rule_a, docs_a), (b, rule_b, docs_b) = first, other
    names = lambda docs: [(d.name, d.sha256) for d in docs]
    if rule_a != rule_b or names(docs_a) != names(docs_b):
        raise ValueError(
            f"runs must read the same documents to be compared: {a.folder} reads {len(docs_a)} by {rule_a}, "
            f"{b.folder} reads {len(docs_b)} by {rule_b} (evaluate runs of one corpus and split rule together)"
        )


def text_result(folders: list[str], options: dict, command: str) -> dict:
    """The loss by position of each run's models on its eval split's long documents.

    Args:
        folders: text run folders (all on one corpus and split rule).
        options: length, docs, rope (scalings), path, segment, max_bytes.
        command: the command line, recorded.

    Returns:
        {"command", "machine", "length", "documents": {"rule", "count", "chosen"}, "models": [row]}: each row the
        run's description, its reader's cost and `position_losses`.
    """
    L = options["length"]
    runs = []
    for folder in folders:
        trained = load_trained(folder, ("text",))
        runs.append((trained, *eval_documents(trained, L, options["docs"])))
        _same_documents(runs[0], runs[-1])
    _, rule, documents = runs[0]
    rows = []
    for trained, *_ in runs:
        for variant in rope_variants(trained, L, options["rope"]):
            print(f"reading {len(documents)} documents of {L} tokens with {variant.label}", flush=True)
            reader = make_reader(variant.model, 1, L, **_reader_options(options))
            losses = position_losses(reader.sums, L, documents, variant.text_tokenizer().token_bytes)
            rows.append({**variant.describe(), **reader.cost(), **losses})
    chosen = [d.record() for d in documents]
    return {
        "command": command,
        "machine": machine(),
        "length": L,
        "documents": {"rule": rule, "count": len(chosen), "chosen": chosen},
        "models": rows,
    }


def _reader_options(options: dict) -> dict:
    return {k: options[k] for k in ("path", "segment", "max_bytes")}


def recall_result(folders: list[str], options: dict, command: str) -> dict:
    """MQAR and passkey recall of each run's models at each length.

    Args:
        folders: MQAR and passkey run folders.
        options: lengths, queries, gap_fraction, batch_tokens, rope (scalings), path, segment, max_bytes.
        command: the command line, recorded.

    Returns:
        {"command", "machine", "lengths", "queries", "gap_fraction", "batch_tokens", "models": [row]}: each row the
        run's description (RoPE as that row reads), its task and {"lengths": {L: metrics and the reader's cost}}.
    """
    rows = {}
    for folder in folders:
        trained = load_trained(folder, ("mqar", "passkey"))
        for L in options["lengths"]:
            for variant in rope_variants(trained, L, options["rope"]):
                print(f"{trained.config.data.task} at {L} tokens with {variant.label}", flush=True)
                reader_for = lambda batch, v=variant, n=L: make_reader(v.model, batch, n, **_reader_options(options))
                if trained.config.data.task == "mqar":
                    metrics = mqar_recall(
                        variant, reader_for, L, options["queries"], options["gap_fraction"], options["batch_tokens"]
                    )
                else:
                    metrics = passkey_recall(variant, reader_for, L, options["queries"], options["batch_tokens"])
                row = rows.setdefault(variant.key, {**variant.describe(), "task": trained.config.data.task})
                row["rope_factor"] = variant.rope_factor  # L / T: the longest length's for a scaled row
                row.setdefault("lengths", {})[str(L)] = {**metrics, "rope_factor": variant.rope_factor}
    keys = ("lengths", "queries", "gap_fraction", "batch_tokens")
    return {"command": command, "machine": machine(), **{k: options[k] for k in keys}, "models": list(rows.values())}

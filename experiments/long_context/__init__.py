"""Quality at long context (64k) of trained runs: the loss by position on whole long documents (context
utilisation) and recall (MQAR with long gaps, passkey) at lengths far past training.

    python -m experiments.long_context text RUN [RUN ...] --length 65536 [--docs N] [--rope llama3]
    python -m experiments.long_context recall RUN [RUN ...] --lengths 4096 16384 65536 [--queries 512]
    python -m experiments.long_context mission --text TEXT_JSON --recall RECALL_JSON [...]   # one table, one figure

Each run's model reads every sequence as ONE sequence from its start, by one compiled forward (blockwise softmax,
the fixed-state layers' linear chunked forms) or by a prefill and decode steps carrying the caches (reader.py).
Text runs read their own eval split's documents (retention/data/documents.py; train them on `data=long_text` so
the split holds the long documents and no eval document is trained on). Writes JSON, its Markdown page and a
figure (run.py, report.py). docs/DESIGN.md ("Long-context evaluation") has the recipe.
"""

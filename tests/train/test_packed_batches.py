"""The train and eval steps read packed text batches as packed: the logits of a text batch through the steps'
one model call (`batch_logits`) equal each of its documents run alone, and the loss sums count only targets
inside a document."""

import numpy as np
from flax import nnx

from retention.data import IGNORE, Text
from retention.nn import LM, LMConfig
from retention.train.step import batch_logits, device_batch
from tests.helpers import rel_err

SEED = int(np.random.SeedSequence().generate_state(1)[0])


def test_text_batches_reach_the_model_packed(tmp_path):
    rng = np.random.default_rng(SEED)
    for i in range(40):  # short documents: every window of 48 holds several
        (tmp_path / f"{i}.txt").write_text("".join(rng.choice(list("abcd \n"), int(rng.integers(3, 20)))))
    data = Text(seq_len=48, batch_size=3, path=str(tmp_path), eval_fraction=0.3, cache_dir=str(tmp_path / "c"))
    batch = data.batch(int(rng.integers(0, 100)))
    assert batch.segment_ids is not None and all(len(np.unique(row)) > 2 for row in batch.segment_ids)
    config = LMConfig(
        vocab_size=data.vocab_size,
        d_model=16,
        n_layers=3,
        n_heads=2,
        n_kv_heads=1,
        head_dim=8,
        pattern="PWA",
        window=8,
        conv_size=3,
        chunk_size=16,
    )  # the three mixers and a convolution: each could read across a document boundary
    model = LM(config, rngs=nnx.Rngs(int(rng.integers(0, 2**31))))
    device = device_batch(batch)
    assert set(device) == {"inputs", "targets", "segment_ids"}
    logits = np.asarray(nnx.jit(batch_logits)(model, device))
    # every document alone, one per row, padded at its end to the window (a causal model: padding after a token
    # never changes its logits), all in one call
    spans = [(b, np.flatnonzero(row == doc)) for b, row in enumerate(batch.segment_ids) for doc in np.unique(row)]
    alone_rows = np.stack([np.pad(batch.inputs[b, where], (0, 48 - len(where))) for b, where in spans])
    alone = np.asarray(nnx.jit(lambda m, x: m(x))(model, alone_rows))
    for r, (b, where) in enumerate(spans):
        assert rel_err(logits[b, where], alone[r, : len(where)]) < 1e-5, (b, where)
    eod_inputs = batch.inputs == data.eod
    assert np.all(batch.targets[eod_inputs] == IGNORE)  # no target predicts across a boundary

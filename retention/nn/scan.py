"""Scanned layers (`LMConfig.scan_layers`): the pattern's period (e.g. the four blocks of "PPPA") is one module,
`Period`, made `n_layers // len(pattern)` times by `nnx.vmap` (every parameter gains a leading repeat axis R, its
logical axis "layers") and
run by `nnx.scan`, so the step compiles one period whatever the depth. Caches are stacked the same way: one per
letter of the period, each with the leading axis R.

Layer i of the unscanned LM is block `i % P` of repeat `i // P` (P = len(pattern)); `scan_state` and
`unscan_state` convert a state (parameters, or any state shaped like them) between the two forms, so a checkpoint
of one loads into the other.
"""

import operator

import jax
import jax.numpy as jnp
from flax import nnx

from retention.nn.remat import block_runner

UNSCANNED_KEY, SCANNED_KEY = "blocks", "periods"


def check_scannable(pattern: str, n_layers: int) -> None:
    """scan_layers needs n_layers to be a whole number of the pattern's periods (ValueError naming both)."""
    if n_layers % len(pattern):
        raise ValueError(
            f"scan_layers=True needs n_layers to be a multiple of len(pattern)={len(pattern)} (pattern={pattern!r} "
            f"is scanned as repeats of its period), got n_layers={n_layers}; set n_layers to "
            f"{n_layers - n_layers % len(pattern)} or {n_layers + len(pattern) - n_layers % len(pattern)}, or "
            "scan_layers=False"
        )


class Period(nnx.Module):
    """One period of the pattern: a Block per letter, run in order, each under the config's remat policy."""

    def __init__(self, config, block_type, *, rngs: nnx.Rngs):
        self.blocks = nnx.List([block_type(config, kind, rngs=rngs) for kind in config.pattern])

    def __call__(self, x_BTD, *, positions, segment_ids, caches, mode: str, run):
        """x [B, T, D] through the period's blocks in `mode` (the Block's); caches: one per block or None. Returns
        (x, new caches)."""
        caches = (None,) * len(self.blocks) if caches is None else caches
        new = []
        for j, (block, cache) in enumerate(zip(self.blocks, caches)):
            with jax.named_scope(f"period_block{j}"):
                x_BTD, cache = run(block, x_BTD, positions, segment_ids, cache, mode)
            new.append(cache)
        return x_BTD, tuple(new)


def stacked_periods(config, block_type, *, rngs: nnx.Rngs) -> Period:
    """A Period whose parameters carry a leading axis of n_layers // len(pattern) repeats (nnx.vmap over split
    rngs: each repeat its own initialisation)."""
    repeats = config.n_layers // len(config.pattern)

    @nnx.split_rngs(splits=repeats)
    @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
    def make(rngs):
        return Period(config, block_type, rngs=rngs)

    return make(rngs)


def run_scanned(periods: Period, x_BTD, *, positions, segment_ids, caches, mode: str, remat_policy: str):
    """x [B, T, D] through every repeat of the stacked `periods` in order, every mixer in `mode` (nnx.scan; caches
    None, or one per letter of the period stacked over the repeats). Returns (x, the new stacked caches or None)."""
    run = block_runner(remat_policy, scanned=True)

    @nnx.scan(
        in_axes=(nnx.Carry, 0, 0, None, None),
        out_axes=(nnx.Carry, 0),
        transform_metadata={nnx.PARTITION_NAME: "layers"},
    )
    def body(x_BTD, period, layer_caches, positions, segment_ids):
        return period(x_BTD, positions=positions, segment_ids=segment_ids, caches=layer_caches, mode=mode, run=run)

    x_BTD, new = body(x_BTD, periods, caches, positions, segment_ids)
    return x_BTD, None if caches is None else new


def stacked_caches(config, block_type, batch: int, max_len: int, dtype, *, step_tokens: int) -> tuple:
    """Fresh caches of the stacked periods: one per letter of the period, each repeated over a leading axis of
    n_layers // len(pattern) (fresh caches are equal). They come from one period made with abstract parameters
    (nnx.eval_shape: a cache may read its sizes from its mixer's parameter shapes), so this runs under any trace."""
    period = nnx.eval_shape(lambda: Period(config, block_type, rngs=nnx.Rngs(0)))
    caches = tuple(b.mixer.init_cache(batch, max_len, dtype, step_tokens=step_tokens) for b in period.blocks)
    repeats = config.n_layers // len(config.pattern)
    return jax.tree.map(lambda x: jnp.broadcast_to(x, (repeats, *x.shape)), caches)


def scan_state(state: dict, config) -> dict:
    """A pure-dict state of the unscanned LM (`nnx.to_pure_dict(nnx.state(model))`, or anything shaped like its
    parameters) in the scanned form: blocks[r*P + j] -> periods.blocks[j] at repeat r (stacked on axis 0)."""
    check_scannable(config.pattern, config.n_layers)
    P, layers = len(config.pattern), state[UNSCANNED_KEY]
    repeats = len(layers) // P
    if len(layers) != config.n_layers:
        raise ValueError(f"state must hold config.n_layers={config.n_layers} blocks, got {len(layers)}")
    stacked = {
        j: jax.tree.map(lambda *xs: jnp.stack(xs), *(layers[r * P + j] for r in range(repeats))) for j in range(P)
    }
    out = {k: v for k, v in state.items() if k != UNSCANNED_KEY}
    return {**out, SCANNED_KEY: {"blocks": stacked}}


def unscan_state(state: dict, config) -> dict:
    """The inverse of `scan_state`: periods.blocks[j] at repeat r -> blocks[r*P + j]."""
    P, stacked = len(config.pattern), state[SCANNED_KEY]["blocks"]
    repeats = config.n_layers // P
    layers = {r * P + j: jax.tree.map(operator.itemgetter(r), stacked[j]) for r in range(repeats) for j in range(P)}
    out = {k: v for k, v in state.items() if k != SCANNED_KEY}
    return {**out, UNSCANNED_KEY: dict(sorted(layers.items()))}

"""AdamW with a linear warmup then cosine decay, and gradient clipping by global norm (Optax)."""

import jax
import optax

from retention.train.config import OptimConfig


def make_schedule(optim: OptimConfig, steps: int) -> optax.Schedule:
    """Learning rate at each step: 0 -> lr over warmup_steps, then cosine to lr * min_lr_ratio at `steps`."""
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=optim.lr,
        warmup_steps=optim.warmup_steps,
        decay_steps=steps,
        end_value=optim.lr * optim.min_lr_ratio,
    )


def make_optimizer(optim: OptimConfig, steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """(clip by global norm then AdamW, the schedule); weight decay only on matrices (ndim >= 2: projections and
    the embedding), not on norm scales, gate biases or vectors."""
    schedule = make_schedule(optim, steps)
    decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)
    tx = optax.chain(
        optax.clip_by_global_norm(optim.clip_norm),
        optax.adamw(
            schedule, b1=optim.b1, b2=optim.b2, eps=optim.eps, weight_decay=optim.weight_decay, mask=decay_mask
        ),
    )
    return tx, schedule

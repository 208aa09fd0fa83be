"""AdamW with a linear warmup then cosine decay, and gradient clipping by global norm (Optax); with
optim.accumulate = N > 1, wrapped in optax.MultiSteps: one optimizer step per N micro-batches."""

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
    """(clip by global norm then AdamW, the learning rate at each micro-step); weight decay only on matrices
    (ndim >= 2: projections and the embedding), not on norm scales, gate biases or vectors.

    `steps` and the schedule count micro-steps (OptimConfig). With N = optim.accumulate > 1, optax.MultiSteps
    averages N micro-batches' gradients and applies the chain to their mean at the Nth, its updates zero before:
    the chain's k-th step (its own count) takes the schedule's rate at micro-step k * N, which is the rate
    returned for each of micro-steps k * N .. k * N + N - 1."""
    schedule, n = make_schedule(optim, steps), optim.accumulate
    decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)
    lr = schedule if n == 1 else (lambda count: schedule(count * n))
    tx = optax.chain(
        optax.clip_by_global_norm(optim.clip_norm),
        optax.adamw(lr, b1=optim.b1, b2=optim.b2, eps=optim.eps, weight_decay=optim.weight_decay, mask=decay_mask),
    )
    if n == 1:
        return tx, schedule
    return optax.MultiSteps(tx, every_k_schedule=n).gradient_transformation(), lambda step: schedule(step // n * n)

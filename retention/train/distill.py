"""Distillation from a frozen teacher inside the train step: KL(teacher || student) on the logits at a
temperature, and the LoLCATs layer term (each converted layer's output against the output of the attention layer
it replaced, on the teacher's input to that layer)."""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Bool, Float

from retention.nn import LM
from retention.nn.layers import document_positions


class Distill(NamedTuple):
    """The distillation terms of a train step: weights, temperature, the teacher's graphdef (its parameters come
    into the step as an argument) and the converted layers the layer term compares (unscanned models)."""

    kl_weight: float
    temperature: float
    layer_weight: float
    teacher: nnx.GraphDef
    layers: tuple[int, ...] = ()


def kl_sum(
    teacher_BTV: Float[Array, "B T V"], student_BTV: Float[Array, "B T V"], mask_BT: Bool[Array, "B T"], temperature
) -> Float[Array, ""]:
    """temperature^2 * sum over the positions of mask of KL(p || q), p = softmax(teacher / temperature) and q =
    softmax(student / temperature), in float32 (the temperature^2 keeps the gradient's scale across
    temperatures, as in Hinton et al. 2015)."""
    logp = jax.nn.log_softmax(teacher_BTV.astype(jnp.float32) / temperature, axis=-1)
    logq = jax.nn.log_softmax(student_BTV.astype(jnp.float32) / temperature, axis=-1)
    kl_BT = jnp.sum(jnp.exp(logp) * (logp - logq), axis=-1)
    return temperature**2 * jnp.sum(jnp.where(mask_BT, kl_BT, 0.0))


def teacher_pass(teacher: LM, student: LM, batch: dict, layers: tuple[int, ...]):
    """(the teacher's logits [B, T, V], the mean over `layers` of the MSE between the student's mixer and the
    teacher's (attention) mixer of that layer on the teacher's normed input to it; 0 without layers). The
    teacher's outputs carry no gradient; the student's mixers do."""
    if not layers:
        return jax.lax.stop_gradient(teacher(batch["inputs"], segment_ids=batch.get("segment_ids"))), 0.0
    tokens, segment_ids = batch["inputs"], batch.get("segment_ids")
    T = tokens.shape[1]
    positions = jnp.arange(T, dtype=jnp.int32) if segment_ids is None else document_positions(segment_ids)
    x_BTD, mse = jax.lax.stop_gradient(teacher.embed(tokens)), []
    for i, block in enumerate(teacher.blocks):
        if i in layers:
            h_BTD = jax.lax.stop_gradient(block.mixer_norm(x_BTD))
            want = jax.lax.stop_gradient(block.mixer(h_BTD, positions=positions, segment_ids=segment_ids))
            got = student.blocks[i].mixer(h_BTD, positions=positions, segment_ids=segment_ids)
            mse.append(jnp.mean(jnp.square(got.astype(jnp.float32) - want.astype(jnp.float32))))
        x_BTD = jax.lax.stop_gradient(block(x_BTD, positions=positions, segment_ids=segment_ids)[0])
    x_BTD = teacher.final_norm(x_BTD)
    logits = teacher.embed.attend(x_BTD) if teacher.head is None else teacher.head(x_BTD)
    return jax.lax.stop_gradient(logits.astype(jnp.float32)), sum(mse) / len(mse)

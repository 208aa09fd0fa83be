"""What a packed sequence's segment ids mean, for every op and mixer: a document is a run of equal ids, and a change
of id always starts a fresh one. Ids should be contiguous in time (checked when their values are known: an id may
not come back); an id that does come back (under jit, or in a later decode call) starts a new document, which sees
nothing of the earlier one with the same id."""

import jax.numpy as jnp
from jaxtyping import Array, Bool, Int


def document_starts(segment_ids: Int[Array, "B T"]) -> Bool[Array, "B T"]:
    """True where a token's segment id differs from the previous token's (never at token 0)."""
    change = segment_ids[:, 1:] != segment_ids[:, :-1]
    return jnp.concatenate([jnp.zeros((segment_ids.shape[0], 1), bool), change], axis=1)  # T = 1 too


def document_index(segment_ids: Int[Array, "B T"]) -> Int[Array, "B T"]:
    """Each token's document number in its row, int32: 0 for the first run of equal ids, +1 at every change. Ids
    compared by equality after this mean what `document_starts` means (an id that comes back is a new number)."""
    return jnp.cumsum(document_starts(segment_ids), axis=1, dtype=jnp.int32)

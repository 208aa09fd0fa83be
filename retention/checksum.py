"""Per-array checksums computed on the devices, so a file can prove on reading that it holds what was written (the
trainer's checkpoints, exports, serving's snapshot files and weights digests). It needs JAX and NumPy only.

Each array's bits are read as uint32 words (16- and 8-bit types widened, 64-bit ones split in two) and summed
twice with wrapping uint32 arithmetic: plainly, and weighted by each word's position (1, 2, ...). A single
flipped bit changes the plain sum by +-2^b, never 0 mod 2^32, so it is always caught; the weighted sum catches
words that moved. Both sums are reductions over the array in its own shape and sharding (no reshape, no gather):
on a mesh each device sums its shards and XLA adds the partial sums, so the same two numbers come out whatever
mesh the array is on.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def _words(x: jax.Array) -> jax.Array:
    """The bits of `x` as uint32 words, in x's shape (a trailing axis of 2 for 64-bit types)."""
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint8)
    width = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[x.dtype.itemsize]
    return lax.bitcast_convert_type(x, width).astype(jnp.uint32)


def _position(shape: tuple[int, ...]) -> jax.Array:
    """1 + the row-major position of each element of an array of `shape`, as wrapping uint32."""
    position = jnp.zeros(shape, jnp.uint32)
    stride = 1
    for axis in reversed(range(len(shape))):
        position = position + lax.broadcasted_iota(jnp.uint32, shape, axis) * jnp.uint32(stride % 2**32)
        stride *= shape[axis]
    return position + jnp.uint32(1)


def _sums(x: jax.Array) -> jax.Array:
    """[2] uint32: the wrapping sum of x's words and their position-weighted wrapping sum."""
    words = _words(x)
    return jnp.stack([jnp.sum(words, dtype=jnp.uint32), jnp.sum(words * _position(words.shape), dtype=jnp.uint32)])


@jax.jit
def _tree_sums(leaves: list) -> tuple[jax.Array, jax.Array]:
    """([n, 2] uint32 checksums of each leaf, whether every floating-point leaf is finite)."""
    sums = jnp.stack([_sums(x) for x in leaves]) if leaves else jnp.zeros((0, 2), jnp.uint32)
    finite = [jnp.all(jnp.isfinite(x)) for x in leaves if jnp.issubdtype(x.dtype, jnp.floating)]
    return sums, jnp.all(jnp.stack(finite)) if finite else jnp.bool_(True)


def _host(x: jax.Array) -> np.ndarray:
    """A replicated (or single-device) array's value on this host, whichever devices hold it."""
    return np.asarray(jax.device_get(x.addressable_data(0)))


def tree_checksums(tree) -> tuple[dict[str, list[int]], bool]:
    """({leaf key path: [plain sum, weighted sum]}, whether every floating-point leaf is finite), computed on the
    devices in one compiled call; only the 2 numbers per leaf come back to the host."""
    paths, leaves = zip(*jax.tree_util.tree_leaves_with_path(tree)) if jax.tree.leaves(tree) else ((), ())
    sums, finite = _tree_sums(list(leaves))
    sums = _host(sums)
    return {jax.tree_util.keystr(p): [int(a), int(b)] for p, (a, b) in zip(paths, sums)}, bool(_host(finite))


def mismatched(saved: dict[str, list[int]], tree) -> tuple[list[str], bool]:
    """(key paths of `tree`'s leaves whose checksums differ from `saved` or are missing there, whether every
    floating-point leaf is finite)."""
    sums, finite = tree_checksums(tree)
    return [k for k, v in sums.items() if saved.get(k) != v], finite

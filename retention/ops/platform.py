"""Which platform an op targets: the default device's, or the target of an active `lowering_for` (lowering a model
from this machine for a GPU or TPU with `jax.export`). Every op's `impl="auto"` and the Pallas kernels' backend and
interpret mode read it here, so one context switches them all."""

import contextlib
import contextvars

import jax

KERNEL_BACKENDS = ("gpu", "tpu")
_TARGET = contextvars.ContextVar("lowering_target", default=None)


@contextlib.contextmanager
def lowering_for(backend: str):
    """A context in which the ops target `backend`, whatever the default device is: `impl="auto"` chooses as on
    that platform, kernels take its variant and none runs interpreted.

    ```python
    with lowering_for("gpu"):
        exported = jax.export.export(jax.jit(step), platforms=["cuda"])(*shapes)
    ```

    Args:
        backend: "gpu" or "tpu".

    Raises:
        ValueError: another backend.
    """
    if backend not in KERNEL_BACKENDS:
        raise ValueError(f"backend must be one of {KERNEL_BACKENDS}, got {backend!r}")
    token = _TARGET.set(backend)
    try:
        yield
    finally:
        _TARGET.reset(token)


def lowering_target() -> str | None:
    """The backend of the active `lowering_for`, or None."""
    return _TARGET.get()


def target_platform() -> str:
    """'cpu', 'gpu' or 'tpu': the active `lowering_for`'s backend, else the default device's."""
    return _TARGET.get() or jax.default_backend()


def kernel_backend(backend: str | None = None) -> str:
    """The kernel variant, 'gpu' or 'tpu': the given one, else the target platform's ('gpu' on a CPU, where the
    kernels run interpreted)."""
    if backend is None:
        return "tpu" if target_platform() == "tpu" else "gpu"
    if backend not in KERNEL_BACKENDS:
        raise ValueError(f"backend must be None or one of {KERNEL_BACKENDS}, got {backend!r}")
    return backend


def kernel_interpret(interpret: bool | None = None) -> bool:
    """Whether kernels run in interpret mode: the given choice, else exactly when the target platform is a CPU."""
    return target_platform() == "cpu" if interpret is None else bool(interpret)

"""retention: power retention, a linear attention with a fixed-size state, and softmax baselines, in JAX.

The names below load on first use (PEP 562), so `import retention` costs nothing and `import retention.ops`
loads only JAX and einops: the modules (Flax) and `load_run` (the trainer's Orbax and Hydra) come when named."""

import importlib

_HOMES = {
    "retention.ops": (
        "KVCache",
        "RetentionState",
        "gated_delta_rule",
        "gated_delta_rule_step",
        "gated_linear_attention",
        "gated_linear_attention_step",
        "init_kv_cache",
        "init_matrix_state",
        "init_state",
        "linear_attention",
        "linear_attention_step",
        "power_retention",
        "power_retention_reference",
        "power_retention_step",
        "softmax_attention",
        "softmax_attention_step",
        "sympow",
        "sympow_dim",
    ),
    "retention.nn": (
        "LM",
        "Attention",
        "LMCache",
        "LMConfig",
        "PowerRetention",
        "cache_bytes",
        "count_params",
        "flops_per_token",
        "size_config",
    ),
    "retention.generation": ("generate",),
    "retention.serve.snapshot_value": ("Snapshot",),
    "retention.serve.snapshot": ("fork", "load_snapshot", "prefill", "save_snapshot", "snapshot_bytes"),
    "retention.load": ("load_run",),
    "retention.hf": ("load_hf",),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}
__all__ = sorted(_HOME_OF)


def __getattr__(name: str):
    """A public name, imported from its home module on first use (and cached in this module)."""
    if name not in _HOME_OF:
        raise AttributeError(f"module 'retention' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME_OF[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

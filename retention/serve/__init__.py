"""Serving on top of the LM: prefix snapshots (snapshot_value.py the value, snapshot.py: a prefilled cache to
continue, fork, resize, save and load), a slot engine (engine.py: queued requests joining and leaving one compiled
decode step) with an automatic prefix cache (prefix_cache.py the trie, budget and eviction; prefix_prefill.py the
snapshots it keeps; prefix_blocks.py an A layer's keys and values kept once, a block per entry) and speculative
decoding with a draft model (speculative_round.py: one round for every slot, greedy or speculative sampling;
speculative.py: verify with rollback, and `speculative_generate`, a one-slot engine), recurrent states quantized at
rest (quantized_state.py), and what these and `retention.generate` share: prompts (prompts.py), the sampler and its
settings (sampling.py) and the caches' limits read from the mixer registry (cache_limits.py). `generate` builds on
this package, which imports neither it nor the trainer. The names load on first use (PEP 562), as in the package
face."""

import importlib

_HOMES = {
    "retention.serve.engine": ("Engine",),
    "retention.serve.prefix_cache": ("PrefixCache", "PrefixCacheStats"),
    "retention.serve.quantized_state": (
        "QuantizedArray",
        "dequantize_states",
        "quantize_caches",
        "quantize_states",
        "round_trip_states",
    ),
    "retention.serve.speculative": ("speculative_generate", "verify"),
    "retention.serve.speculative_round": ("SpeculationStats",),
    "retention.serve.snapshot_value": ("Snapshot",),
    "retention.serve.snapshot": (
        "extend",
        "fork",
        "load_snapshot",
        "prefill",
        "resize",
        "save_snapshot",
        "snapshot_bytes",
    ),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}
__all__ = sorted(_HOME_OF)


def __getattr__(name: str):
    """A public name, imported from its home module on first use (and cached in this module)."""
    if name not in _HOME_OF:
        raise AttributeError(f"module 'retention.serve' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME_OF[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

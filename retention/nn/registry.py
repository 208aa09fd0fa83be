"""The mixer registry: one line per layer letter. The LM builds each layer from it, and the sizing
(sizing.py), the cache accounting, the comparison and the docs read their formulas from it, so a new mixer is an
op folder under retention/ops/, a mixer module here that defines its class (a `Mixer`, mixer_interface.py) and its
MixerKind, and one line below."""

from retention.nn.attention import FULL_ATTENTION, SLIDING_WINDOW
from retention.nn.gated_deltanet import GATED_DELTANET
from retention.nn.gla import GLA
from retention.nn.mamba2 import MAMBA2
from retention.nn.mixer_kind import MixerKind
from retention.nn.power_retention import POWER_RETENTION

MIXERS: dict[str, MixerKind] = {
    "P": POWER_RETENTION,
    "A": FULL_ATTENTION,
    "W": SLIDING_WINDOW,
    "D": GATED_DELTANET,
    "G": GLA,
    "M": MAMBA2,
}
"""The mixer registry, layer letter -> MixerKind: P power retention, A full attention, W sliding-window attention,
D Gated DeltaNet, G GLA, M Mamba2."""

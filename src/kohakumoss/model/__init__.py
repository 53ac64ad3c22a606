"""The MOSS-Image backbone: config and presets, packed sequence layout, blocks, reference, checkpoint io."""

from .backbone import MossBackbone, linear_rows, pack_references
from .config import MossConfig
from .presets import PRESETS, get_preset
from .seq import PackedSeq

__all__ = [
    "PRESETS",
    "MossBackbone",
    "MossConfig",
    "PackedSeq",
    "get_preset",
    "linear_rows",
    "pack_references",
]

"""The MOSS-Image backbone: config and presets, packed sequence layout, blocks, reference, checkpoint io."""

from .backbone import MossBackbone
from .config import MossConfig
from .presets import PRESETS, get_preset
from .seq import PackedSeq

__all__ = ["PRESETS", "MossBackbone", "MossConfig", "PackedSeq", "get_preset"]

"""Checkpoint key layouts, one small module each: hf (the released names, MossBackbone's own) and comfy
(ComfyUI: q, k, v fused, optional prefix).

`LAYOUTS` maps a name to its KeyLayout; "native" is another name for "hf" (the model's names are the
released ones), kept for configs and callers that say native.
"""

from .base import KeyLayout
from .comfy import LAYOUT as COMFY
from .hf import LAYOUT as HF

LAYOUTS: dict[str, KeyLayout] = {"hf": HF, "native": HF, "comfy": COMFY}
DETECTION_ORDER: tuple[KeyLayout, ...] = (HF, COMFY)

__all__ = ["DETECTION_ORDER", "LAYOUTS", "KeyLayout"]

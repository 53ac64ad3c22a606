"""Checkpoint key layouts, one small module each: native, hf (diffusers-style), comfy (ComfyUI, fused qkv).

Fixing a key name later is a one-file change. `LAYOUTS` maps a name to its KeyLayout.
"""

from .base import KeyLayout
from .comfy import LAYOUT as COMFY
from .hf import LAYOUT as HF
from .native import LAYOUT as NATIVE

LAYOUTS: dict[str, KeyLayout] = {layout.name: layout for layout in (NATIVE, HF, COMFY)}

__all__ = ["LAYOUTS", "KeyLayout"]

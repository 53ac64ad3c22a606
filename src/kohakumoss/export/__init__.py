"""Exports: LyCORIS file, ComfyUI-format adapter (fused qkv), merged and diffusers-layout transformers."""

from .bundle import export_all, save_comfy_adapter
from .comfy_keys import COMFY_PREFIX, comfy_module, fused_slot
from .comfy_lora import ComfyAdapter, to_comfy_adapter
from .merged import save_merged

__all__ = [
    "COMFY_PREFIX",
    "ComfyAdapter",
    "comfy_module",
    "export_all",
    "fused_slot",
    "save_comfy_adapter",
    "save_merged",
    "to_comfy_adapter",
]

"""Exports: LyCORIS file, ComfyUI-format adapter (fused qkv), merged and HF-layout transformers."""

from .bundle import export_all, save_comfy_adapter
from .comfy_keys import COMFY_PREFIX, comfy_module, fuse_qkv, fused_slot, split_qkv
from .comfy_lora import ComfyAdapter, to_comfy_adapter
from .merged import hf_config_json, save_merged, save_state

__all__ = [
    "COMFY_PREFIX",
    "ComfyAdapter",
    "comfy_module",
    "export_all",
    "fuse_qkv",
    "fused_slot",
    "hf_config_json",
    "save_comfy_adapter",
    "save_merged",
    "save_state",
    "split_qkv",
    "to_comfy_adapter",
]

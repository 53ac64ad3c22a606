"""The ComfyUI (Comfy-Org/MOSS-Image) DiT layout, as the exporters need it: the released module names,
with each block's q, k and v fused into one `layers.N.proj.qkv` (rows q; k; v). Keys of ComfyUI-format
adapters carry the `diffusion_model.` prefix ComfyUI's generic LoRA key map expects.

Module-level names here (adapter exports, and merging a ComfyUI-format adapter onto a native model); the
weights' fusing itself is `model/layouts/comfy.py`'s (`fuse_qkv` / `split_qkv` call it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from kohakumoss.model.layouts import LAYOUTS

COMFY_PREFIX = "diffusion_model."
QKV = ("q", "k", "v")  # fused row order
COMFY = LAYOUTS["comfy"]
_MEMBER = re.compile(r"^(?P<block>layers\.\d+\.proj)\.(?P<part>q|k|v)$")
_FUSED = re.compile(r"^(?P<block>layers\.\d+\.proj)\.qkv$")


@dataclass(frozen=True)
class FusedSlot:
    target: str  # comfy module name of the fused matrix, e.g. layers.0.proj.qkv
    members: tuple[str, ...]  # native module names, in fused (row) order
    index: int  # this module's position among the members


def fused_slot(native_module: str) -> FusedSlot | None:
    """Where a native module sits in a ComfyUI fused weight (None when it is stored on its own)."""
    m = _MEMBER.match(native_module)
    if m is None:
        return None
    block = m.group("block")
    return FusedSlot(f"{block}.qkv", tuple(f"{block}.{p}" for p in QKV), QKV.index(m.group("part")))


def fused_members(comfy_module: str) -> tuple[str, ...] | None:
    """The native modules behind a ComfyUI fused module (`layers.N.proj.qkv`), else None."""
    m = _FUSED.match(comfy_module)
    return tuple(f"{m.group('block')}.{p}" for p in QKV) if m else None


def comfy_module(native_module: str) -> str:
    """ComfyUI module name of a native module: the fused qkv for q, k, v; the same name otherwise."""
    slot = fused_slot(native_module)
    return slot.target if slot is not None else native_module


def fuse_qkv(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A native state dict (or part of one) in the ComfyUI layout: every complete q, k, v triple of
    weights joined along the rows, the rest unchanged (the comfy checkpoint layout's own fusing)."""
    return COMFY.from_native(state)


def split_qkv(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of `fuse_qkv`: fused q, k, v weights split into equal row thirds under native keys."""
    return dict(COMFY.to_native(state.items()))

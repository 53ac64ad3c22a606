"""Native module names -> ComfyUI module names, including ComfyUI's fused q/k/v groups.

Both come from the comfy key layout (`model/layouts/comfy.py`): its renames for single modules and its
fused rules ((q_proj, k_proj, v_proj) -> attention.qkv) for groups.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kohakumoss.model.layouts import LAYOUTS

COMFY = LAYOUTS["comfy"]
COMFY_PREFIX = "diffusion_model."


@dataclass(frozen=True)
class FusedSlot:
    target: str  # comfy module name of the fused matrix, e.g. layers.0.attention.qkv
    members: tuple[str, ...]  # native module names, in fused (row) order
    index: int  # this module's position among the members


def _template_regex(template: str) -> re.Pattern:
    return re.compile("^" + re.escape(template).replace(r"\{i\}", r"(?P<i>\d+)") + "$")


def fused_slot(native_module: str) -> FusedSlot | None:
    """Where a native module sits in a ComfyUI fused weight (None when it is stored on its own)."""
    key = f"{native_module}.weight"
    for parts, target in COMFY.fused:
        if not target.endswith(".weight"):
            continue
        for index, part in enumerate(parts):
            m = _template_regex(part).match(key)
            if m:
                i = m.groupdict().get("i") or ""
                members = tuple(p.replace("{i}", i)[: -len(".weight")] for p in parts)
                return FusedSlot(target.replace("{i}", i)[: -len(".weight")], members, index)
    return None


def comfy_module(native_module: str) -> str:
    """ComfyUI module name of a native module that is stored on its own."""
    return COMFY.key_from_native(f"{native_module}.weight")[: -len(".weight")]

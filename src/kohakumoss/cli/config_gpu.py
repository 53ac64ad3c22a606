"""Which GPU the config is for: the card present (`auto`), a named card, a layer name, or a size in GB."""

from __future__ import annotations

import re
from dataclasses import dataclass

from kohakumoss_common.errors import ConfigError

from .config_layers import CARDS, GPU_SIZES, gpu_layer_name

GIB = 1 << 30


@dataclass(frozen=True)
class GpuChoice:
    layer: str  # "vram_24g"
    card_gb: float  # the card's memory (what `check` compares the estimate with)
    description: str  # "NVIDIA GeForce RTX 4090 (23.6 GiB)", "rtx4090 (24 GB, from the card table)"
    message: str = ""  # said to the user, e.g. when no GPU was found


def detect_gpu() -> tuple[str, float] | None:
    """(name, GiB) of the first CUDA or XPU device, or None."""
    try:
        from kohakumoss_common.device import device_info

        info = device_info()
    except Exception:  # a broken driver is the doctor's business, not the config tool's
        return None
    if info.kind == "cpu" or not info.total_memory:
        return None
    return info.name, info.total_memory / GIB


def _card_key(name: str) -> str:
    key = name.lower().replace("nvidia", "").replace("geforce", "").replace("intel", "")
    return re.sub(r"[\s_]+", "", key)


def resolve_gpu(spec: str | float | int = "auto") -> GpuChoice:
    """`auto` (the card present, else the smallest layer), a card name, `vram_<N>g`, or a size in GB."""
    text = str(spec).strip().lower()
    if text in ("", "auto"):
        found = detect_gpu()
        if found is None:
            gb = GPU_SIZES[0]
            return GpuChoice(
                gpu_layer_name(gb),
                gb,
                "no GPU found",
                f"no GPU found: using the smallest layer (vram_{gb}g); pass --gpu NAME or --gpu <GB> to choose",
            )
        name, gb = found
        return GpuChoice(gpu_layer_name(gb), round(gb, 1), f"{name} ({gb:.1f} GiB)")
    if m := re.fullmatch(r"vram_(\d+)g", text):
        gb = int(m.group(1))
        if gb not in GPU_SIZES:
            raise ConfigError("gpu", f"no layer {text!r}; known: {[f'vram_{s}g' for s in GPU_SIZES]}")
        return GpuChoice(text, gb, f"{text} layer")
    if m := re.fullmatch(r"(\d+(?:\.\d+)?)\s*(?:g|gb|gib)?", text):
        gb = float(m.group(1))
        return GpuChoice(gpu_layer_name(gb), gb, f"{gb:g} GB card")
    key = _card_key(text)
    if key in CARDS:
        gb = CARDS[key]
        return GpuChoice(gpu_layer_name(gb), gb, f"{text} ({gb} GB, from the card table)")
    import difflib

    close = difflib.get_close_matches(key, list(CARDS), n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    raise ConfigError(
        "gpu", f"unknown card {spec!r}{hint}; give 'auto', a card name, vram_<N>g or a size in GB"
    )

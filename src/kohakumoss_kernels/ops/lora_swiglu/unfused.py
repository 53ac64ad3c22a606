"""The unfused form of lora_swiglu (what the MLP runs without the op): lora_linear's cuBLAS form, then SwiGLU
(Triton's kernel on a GPU where it imports, else the reference). Shared by the addmm backends."""

from __future__ import annotations

import torch

from ..lora_linear.addmm import lora_linear
from ..swiglu.eager import swiglu as swiglu_reference


def _swiglu(h: torch.Tensor) -> torch.Tensor:
    if h.device.type in ("cuda", "xpu"):
        try:
            from ..swiglu.triton import swiglu
        except ImportError:  # no Triton here: the reference
            return swiglu_reference(h)
        return swiglu(h)
    return swiglu_reference(h)


def lora_then_swiglu(x, weight, bias, down, up, scale: float, lora_first: bool) -> torch.Tensor:
    return _swiglu(lora_linear(x, weight, bias, down, up, scale, lora_first=lora_first))

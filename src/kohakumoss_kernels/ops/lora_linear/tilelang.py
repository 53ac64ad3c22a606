"""lora_linear through lycoris-lora's fused TileLang LoRA bypass (the sm70/sm75 path)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from lycoris.kernels.autograd.locon import locon_bypass_diff

from ...backends.tilelang_utils import supports as _tilelang_supports

BACKEND = "tilelang"


def supports(arch: str, dtype: torch.dtype) -> bool:
    return _tilelang_supports(arch, dtype)


def lora_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    down: torch.Tensor,
    up: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    down, up = down.to(x.dtype), up.to(x.dtype)  # the kernels take one dtype
    return locon_bypass_diff(x, down, up, float(scale), backend=BACKEND, base=F.linear(x, weight, bias))

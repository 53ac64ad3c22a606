"""y = x W^T + b + scale * (x down^T) up^T: a frozen linear with a LoRA bypass."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def lora_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    down: torch.Tensor,
    up: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """x [..., I]; weight [O, I]; bias [O] or None; down [r, I]; up [O, r] (any float dtype: computed in x's)."""
    return F.linear(x, weight, bias) + scale * F.linear(F.linear(x, down.to(x.dtype)), up.to(x.dtype))


def lora_linear_dequantized(x: torch.Tensor, weight, bias, down, up, scale: float) -> torch.Tensor:
    """The reference for a stored (fp8 / int8 / MXFP8) weight: `lora_linear` over it dequantized to x's dtype."""
    return lora_linear(x, weight.dequant(x.dtype), bias, down, up, scale)

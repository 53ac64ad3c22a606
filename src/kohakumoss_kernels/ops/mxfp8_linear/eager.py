"""The reference: x W^T + b over the weight dequantized to x's dtype (no activation quantization)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...mxfp8 import Mxfp8Weight


def mxfp8_linear(x: torch.Tensor, weight: Mxfp8Weight, bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., I]; weight [O, I] e4m3 with e8m0 scales per 32 inputs; bias [O] or None."""
    return F.linear(x, weight.dequant(x.dtype), bias)

"""The reference: x W^T + b over the weight dequantized (un-rotated where ConvRot) to x's dtype."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...int8 import Int8Weight


def int8_linear(x: torch.Tensor, weight: Int8Weight, bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., I]; weight [O, I] int8 with row scales; bias [O] or None."""
    return F.linear(x, weight.dequant(x.dtype), bias)

"""The reference: x W^T + b over the weight dequantized (un-rotated where ConvRot) to x's dtype."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...weights.stored_weight import StoredWeight


def stored_linear(
    x: torch.Tensor, weight: torch.Tensor | StoredWeight, bias: torch.Tensor | None
) -> torch.Tensor:
    """x [..., I]; weight [O, I]: an Fp8Weight, Int8Weight or Mxfp8Weight (or a tensor); bias [O] or None."""
    if isinstance(weight, StoredWeight):
        weight = weight.dequant(x.dtype)
    return F.linear(x, weight, bias)

"""y = x W^T + b + scale * (x down^T) up^T: a frozen linear with a LoRA bypass."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...weights.stored_weight import StoredWeight


def lora_linear(
    x: torch.Tensor,
    weight: torch.Tensor | StoredWeight,
    bias: torch.Tensor | None,
    down: torch.Tensor,
    up: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """x [..., I]; weight [O, I], or a stored (fp8 / int8 / MXFP8) one, dequantized to x's dtype; bias [O]
    or None; down [r, I]; up [O, r] (any float dtype: computed in x's)."""
    if isinstance(weight, StoredWeight):
        weight = weight.dequant(x.dtype)
    return F.linear(x, weight, bias) + scale * F.linear(F.linear(x, down.to(x.dtype)), up.to(x.dtype))

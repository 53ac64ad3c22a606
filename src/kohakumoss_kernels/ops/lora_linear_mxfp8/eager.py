"""The reference: ../lora_linear/eager.py over the weight dequantized to x's dtype."""

from __future__ import annotations

import torch

from ...mxfp8 import Mxfp8Weight
from ..lora_linear.eager import lora_linear as _lora_linear


def lora_linear_mxfp8(
    x: torch.Tensor,
    weight: Mxfp8Weight,
    bias: torch.Tensor | None,
    down: torch.Tensor,
    up: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    return _lora_linear(x, weight.dequant(x.dtype), bias, down, up, scale)

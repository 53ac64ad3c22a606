"""The reference: ../lora_linear/eager.py over the weight dequantized to x's dtype (no activation quantization)."""

from __future__ import annotations

import torch

from ...fp8 import Fp8Weight
from ..lora_linear.eager import lora_linear as _lora_linear


def lora_linear_fp8(
    x: torch.Tensor,
    weight: Fp8Weight,
    bias: torch.Tensor | None,
    down: torch.Tensor,
    up: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    return _lora_linear(x, weight.dequant(x.dtype), bias, down, up, scale)

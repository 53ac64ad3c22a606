"""lora_linear with the LoRA term written first and the frozen GEMM accumulating onto it (see addmm.py)."""

from __future__ import annotations

import torch

from .addmm import lora_linear as _lora_linear


def lora_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    down: torch.Tensor,
    up: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    return _lora_linear(x, weight, bias, down, up, scale, lora_first=True)

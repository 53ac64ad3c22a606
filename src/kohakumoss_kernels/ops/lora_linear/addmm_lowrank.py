"""lora_linear as addmm.py, with the rank-r products (x down^T, gy up, and the two weight gradients) in
Triton kernels that fill the GPU where cuBLAS's 32-wide tiles do not (lowrank.py); the big GEMMs stay cuBLAS."""

from __future__ import annotations

import torch

from .addmm import lora_linear as _lora_linear
from .lowrank import supports as supports  # noqa: F401 -- Triton must import, and run on this arch


def lora_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    down: torch.Tensor,
    up: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    return _lora_linear(x, weight, bias, down, up, scale, lowrank=True)

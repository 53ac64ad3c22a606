"""int8_linear as an int8 GEMM (`torch._int_mm`, int32 accumulation) where the weight computes; its
weight-only form (rotated x times the per-call dequantized rows) otherwise (`kohakumoss_kernels.int8`)."""

from __future__ import annotations

import torch

from ... import int8


def supports(arch: str, dtype: torch.dtype) -> bool:
    """cuBLASLt's int8 GEMM behind torch._int_mm: sm80+ (and the CPU's, when named)."""
    if arch == "cpu":
        return True
    return arch.startswith("sm") and arch[2:].isdigit() and int(arch[2:]) >= 80


def int8_linear(x: torch.Tensor, weight: int8.Int8Weight, bias: torch.Tensor | None) -> torch.Tensor:
    return int8.frozen_linear(x, weight, bias)

"""stored_linear over an int8 weight as an int8 GEMM (`torch._int_mm`, int32 accumulation, x rotated
and quantized per row on the fly) where the weight computes and the shapes fit; its weight-only form
otherwise. The input gradient over the per-call dequantized rows (`kohakumoss_kernels.weights.int8`)."""

from __future__ import annotations

import torch

from kohakumoss_common.device import sm_at_least

from ...weights import int8

WEIGHTS = ("int8",)


def supports(arch: str, dtype: torch.dtype) -> bool:
    """cuBLASLt's int8 GEMM behind torch._int_mm: sm80+ (and the CPU's, when named)."""
    if arch == "cpu":
        return True
    return sm_at_least(arch, 80)


def stored_linear(x: torch.Tensor, weight: int8.Int8Weight, bias: torch.Tensor | None) -> torch.Tensor:
    return int8.frozen_linear(x, weight, bias)

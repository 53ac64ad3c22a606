"""stored_linear over an MXFP8 weight as one block-scaled fp8 GEMM (`torch._scaled_mm` with e8m0 scales
per 32 inputs in cuBLAS's tile layout), x quantized to MXFP8 per call; the input gradient over the
dequantized weight (`kohakumoss_kernels.weights.mxfp8`). Blackwell only: on other cards it is not bound."""

from __future__ import annotations

import torch

from kohakumoss_common.device import sm_at_least

from ...weights import mxfp8

WEIGHTS = ("mxfp8",)


def supports(arch: str, dtype: torch.dtype) -> bool:
    """Block-scaled fp8 tensor cores: sm100+ (Blackwell); not Hopper, not the CPU."""
    return sm_at_least(arch, 100)


def stored_linear(x: torch.Tensor, weight: mxfp8.Mxfp8Weight, bias: torch.Tensor | None) -> torch.Tensor:
    return mxfp8.frozen_linear(x, weight, bias)

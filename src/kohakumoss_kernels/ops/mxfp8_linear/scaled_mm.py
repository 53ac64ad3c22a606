"""mxfp8_linear as one block-scaled fp8 GEMM (`torch._scaled_mm` with e8m0 scales per 32 inputs), x
quantized to MXFP8 per call; the input gradient over the dequantized weight (`kohakumoss_kernels.mxfp8`)."""

from __future__ import annotations

import torch

from ... import mxfp8


def supports(arch: str, dtype: torch.dtype) -> bool:
    """Block-scaled fp8 tensor cores: sm100+ (Blackwell); not Hopper, not the CPU."""
    return arch.startswith("sm") and arch[2:].isdigit() and int(arch[2:]) >= 100


def mxfp8_linear(x: torch.Tensor, weight: mxfp8.Mxfp8Weight, bias: torch.Tensor | None) -> torch.Tensor:
    return mxfp8.frozen_linear(x, weight, bias)

"""stored_linear over an fp8 weight as fp8 GEMMs with row-wise scales (`torch._scaled_mm`) where the
weight computes: x forward and gy backward quantized per row on the fly, the weight's row scales on the
output columns / folded into gy's columns (`kohakumoss_kernels.weights.fp8`); its weight-only form otherwise."""

from __future__ import annotations

import torch

from kohakumoss_common.device import sm_at_least

from ...weights import fp8

WEIGHTS = ("fp8",)


def supports(arch: str, dtype: torch.dtype) -> bool:
    """Row-scaled fp8 tensor cores: sm89+ (Ada, Hopper, Blackwell), and the CPU's _scaled_mm when named."""
    if arch == "cpu":
        return True
    return sm_at_least(arch, 89)


def stored_linear(x: torch.Tensor, weight: fp8.Fp8Weight, bias: torch.Tensor | None) -> torch.Tensor:
    return fp8.frozen_linear(x, weight, bias)

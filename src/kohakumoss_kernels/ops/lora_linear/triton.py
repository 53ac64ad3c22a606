"""lora_linear through lycoris-lora's fused Triton LoRA bypass: base output + scale * up(down(x)),
the add folded into the kernel's store; forward and backward are lycoris's own kernels."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from lycoris.kernels.autograd.locon import locon_bypass_diff

from ...backends.triton_utils import supports as _triton_supports

BACKEND = "triton"


def supports(arch: str, dtype: torch.dtype) -> bool:
    return _triton_supports(arch, dtype) and dtype != torch.float32


def lora_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    down: torch.Tensor,
    up: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    down, up = down.to(x.dtype), up.to(x.dtype)  # the kernels take one dtype
    return locon_bypass_diff(x, down, up, float(scale), backend=BACKEND, base=F.linear(x, weight, bias))

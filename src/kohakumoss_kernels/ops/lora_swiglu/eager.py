"""swiglu(x W^T + b + scale * (x down^T) up^T): the MLP's gate/up projection with a LoRA bypass, then SwiGLU."""

from __future__ import annotations

import torch

from ..lora_linear.eager import lora_linear
from ..swiglu.eager import swiglu


def lora_swiglu(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    down: torch.Tensor,
    up: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """x [..., I]; weight [2H, I] (gate rows, then up rows); bias [2H] or None; down [r, I]; up [2H, r]."""
    return swiglu(lora_linear(x, weight, bias, down, up, scale))

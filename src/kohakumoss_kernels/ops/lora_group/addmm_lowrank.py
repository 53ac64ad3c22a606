"""lora_group as addmm.py, with the rank-r products in Triton kernels (../lora_linear/lowrank.py)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..lora_linear.lowrank import supports as supports  # noqa: F401 -- Triton must import and run here
from .addmm import lora_group as _lora_group


def lora_group(
    x: torch.Tensor,
    weights: Sequence[torch.Tensor],
    biases: Sequence[torch.Tensor | None],
    downs: Sequence[torch.Tensor],
    ups: Sequence[torch.Tensor],
    scales: Sequence[float],
) -> tuple[torch.Tensor, ...]:
    return _lora_group(x, weights, biases, downs, ups, scales, lowrank=True)

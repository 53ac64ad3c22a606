"""Linears with LoRA bypasses that share one input: each output is ../lora_linear/eager.py's."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..lora_linear.eager import lora_linear


def lora_group(
    x: torch.Tensor,
    weights: Sequence[torch.Tensor],
    biases: Sequence[torch.Tensor | None],
    downs: Sequence[torch.Tensor],
    ups: Sequence[torch.Tensor],
    scales: Sequence[float],
) -> tuple[torch.Tensor, ...]:
    """x [..., I]; per member: weight [O_i, I] (or a stored one, dequantized), bias [O_i] or None,
    down [r_i, I], up [O_i, r_i]."""
    members = zip(weights, biases, downs, ups, scales, strict=True)
    return tuple(lora_linear(x, w, b, d, u, s) for w, b, d, u, s in members)

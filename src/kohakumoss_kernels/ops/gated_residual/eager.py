"""Gated residual add: x + gate * y, with the per-sample gate gathered per token."""

from __future__ import annotations

import torch


def gated_residual(
    x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor, token_sample: torch.Tensor
) -> torch.Tensor:
    """x, y [T, d]; gate [B, d]; token_sample [T] long."""
    return (x.float() + gate.float()[token_sample] * y.float()).to(x.dtype)

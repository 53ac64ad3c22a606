"""r = x + gate * y; h = rms_norm(r) * (1 + scale) + shift; returns (r, h). One pass instead of two."""

from __future__ import annotations

import torch

from ..gated_residual.eager import gated_residual
from ..norm_modulate.eager import norm_modulate


def residual_norm_modulate(
    x: torch.Tensor,
    y: torch.Tensor,
    gate: torch.Tensor,
    shift: torch.Tensor,
    scale: torch.Tensor,
    token_sample: torch.Tensor,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x, y [T, d]; gate, shift, scale [B, d]; token_sample [T] long. Returns (residual, modulated)."""
    r = gated_residual(x, y, gate, token_sample)
    return r, norm_modulate(r, shift, scale, token_sample, eps)

"""residual_norm_modulate as the one-hot forms of its two halves (../../per_token.py)."""

from __future__ import annotations

import torch

from ..gated_residual.onehot import gated_residual
from ..norm_modulate.onehot import norm_modulate


def residual_norm_modulate(
    x: torch.Tensor,
    y: torch.Tensor,
    gate: torch.Tensor,
    shift: torch.Tensor,
    scale: torch.Tensor,
    token_sample: torch.Tensor,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    r = gated_residual(x, y, gate, token_sample)
    return r, norm_modulate(r, shift, scale, token_sample, eps)

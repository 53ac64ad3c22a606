"""residual_norm_modulate with the per-sample parameters spread as one-hot matmuls (../../per_token.py)."""

from __future__ import annotations

import torch

from ...per_token import one_hot, per_token
from ..rms_norm.eager import rms_norm


def residual_norm_modulate(
    x: torch.Tensor,
    y: torch.Tensor,
    gate: torch.Tensor,
    shift: torch.Tensor,
    scale: torch.Tensor,
    token_sample: torch.Tensor,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    hot = one_hot(token_sample, gate.shape[0])
    r = (x.float() + per_token(gate, hot) * y.float()).to(x.dtype)
    normed = rms_norm(r, None, eps).float()
    return r, (normed * (1.0 + per_token(scale, hot)) + per_token(shift, hot)).to(x.dtype)

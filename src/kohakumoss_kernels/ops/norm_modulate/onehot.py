"""norm_modulate with the per-sample shift and scale spread as a one-hot matmul (../../per_token.py)."""

from __future__ import annotations

import torch

from ...backends.per_token import one_hot, per_token
from ..rms_norm.eager import rms_norm


def norm_modulate(
    x: torch.Tensor,
    shift: torch.Tensor,
    scale: torch.Tensor,
    token_sample: torch.Tensor,
    eps: float = 1e-6,
    fork: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    hot = one_hot(token_sample, shift.shape[0])
    normed = rms_norm(x, None, eps).float()
    out = (normed * (1.0 + per_token(scale, hot)) + per_token(shift, hot)).to(x.dtype)
    return (out, x) if fork else out

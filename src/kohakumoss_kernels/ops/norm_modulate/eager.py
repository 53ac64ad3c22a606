"""AdaLN input: rms_norm(x) * (1 + scale) + shift, with per-sample scale/shift gathered per token."""

from __future__ import annotations

import torch

from ..rms_norm.eager import rms_norm


def norm_modulate(
    x: torch.Tensor,
    shift: torch.Tensor,
    scale: torch.Tensor,
    token_sample: torch.Tensor,
    eps: float = 1e-6,
    fork: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """x [T, d]; shift, scale [B, d]; token_sample [T] long: the sample each token belongs to.
    fork: also return x, for its other use (a residual): a fused backward adds that use's gradient in its
    own pass instead of autograd adding two [T, d] gradients."""
    normed = rms_norm(x, None, eps).float()
    out = (normed * (1.0 + scale.float()[token_sample]) + shift.float()[token_sample]).to(x.dtype)
    return (out, x) if fork else out

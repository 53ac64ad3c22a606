"""QK-norm then RoPE: apply_rope(rms_norm(x, weight), cos, sin) per head."""

from __future__ import annotations

import torch

from ..rms_norm.eager import rms_norm
from ..rope.eager import apply_rope


def qk_norm_rope(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float = 1e-6,
) -> torch.Tensor:
    """x [T, H, D]; weight [D] or None; cos, sin [T, D/2] float32."""
    return apply_rope(rms_norm(x, weight, eps), cos, sin)

"""Rotary embedding then varlen attention: the reference for kernels that rotate q, k in their prologue."""

from __future__ import annotations

import torch

from ..rope.eager import apply_rope
from ..varlen_attention.eager import varlen_attention


def varlen_attention_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    cos: torch.Tensor,
    sin: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """q, k, v [T, H, D]; cu_seqlens [B + 1] int32; cos, sin [T, D/2] float32 (half-split pairs)."""
    return varlen_attention(
        apply_rope(q, cos, sin), apply_rope(k, cos, sin), v, cu_seqlens, max_seqlen, scale
    )

"""Varlen attention through torch's own `torch.nn.attention.varlen.varlen_attn` (flash-attention varlen)."""

from __future__ import annotations

import torch
from torch.nn.attention.varlen import varlen_attn  # ImportError on older torch: the backend is skipped


def supports(arch: str, dtype: torch.dtype) -> bool:
    return arch.startswith("sm") and dtype in (torch.float16, torch.bfloat16)


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    scale: float | None = None,
) -> torch.Tensor:
    cu = cu_seqlens.to(torch.int32)
    if scale is None:
        return varlen_attn(q, k, v, cu, cu, max_seqlen, max_seqlen)
    return varlen_attn(q, k, v, cu, cu, max_seqlen, max_seqlen, scale=scale)


varlen_attention.device_lengths = True  # cu_seqlens read on the device: graph-safe across lengths

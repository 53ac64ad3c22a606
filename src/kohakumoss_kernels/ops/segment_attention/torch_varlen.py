"""Segment attention through torch's `varlen_attn` (flash-attention varlen), whose query and key segments
are given apart: the form it was made for."""

from __future__ import annotations

import torch
from torch.nn.attention.varlen import varlen_attn  # ImportError on older torch: the backend is skipped


def supports(arch: str, dtype: torch.dtype) -> bool:
    return arch.startswith("sm") and dtype in (torch.float16, torch.bfloat16)


def segment_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_kv: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_kv: int,
    scale: float | None = None,
) -> torch.Tensor:
    cu_q, cu_k = cu_seqlens_q.to(torch.int32), cu_seqlens_kv.to(torch.int32)
    if scale is None:
        return varlen_attn(q, k, v, cu_q, cu_k, max_seqlen_q, max_seqlen_kv)
    return varlen_attn(q, k, v, cu_q, cu_k, max_seqlen_q, max_seqlen_kv, scale=scale)


segment_attention.device_lengths = True  # cu_seqlens read on the device: graph-safe across lengths

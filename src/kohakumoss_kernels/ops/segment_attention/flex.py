"""Segment attention through FlexAttention (compiled): a block mask pairing query and key segments."""

from __future__ import annotations

import torch
from torch.nn.attention.flex_attention import create_block_mask

from ..varlen_attention.flex import _flex, document_ids


def supports(arch: str, dtype: torch.dtype) -> bool:
    return arch != "cpu" and dtype in (torch.float16, torch.bfloat16)


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
    Tq, Tk = q.shape[0], k.shape[0]
    q_doc, kv_doc = document_ids(cu_seqlens_q, Tq), document_ids(cu_seqlens_kv, Tk)

    def same_segment(b, h, q_idx, kv_idx):
        return q_doc[q_idx] == kv_doc[kv_idx]

    mask = create_block_mask(same_segment, None, None, Tq, Tk, device=q.device)
    qs, ks, vs = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
    out = _flex()(qs, ks, vs, block_mask=mask, scale=scale)
    return out.squeeze(0).transpose(0, 1)

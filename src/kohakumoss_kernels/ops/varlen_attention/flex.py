"""Varlen attention through FlexAttention (compiled) with a document mask over the packed tokens."""

from __future__ import annotations

import functools

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention


def supports(arch: str, dtype: torch.dtype) -> bool:
    return arch != "cpu" and dtype in (torch.float16, torch.bfloat16)


@functools.cache
def _flex():
    return torch.compile(flex_attention, dynamic=False)


def document_ids(cu_seqlens: torch.Tensor, T: int) -> torch.Tensor:
    """The sample index of every token, computed on the device (no host copy)."""
    tokens = torch.arange(T, device=cu_seqlens.device, dtype=cu_seqlens.dtype)
    return torch.searchsorted(cu_seqlens[1:].contiguous(), tokens, right=True)


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    scale: float | None = None,
) -> torch.Tensor:
    T = q.shape[0]
    doc = document_ids(cu_seqlens, T)

    def same_document(b, h, q_idx, kv_idx):
        return doc[q_idx] == doc[kv_idx]

    mask = create_block_mask(same_document, None, None, T, T, device=q.device)
    qs, ks, vs = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
    out = _flex()(qs, ks, vs, block_mask=mask, scale=scale)
    return out.squeeze(0).transpose(0, 1)

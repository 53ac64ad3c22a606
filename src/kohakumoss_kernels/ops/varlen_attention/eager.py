"""Attention within each packed sample: a loop of dense attentions, one per cu_seqlens segment."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...runtime.host_values import host_values


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    scale: float | None = None,
) -> torch.Tensor:
    """q, k, v [T, H, D]; cu_seqlens [B + 1] int32 sample boundaries. Returns [T, H, D]."""
    del max_seqlen  # the loop needs no bound; kernels use it to size their grid
    bounds = host_values(cu_seqlens)
    outs = []
    for start, end in zip(bounds[:-1], bounds[1:]):
        if end == start:
            continue
        qs, ks, vs = (t[start:end].transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        o = F.scaled_dot_product_attention(qs, ks, vs, scale=scale)
        outs.append(o.squeeze(0).transpose(0, 1))
    return torch.cat(outs, dim=0)

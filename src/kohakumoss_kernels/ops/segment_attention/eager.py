"""Attention of each query segment over its own key segment: a loop of dense attentions, one per pair.

The varlen form whose query and key segments differ (flash-attention's cu_seqlens_q / cu_seqlens_k): the
model's reference attention (`model/seq.py`) pairs each sample's target and text queries with all of its
keys, and its reference queries with its reference keys alone.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...runtime.host_values import host_values


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
    """q [Tq, H, D]; k, v [Tk, H, D]; cu_seqlens_q, cu_seqlens_kv [S + 1] int32. Returns [Tq, H, D]:
    the queries of segment i attend to the keys of segment i only."""
    del max_seqlen_q, max_seqlen_kv  # the loop needs no bound; kernels use them to size their grid
    q_bounds, kv_bounds = host_values(cu_seqlens_q), host_values(cu_seqlens_kv)
    if len(q_bounds) != len(kv_bounds):
        raise ValueError(f"{len(q_bounds) - 1} query segments but {len(kv_bounds) - 1} key segments")
    outs = []
    for qs, qe, ks, ke in zip(q_bounds[:-1], q_bounds[1:], kv_bounds[:-1], kv_bounds[1:]):
        if qe == qs:
            continue
        if ke == ks:
            raise ValueError(f"query segment [{qs}, {qe}) has no keys")
        qi = q[qs:qe].transpose(0, 1).unsqueeze(0)
        ki, vi = (t[ks:ke].transpose(0, 1).unsqueeze(0) for t in (k, v))
        o = F.scaled_dot_product_attention(qi, ki, vi, scale=scale)
        outs.append(o.squeeze(0).transpose(0, 1))
    return torch.cat(outs, dim=0) if outs else q.new_zeros(q.shape)

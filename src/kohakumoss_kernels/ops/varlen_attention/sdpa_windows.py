"""Varlen attention as one SDPA call over fixed windows, the lengths read on the device.

Each run of cu_seqlens is copied into a window of `max_seqlen` tokens (zeros after its end) and SDPA
attends over [runs, H, max_seqlen, D] with the keys past each run's end masked out (an additive bias), so
the shapes depend only on the bounds and one CUDA graph serves every mix of lengths. The window's padded
queries compute rows nobody reads. `tail` > 0 bounds the last run's length (the trainer's pad segment of
at most TEXT_PAD tokens): it gets a window of that size instead of a full one. SDPA chooses its kernel
(cuDNN first: the fastest on the H200 at this shape) among the fused ones that take a mask; when
neither takes it, the call raises and the registry drops the backend.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# the kernels that accept an additive mask, fastest first on the H200; flash takes none. Never the math
# kernel on a GPU: it would hold [runs, H, L, L] scores (3.4 GiB at 1 MP) where a fused kernel refused
_MASKED = [SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]


def supports(arch: str, dtype: torch.dtype) -> bool:
    return arch != "cpu"


def window_slots(cu_seqlens: torch.Tensor, tokens: int, window: int, tail: int) -> torch.Tensor:
    """[T] long: each token's row in the flat window buffer. Runs before the last (all of them when `tail`
    is 0) sit at run * window + position; with `tail` the last run follows them in a window of its own."""
    cu = cu_seqlens.long()
    token = torch.arange(tokens, device=cu.device)
    run = torch.searchsorted(cu[1:], token, right=True)
    pos = token - cu[run]
    full = cu.numel() - 1 - (1 if tail else 0)
    return torch.where(run < full, run * window + pos, full * window + pos)


def _masked_sdpa(q, k, v, lengths: torch.Tensor, scale: float | None) -> torch.Tensor:
    """q, k, v [n, L, H, D] windows, lengths [n]: attention over each window's first lengths[i] keys."""
    n, L, H, D = q.shape
    keys = torch.arange(L, device=q.device)
    # an empty run attends to its zero first key (output 0) rather than to nothing (NaN)
    valid = (keys < lengths[:, None]) | (keys == 0)
    bias = torch.zeros(n, 1, 1, L, device=q.device, dtype=q.dtype).masked_fill(
        ~valid[:, None, None, :], float("-inf")
    )
    kernels = _MASKED if q.device.type != "cpu" else [SDPBackend.MATH]
    with sdpa_kernel(kernels, set_priority=True):
        o = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=bias, scale=scale
        )
    return o.transpose(1, 2).reshape(n * L, H, D)


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    scale: float | None = None,
    tail: int = 0,
) -> torch.Tensor:
    T, H, D = q.shape
    runs = cu_seqlens.numel() - 1
    full = runs - (1 if tail else 0)
    window = int(max_seqlen)
    slots = window_slots(cu_seqlens, T, window, tail)
    rows = full * window + tail
    qw, kw, vw = (t.new_zeros(rows, H, D).index_copy(0, slots, t) for t in (q, k, v))
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    split = full * window
    outs = []
    if full:
        views = (t[:split].view(full, window, H, D) for t in (qw, kw, vw))
        outs.append(_masked_sdpa(*views, lengths[:full], scale))
    if tail:
        outs.append(
            _masked_sdpa(*(t[split:].view(1, tail, H, D) for t in (qw, kw, vw)), lengths[full:], scale)
        )
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)
    return out.index_select(0, slots)


varlen_attention.device_lengths = True  # cu_seqlens read on the device: graph-safe across lengths

"""Varlen attention as torch SDPA over runs of consecutive equal-length samples.

Each run of n samples of length L is a view [n, L, H, D] of the packed tensors (no copy), so SDPA's
flash / cuDNN kernels see a dense batch. When the planner packs equal lengths together (the
common case: one resolution bucket) this is one SDPA call. The bounds come from the host copy registered with cu_seqlens
(`host_values`); an unregistered cu_seqlens costs one device-to-host copy.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ...runtime.host_values import host_values


def supports(arch: str, dtype: torch.dtype) -> bool:
    return arch != "cpu"


def runs(cu_seqlens: torch.Tensor) -> list[tuple[int, int, int]]:
    """(start token, sample count, length) per run of consecutive equal-length, non-empty samples."""
    bounds = host_values(cu_seqlens)
    out: list[tuple[int, int, int]] = []
    for start, end in zip(bounds[:-1], bounds[1:]):
        length = end - start
        if length == 0:
            continue
        if out and out[-1][2] == length and out[-1][0] + out[-1][1] * length == start:
            out[-1] = (out[-1][0], out[-1][1] + 1, length)
        else:
            out.append((start, 1, length))
    return out


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    scale: float | None = None,
    sdpa_backends: tuple[SDPBackend, ...] | None = None,
) -> torch.Tensor:
    """sdpa_backends: SDPA's kernels to use, in this order of preference (None: torch's own order)."""
    T, H, D = q.shape
    groups = runs(cu_seqlens)
    sizes = [n * length for _, n, length in groups]
    # one run is the whole tensor: no slice at all; several: split, whose backward is one cat. A slice's
    # backward would zero a [T, H, D] gradient and copy into it, per run and per q, k, v.
    parts = [(t,) if len(groups) == 1 else t.split(sizes) for t in (q, k, v)]
    outs = []
    for (_, n, length), qs, ks, vs in zip(groups, *parts, strict=True):
        qs, ks, vs = (t.view(n, length, H, D).transpose(1, 2) for t in (qs, ks, vs))
        with (
            sdpa_kernel(list(sdpa_backends), set_priority=True) if sdpa_backends else contextlib.nullcontext()
        ):
            o = F.scaled_dot_product_attention(qs, ks, vs, scale=scale)
        outs.append(o.transpose(1, 2).reshape(n * length, H, D))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)

"""Parameter gradients from per-program partial sums, without atomics on hot rows.

`sum_rows` adds the partial rows [programs, d] of a weight gradient (RMSNorm, QK-norm) in one launch
that also casts to the weight's dtype.

Per-sample parameters (AdaLN shift / scale / gate):

A backward program walks a contiguous chunk of rows. It sums each parameter's gradient in registers
while consecutive rows belong to the same sample (a "segment"). The chunk's first segment goes to
partial slot 0 of the program and its last to slot 1 (`P [programs, 2, K, d]`, with the samples in
`FIRST` / `LAST [programs]`, -1 where unused); a segment between them is a whole sample in the
packed layout and goes to the output directly (an atomic add that meets no other program; only for
rows not grouped by sample can two programs meet there). `finish` then adds, per (sample, parameter,
column block), the partial slots whose sample matches: a small second pass over `P`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def flush(acc, P, D, pid, k, K: tl.constexpr, cur, seg, d, cols, cmask):
    """End of a segment of sample `cur`: the chunk's first segment to slot 0, later ones to D[cur, k]."""
    total = tl.sum(acc, axis=0)
    if seg == 0:
        tl.store(P + ((pid.to(tl.int64) * 2) * K + k) * d + cols, total, mask=cmask)
    else:
        tl.atomic_add(D + (cur * K + k) * d + cols, total, mask=cmask)


@triton.jit
def close(acc, P, pid, k, K: tl.constexpr, seg, d, cols, cmask):
    """End of the chunk: the open segment to slot 0 (the chunk had one segment) or slot 1."""
    slot = tl.where(seg == 0, 0, 1).to(tl.int64)
    tl.store(P + ((pid.to(tl.int64) * 2 + slot) * K + k) * d + cols, tl.sum(acc, axis=0), mask=cmask)


@triton.jit
def mark(FIRST, LAST, pid, n, first, cur, seg):
    """Which samples the program's partial slots hold (-1: none)."""
    tl.store(FIRST + pid, tl.where(n > 0, first, -1))
    tl.store(LAST + pid, tl.where((n > 0) & (seg > 0), cur, -1))


@triton.jit
def _sum_rows(P, OUT, G, d, BLOCK_G: tl.constexpr, BLOCK_C: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < d
    acc = tl.zeros([BLOCK_G, BLOCK_C], dtype=tl.float32)
    for g0 in range(0, G, BLOCK_G):
        g = g0 + tl.arange(0, BLOCK_G)
        acc += tl.load(
            P + g.to(tl.int64)[:, None] * d + cols[None, :], mask=(g < G)[:, None] & cmask[None, :]
        )
    tl.store(OUT + cols, tl.sum(acc, axis=0).to(OUT.dtype.element_ty), mask=cmask)


def sum_rows(p: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """p [programs, d] fp32 -> its column sums [d] in `dtype`."""
    g, d = p.shape
    out = torch.empty(d, device=p.device, dtype=dtype)
    block_c = min(128, triton.next_power_of_2(d))
    _sum_rows[(triton.cdiv(d, block_c),)](p, out, g, d, BLOCK_G=32, BLOCK_C=block_c, num_warps=4)
    return out


@triton.jit
def _finish(P, FIRST, LAST, D, OUT, G, d, K: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_C: tl.constexpr):
    s = tl.program_id(0)
    k = tl.program_id(1)
    cols = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < d
    acc = tl.zeros([BLOCK_G, BLOCK_C], dtype=tl.float32)
    for g0 in range(0, G, BLOCK_G):
        g = g0 + tl.arange(0, BLOCK_G)
        gmask = g < G
        f = tl.load(FIRST + g, mask=gmask, other=-1)
        la = tl.load(LAST + g, mask=gmask, other=-1)
        base = (g.to(tl.int64)[:, None] * 2 * K + k) * d + cols[None, :]
        acc += tl.load(P + base, mask=(f == s)[:, None] & cmask[None, :], other=0.0)
        acc += tl.load(P + base + K * d, mask=(la == s)[:, None] & cmask[None, :], other=0.0)
    at = (s.to(tl.int64) * K + k) * d + cols
    total = tl.load(D + at, mask=cmask, other=0.0) + tl.sum(acc, axis=0)
    tl.store(OUT + at, total.to(OUT.dtype.element_ty), mask=cmask)


def buffers(programs: int, samples: int, k: int, d: int, device) -> tuple[torch.Tensor, ...]:
    """(P, FIRST, LAST, D): partial slots, their samples, and the zeroed fp32 output D [samples, k, d]."""
    p = torch.empty(programs, 2, k, d, device=device, dtype=torch.float32)
    first = torch.empty(programs, device=device, dtype=torch.int64)
    last = torch.empty(programs, device=device, dtype=torch.int64)
    return p, first, last, torch.zeros(samples, k, d, device=device, dtype=torch.float32)


def finish(
    p: torch.Tensor, first: torch.Tensor, last: torch.Tensor, acc: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """acc [samples, K, d] (the atomics' sums) plus every program's partial slots, by sample, in `dtype`."""
    samples, k, d = acc.shape
    out = torch.empty(acc.shape, device=acc.device, dtype=dtype)
    if samples and d:
        block_c = min(256, triton.next_power_of_2(d))
        _finish[(samples, k, triton.cdiv(d, block_c))](
            p, first, last, acc, out, p.shape[0], d, K=k, BLOCK_G=16, BLOCK_C=block_c, num_warps=4
        )
    return out

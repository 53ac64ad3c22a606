"""Triton kernels for the rank-r products of a LoRA linear: [M, K] x [K, r] and [M, N]^T x [M, r].

cuBLAS fills only ~M/128 thread blocks for a 32-wide output (68 at 8704 tokens on a 132-SM card), so these
memory-bound products run well below the copy bandwidth there. Here each program owns BM rows (or BN
columns and a slice of the rows, partial sums added by torch afterwards) and streams its inputs once.
r is padded to a power of two of at least 16 (tl.dot's minimum) by masking.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...triton_utils import next_pow2
from ...triton_utils import supports as supports


@triton.jit
def _lowrank_rows(A, B, C, M, K, R, sam, sak, sbk, sbr, BM: tl.constexpr, BK: tl.constexpr, BR: tl.constexpr):
    """C[M, R] = A[M, K] @ B[K, R] (fp32 accumulation, stored in C's dtype)."""
    rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
    cr = tl.arange(0, BR)
    rmask, crmask = rows < M, cr < R
    acc = tl.zeros((BM, BR), dtype=tl.float32)
    for k0 in range(0, K, BK):
        ks = k0 + tl.arange(0, BK)
        kmask = ks < K
        a = tl.load(
            A + rows[:, None] * sam + ks[None, :] * sak, mask=rmask[:, None] & kmask[None, :], other=0.0
        )
        b = tl.load(
            B + ks[:, None] * sbk + cr[None, :] * sbr, mask=kmask[:, None] & crmask[None, :], other=0.0
        )
        acc += tl.dot(a, b)
    tl.store(
        C + rows[:, None] * R + cr[None, :], acc.to(C.dtype.element_ty), mask=rmask[:, None] & crmask[None, :]
    )


@triton.jit
def _lowrank_cols(
    A, B, P, M, N, R, rows_per_split, sam, san, sbm, sbr, BN: tl.constexpr, BM: tl.constexpr, BR: tl.constexpr
):
    """P[split, N, R] = A[rows of the split, N]^T @ B[rows of the split, R] (fp32)."""
    split = tl.program_id(1).to(tl.int64)
    cols = tl.program_id(0).to(tl.int64) * BN + tl.arange(0, BN)
    cr = tl.arange(0, BR)
    cmask, crmask = cols < N, cr < R
    start = split * rows_per_split
    stop = tl.minimum(start + rows_per_split, M)
    acc = tl.zeros((BN, BR), dtype=tl.float32)
    for m0 in range(start, stop, BM):
        ms = m0 + tl.arange(0, BM)
        mmask = ms < stop
        a = tl.load(
            A + ms[:, None] * sam + cols[None, :] * san, mask=mmask[:, None] & cmask[None, :], other=0.0
        )
        b = tl.load(
            B + ms[:, None] * sbm + cr[None, :] * sbr, mask=mmask[:, None] & crmask[None, :], other=0.0
        )
        acc += tl.dot(tl.trans(a), b)
    tl.store(P + split * N * R + cols[:, None] * R + cr[None, :], acc, mask=cmask[:, None] & crmask[None, :])


def _dot_dtype_ok(*ts: torch.Tensor) -> None:
    if len({t.dtype for t in ts}) != 1:
        raise RuntimeError(f"lowrank: mixed dtypes {[t.dtype for t in ts]}")


def rows_mm(a: torch.Tensor, b: torch.Tensor, block_m: int = 64, block_k: int = 64) -> torch.Tensor:
    """a [M, K] @ b [K, r] -> [M, r] in a's dtype; b may be a transposed view (down.t())."""
    _dot_dtype_ok(a, b)
    M, K = a.shape
    r = b.shape[1]
    c = torch.empty(M, r, device=a.device, dtype=a.dtype)
    if M and r:
        _lowrank_rows[(triton.cdiv(M, block_m),)](
            a, b, c, M, K, r, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            BM=block_m, BK=block_k, BR=max(16, next_pow2(r)), num_warps=4, num_stages=3,
        )  # fmt: skip
    return c


def cols_mm(a: torch.Tensor, b: torch.Tensor, block_n: int = 64, block_m: int = 64) -> torch.Tensor:
    """a [M, N]^T @ b [M, r] -> [N, r] in a's dtype (fp32 partial sums over row slices, then added)."""
    _dot_dtype_ok(a, b)
    M, N = a.shape
    r = b.shape[1]
    col_blocks = triton.cdiv(N, block_n)
    splits = max(1, min(triton.cdiv(M, 4 * block_m), triton.cdiv(264, col_blocks)))  # ~2 programs per SM
    rows_per_split = triton.cdiv(triton.cdiv(M, splits), block_m) * block_m
    splits = triton.cdiv(M, rows_per_split) if M else 1
    p = torch.zeros(splits, N, r, device=a.device, dtype=torch.float32)
    if M and N and r:
        _lowrank_cols[(col_blocks, splits)](
            a, b, p, M, N, r, rows_per_split, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            BN=block_n, BM=block_m, BR=max(16, next_pow2(r)), num_warps=4, num_stages=3,
        )  # fmt: skip
    return p.sum(0).to(a.dtype)

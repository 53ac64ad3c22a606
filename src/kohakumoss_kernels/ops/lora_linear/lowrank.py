"""Triton kernels for the rank-r products of a LoRA linear: [M, K] x [K, r] and [M, N]^T x [M, r].

cuBLAS fills only ~M/128 thread blocks for a 32-wide output (68 at 8704 tokens on a 132-SM card), so it
splits K and adds the slices in a second kernel (and a memset): three launches per product, ~1,700 per
step of the 5B model's LoRA, each with its gap in the CUDA graph. Here each product is one launch:
`rows_mm` gives every program BM whole rows (no reduction), `cols_into` gives each program BN columns
and a slice of the rows and adds its partial sum into the fp32 output with atomics (the parameter's
`.grad` itself inside a grad_sink window, so nothing is zeroed or reduced afterwards). Atomic adds make
the last bits of the adapter's gradient depend on the programs' order, as in the per-sample ops.
r is padded to a power of two of at least 16 (tl.dot's minimum) by masking. Launch configs are timed
once per shape (triton_utils.pick).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...backends.triton_utils import next_pow2, persistent_programs, pick, size_bucket
from ...backends.triton_utils import supports as supports


@triton.jit
def _lowrank_rows(
    A, B, C, M, K, R, rows_per_program, sam, sak, sbk, sbr, alpha,
    BM: tl.constexpr, BK: tl.constexpr, BR: tl.constexpr, EVEN_K: tl.constexpr,
):  # fmt: skip
    """C[M, R] = alpha * A[M, K] @ B[K, R] (fp32 accumulation, stored in C's dtype); each program owns
    rows_per_program (<= BM) whole rows: masked rows are never loaded."""
    start = tl.program_id(0).to(tl.int64) * rows_per_program
    rows = start + tl.arange(0, BM)
    cr = tl.arange(0, BR)
    rmask, crmask = (rows < start + rows_per_program) & (rows < M), cr < R
    acc = tl.zeros((BM, BR), dtype=tl.float32)
    for k0 in range(0, K, BK):
        ks = k0 + tl.arange(0, BK)
        kmask = (ks < K) | EVEN_K  # K a multiple of BK: the mask folds away, loads go unpredicated
        a = tl.load(
            A + rows[:, None] * sam + ks[None, :] * sak, mask=rmask[:, None] & kmask[None, :], other=0.0
        )
        b = tl.load(
            B + ks[:, None] * sbk + cr[None, :] * sbr, mask=kmask[:, None] & crmask[None, :], other=0.0
        )
        acc += tl.dot(a, b)
    tl.store(
        C + rows[:, None] * R + cr[None, :],
        (acc * alpha).to(C.dtype.element_ty),
        mask=rmask[:, None] & crmask[None, :],
    )


@triton.jit
def _lowrank_cols_into(
    A, B, OUT, M, N, R, rows_per_split, sam, san, sbm, sbr, son, sor, alpha,
    BN: tl.constexpr, BM: tl.constexpr, BR: tl.constexpr,
):  # fmt: skip
    """OUT[N, R] += alpha * A[rows of the split, N]^T @ B[rows of the split, R] (fp32 atomics)."""
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
    tl.atomic_add(
        OUT + cols[:, None] * son + cr[None, :] * sor,
        acc * alpha,
        mask=cmask[:, None] & crmask[None, :],
        sem="relaxed",
    )


# rows: (rows per program, or -k: the rows shared evenly by k programs per SM; BK, stages, warps). Even
# shares keep every SM equally busy where fixed tiles leave a short last wave (8704 rows: 136 x 64 on 132
# SMs). The lists hold the fastest of scripts/bench/lowrank.py's sweep on the H200 (2026-11-30), best first.
ROWS_CONFIGS = [(-2, 128, 4, 4), (64, 128, 4, 4), (-2, 64, 6, 4), (-1, 128, 4, 8)]
MAX_ROWS = 128  # rows of one rows_mm program (its [rows, BK] tile and [rows, r] accumulator)
# cols: (BN, BM, warps, stages, programs per SM)
COLS_CONFIGS = [(128, 64, 4, 3, 2), (64, 128, 4, 3, 2), (64, 64, 4, 4, 2), (128, 64, 8, 3, 2)]


def _dot_dtype_ok(*ts: torch.Tensor) -> None:
    if len({t.dtype for t in ts}) != 1:
        raise RuntimeError(f"lowrank: mixed dtypes {[t.dtype for t in ts]}")


def rows_mm(a: torch.Tensor, b: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    """alpha * a [M, K] @ b [K, r] -> [M, r] in a's dtype; b may be a transposed view (down.t())."""
    _dot_dtype_ok(a, b)
    M, K = a.shape
    r = b.shape[1]
    c = torch.empty(M, r, device=a.device, dtype=a.dtype)
    if not (M and r):
        return c
    if not K:
        return c.zero_()

    def launch(cfg: tuple) -> None:
        share, bk, stages, warps = cfg
        per = min(MAX_ROWS, share if share > 0 else triton.cdiv(M, persistent_programs(a, M, -share)))
        _lowrank_rows[(triton.cdiv(M, per),)](
            a, b, c, M, K, r, per, a.stride(0), a.stride(1), b.stride(0), b.stride(1), float(alpha),
            BM=max(16, next_pow2(per)), BK=bk, BR=max(16, next_pow2(r)), EVEN_K=K % bk == 0,
            num_warps=warps, num_stages=stages,
        )  # fmt: skip

    launch(pick("lowrank.rows", (K, r, a.dtype, size_bucket(M), a.device), ROWS_CONFIGS, launch))
    return c


def cols_into(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, alpha: float = 1.0) -> None:
    """out [N, r] (fp32, any strides) += alpha * a [M, N]^T @ b [M, r], in one launch."""
    _dot_dtype_ok(a, b)
    M, N = a.shape
    r = b.shape[1]
    if out.dtype != torch.float32 or tuple(out.shape) != (N, r):
        raise RuntimeError(
            f"lowrank.cols_into: out must be float32 [{N}, {r}], got {out.dtype} {tuple(out.shape)}"
        )
    if not (M and N and r):
        return

    def launch(cfg: tuple, target: torch.Tensor = out) -> None:
        bn, bm, warps, stages, per_sm = cfg
        col_blocks = triton.cdiv(N, bn)
        row_steps = triton.cdiv(M, bm)
        splits = max(1, persistent_programs(a, col_blocks * row_steps, per_sm) // col_blocks)
        rows_per_split = triton.cdiv(triton.cdiv(M, splits), bm) * bm
        _lowrank_cols_into[(col_blocks, triton.cdiv(M, rows_per_split))](
            a, b, target, M, N, r, rows_per_split, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            target.stride(0), target.stride(1), float(alpha),
            BN=bn, BM=bm, BR=max(16, next_pow2(r)), num_warps=warps, num_stages=stages,
        )  # fmt: skip

    key = (N, r, a.dtype, size_bucket(M), a.device)
    scratch = None

    def timed(cfg: tuple) -> None:  # the picker repeats launches: into a scratch buffer, not `out`
        nonlocal scratch
        scratch = torch.zeros_like(out) if scratch is None else scratch
        launch(cfg, scratch)

    launch(pick("lowrank.cols", key, COLS_CONFIGS, timed))


def mm_into(out: torch.Tensor, a_t: torch.Tensor, b: torch.Tensor, alpha: float = 1.0) -> None:
    """out (float32) += alpha * a_t @ b, a weight gradient over M rows: a_t [n, M] (a transposed view),
    b [M, m], one of n and m the rank."""
    if b.shape[1] <= a_t.shape[0]:  # the rank-r operand on the right: out [n, r]
        cols_into(out, a_t.t(), b, alpha)
    else:  # on the left: out^T [m, r] = b^T a_t^T
        cols_into(out.t(), b, a_t.t(), alpha)


def mm(a_t: torch.Tensor, b: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    """alpha * a_t @ b as mm_into, in a fresh float32 tensor."""
    out = torch.zeros(a_t.shape[0], b.shape[1], device=a_t.device, dtype=torch.float32)
    mm_into(out, a_t, b, alpha)
    return out

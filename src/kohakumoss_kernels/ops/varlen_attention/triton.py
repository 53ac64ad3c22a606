"""Varlen attention in Triton, flash-attention-2 style, over the packed layout (no padding, no causal mask).

q, k, v [T, H, D] with samples delimited by cu_seqlens; each program owns one block of queries
(forward, dq) or of keys (dk/dv) of one (sample, head) and loops over the other side within that
sample only. Softmax in base 2 with fp32 accumulation; the forward keeps lse [H, T] (base 2) for the
backward, which recomputes P.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from ...backends.triton_utils import next_pow2, pick
from ...backends.triton_utils import supports as _triton_supports

LOG2E = 1.4426950408889634


def supports(arch: str, dtype: torch.dtype) -> bool:
    return _triton_supports(arch, dtype) and dtype != torch.float32


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _configs(pairs: list[tuple[int, int, int, int]]) -> list[tuple[int, int, int, int]]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) candidates, the default first; 16 x 16 in the interpreter."""
    return [(16, 16, 1, 1)] if _interpreting() else pairs


FWD_CONFIGS = [(128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 4, 4), (64, 64, 4, 3)]
# the 5-stage ones: the Triton fused-attention tutorial's Hopper backward settings
DKDV_CONFIGS = [(64, 128, 8, 3), (32, 128, 4, 3), (32, 128, 4, 5), (64, 64, 4, 3), (128, 128, 8, 2)]
DQ_CONFIGS = [(128, 64, 8, 3), (128, 32, 4, 3), (128, 32, 4, 5), (64, 64, 4, 3), (128, 128, 8, 2)]


@triton.jit
def _load_block(X, Y, base, offs, ok, offs_d, stride_t, MASK: tl.constexpr = True):
    """Rows `offs` of q or k, the same rows of do or v, and their offsets; MASK: rows not `ok` read 0."""
    off = offs[:, None] * stride_t + offs_d[None, :]
    if MASK:
        x = tl.load(X + base + off, mask=ok[:, None], other=0.0)
        y = tl.load(Y + base + off, mask=ok[:, None], other=0.0)
    else:
        x = tl.load(X + base + off)
        y = tl.load(Y + base + off)
    return x, y, off


@triton.jit
def _program(CU, BLOCK: tl.constexpr):
    """This program's block start, head, and its sample's first row and length."""
    start = tl.program_id(0) * BLOCK
    b = tl.program_id(1)
    h = tl.program_id(2)
    seq_start = tl.load(CU + b)
    seq_len = tl.load(CU + b + 1) - seq_start
    return start, h, seq_start, seq_len


@triton.jit
def _bases(seq_start, h, T, stride_t, HEAD_DIM: tl.constexpr):
    """Offsets of the sample's first row: in q, k, v (head h), and in lse/delta (head h)."""
    base = seq_start.to(tl.int64) * stride_t + h * HEAD_DIM
    row_base = h.to(tl.int64) * T + seq_start
    return base, row_base


@triton.jit
def _row_stats(LSE, DELTA, row_base, offs, ok, MASK: tl.constexpr = True):
    if MASK:
        lse = tl.load(LSE + row_base + offs, mask=ok, other=0.0)
        delta = tl.load(DELTA + row_base + offs, mask=ok, other=0.0)
    else:
        lse = tl.load(LSE + row_base + offs)
        delta = tl.load(DELTA + row_base + offs)
    return lse, delta


@triton.jit
def _attention_fwd_inner(
    acc, l_i, m_i, q, K, V, base, offs_n, offs_d, start_n, seq_len, stride_t, qk_scale,
    MASK: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
):  # fmt: skip
    cols = start_n + offs_n
    kv_off = cols[:, None] * stride_t + offs_d[None, :]
    if MASK:
        k = tl.load(K + base + kv_off, mask=cols[:, None] < seq_len, other=0.0)
        v = tl.load(V + base + kv_off, mask=cols[:, None] < seq_len, other=0.0)
    else:
        k = tl.load(K + base + kv_off)
        v = tl.load(V + base + kv_off)
    qk = tl.dot(q, tl.trans(k)) * qk_scale
    if MASK:
        qk = tl.where(cols[None, :] < seq_len, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    p = tl.math.exp2(qk - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, l_i, m_new


@triton.jit
def _attention_fwd(
    Q, K, V, Out, LSE, CU, T, H, stride_t, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    start_m, h, seq_start, seq_len = _program(CU, BLOCK_M)
    if start_m >= seq_len:
        return
    base = seq_start.to(tl.int64) * stride_t + h * HEAD_DIM
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(
        Q + base + offs_m[:, None] * stride_t + offs_d[None, :], mask=offs_m[:, None] < seq_len, other=0.0
    )
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    n_main = (seq_len // BLOCK_N) * BLOCK_N
    for start_n in range(0, n_main, BLOCK_N):  # full blocks, unmasked
        acc, l_i, m_i = _attention_fwd_inner(
            acc, l_i, m_i, q, K, V, base, offs_n, offs_d, start_n, seq_len, stride_t, qk_scale,
            MASK=False, BLOCK_N=BLOCK_N, HEAD_DIM=HEAD_DIM,
        )  # fmt: skip
    if n_main < seq_len:  # the masked last block
        acc, l_i, m_i = _attention_fwd_inner(
            acc, l_i, m_i, q, K, V, base, offs_n, offs_d, n_main, seq_len, stride_t, qk_scale,
            MASK=True, BLOCK_N=BLOCK_N, HEAD_DIM=HEAD_DIM,
        )  # fmt: skip
    acc = acc / l_i[:, None]
    row_ok = offs_m < seq_len
    tl.store(
        Out + base + offs_m[:, None] * stride_t + offs_d[None, :],
        acc.to(Out.dtype.element_ty),
        mask=row_ok[:, None],
    )
    tl.store(LSE + h.to(tl.int64) * T + seq_start + offs_m, m_i + tl.math.log2(l_i), mask=row_ok)


@triton.jit
def _attention_bwd_delta(Out, DO, DELTA, T, H, stride_t, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    h = tl.program_id(1)
    offs_d = tl.arange(0, HEAD_DIM)
    off = rows[:, None].to(tl.int64) * stride_t + h * HEAD_DIM + offs_d[None, :]
    o = tl.load(Out + off, mask=rows[:, None] < T, other=0.0).to(tl.float32)
    do = tl.load(DO + off, mask=rows[:, None] < T, other=0.0).to(tl.float32)
    tl.store(DELTA + h.to(tl.int64) * T + rows, tl.sum(o * do, 1), mask=rows < T)


@triton.jit
def _attention_bwd_dkdv_inner(
    dk, dv, k, v, Q, DO, LSE, DELTA, base, row_base, offs_m0, offs_d, start_m, seq_len, stride_t, qk_scale,
    MASK: tl.constexpr,
):  # fmt: skip
    """One block of queries into this program's dk, dv; MASK: the block crosses the sample's end."""
    offs_m = start_m + offs_m0
    m_ok = offs_m < seq_len
    q, do, _ = _load_block(Q, DO, base, offs_m, m_ok, offs_d, stride_t, MASK)
    lse, delta = _row_stats(LSE, DELTA, row_base, offs_m, m_ok, MASK)
    qkT = tl.dot(k, tl.trans(q)) * qk_scale
    pT = tl.math.exp2(qkT - lse[None, :])
    if MASK:
        pT = tl.where(m_ok[None, :], pT, 0.0)
    dv += tl.dot(pT.to(do.dtype), do)
    dpT = tl.dot(v, tl.trans(do)).to(tl.float32)
    dsT = (pT * (dpT - delta[None, :])).to(q.dtype)
    dk += tl.dot(dsT, q)
    return dk, dv


@triton.jit
def _attention_bwd_dkdv(
    Q, K, V, DO, DK, DV, LSE, DELTA, CU, T, H, stride_t, qk_scale, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    start_n, h, seq_start, seq_len = _program(CU, BLOCK_N)
    if start_n >= seq_len:
        return
    base, row_base = _bases(seq_start, h, T, stride_t, HEAD_DIM)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    kv_off = offs_n[:, None] * stride_t + offs_d[None, :]
    kv_mask = offs_n[:, None] < seq_len
    k = tl.load(K + base + kv_off, mask=kv_mask, other=0.0)
    v = tl.load(V + base + kv_off, mask=kv_mask, other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    m_main = (seq_len // BLOCK_M) * BLOCK_M
    # full blocks, unmasked (a short k block's rows past the end are zeros whose results are never stored)
    for start_m in range(0, m_main, BLOCK_M):
        dk, dv = _attention_bwd_dkdv_inner(
            dk, dv, k, v, Q, DO, LSE, DELTA, base, row_base, offs_m0, offs_d, start_m, seq_len, stride_t,
            qk_scale, MASK=False,
        )  # fmt: skip
    if m_main < seq_len:  # the masked last block
        dk, dv = _attention_bwd_dkdv_inner(
            dk, dv, k, v, Q, DO, LSE, DELTA, base, row_base, offs_m0, offs_d, m_main, seq_len, stride_t,
            qk_scale, MASK=True,
        )  # fmt: skip
    tl.store(DK + base + kv_off, (dk * sm_scale).to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + base + kv_off, dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _attention_bwd_dq_inner(
    dq, q, do, lse, delta, K, V, base, offs_n0, offs_d, start_n, seq_len, stride_t, qk_scale,
    MASK: tl.constexpr,
):  # fmt: skip
    """One block of keys into this program's dq; MASK: the block crosses the sample's end."""
    offs_n = start_n + offs_n0
    n_ok = offs_n < seq_len
    k, v, _ = _load_block(K, V, base, offs_n, n_ok, offs_d, stride_t, MASK)
    qk = tl.dot(q, tl.trans(k)) * qk_scale
    p = tl.math.exp2(qk - lse[:, None])
    if MASK:
        p = tl.where(n_ok[None, :], p, 0.0)
    dp = tl.dot(do, tl.trans(v)).to(tl.float32)
    ds = (p * (dp - delta[:, None])).to(k.dtype)
    dq += tl.dot(ds, k)
    return dq


@triton.jit
def _attention_bwd_dq(
    Q, K, V, DO, DQ, LSE, DELTA, CU, T, H, stride_t, qk_scale, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    start_m, h, seq_start, seq_len = _program(CU, BLOCK_M)
    if start_m >= seq_len:
        return
    base, row_base = _bases(seq_start, h, T, stride_t, HEAD_DIM)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    m_ok = offs_m < seq_len
    q, do, q_off = _load_block(Q, DO, base, offs_m, m_ok, offs_d, stride_t)
    lse, delta = _row_stats(LSE, DELTA, row_base, offs_m, m_ok)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    n_main = (seq_len // BLOCK_N) * BLOCK_N
    for start_n in range(0, n_main, BLOCK_N):  # full blocks, unmasked
        dq = _attention_bwd_dq_inner(
            dq, q, do, lse, delta, K, V, base, offs_n0, offs_d, start_n, seq_len, stride_t, qk_scale, MASK=False
        )  # fmt: skip
    if n_main < seq_len:  # the masked last block
        dq = _attention_bwd_dq_inner(
            dq, q, do, lse, delta, K, V, base, offs_n0, offs_d, n_main, seq_len, stride_t, qk_scale, MASK=True
        )  # fmt: skip
    tl.store(DQ + base + q_off, (dq * sm_scale).to(DQ.dtype.element_ty), mask=m_ok[:, None])


def _key(q: torch.Tensor, max_seqlen: int) -> tuple:
    """The launch-config pick's key: head_dim, dtype, the longest sample's power-of-two bucket, device.
    (One config per head_dim would be timed at whichever call came first: the text refiner's.)"""
    return (q.shape[2], q.dtype, next_pow2(max(int(max_seqlen), 64)), q.device)


def _launch(kernel, grid_block: str, max_seqlen: int, B: int, H: int, *args, **meta):
    """A `pick`-able launch: config (BLOCK_M, BLOCK_N, num_warps, num_stages) -> the kernel over its grid."""

    def launch(cfg: tuple[int, int, int, int]) -> None:
        bm, bn, warps, stages = cfg
        block = bm if grid_block == "BLOCK_M" else bn
        kernel[(triton.cdiv(max_seqlen, block), B, H)](
            *args, **meta, BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages
        )

    return launch


def attention_forward(q, k, v, cu, max_seqlen: int, sm_scale: float):
    """o and lse [H, T] (base 2)."""
    T, H, D = q.shape
    o = torch.empty_like(q)
    lse = torch.empty(H, T, device=q.device, dtype=torch.float32)
    if T and max_seqlen:
        launch = _launch(
            _attention_fwd, "BLOCK_M", max_seqlen, cu.numel() - 1, H,
            q, k, v, o, lse, cu, T, H, H * D, sm_scale * LOG2E, HEAD_DIM=D,
        )  # fmt: skip
        launch(pick("varlen_attention.fwd", _key(q, max_seqlen), _configs(FWD_CONFIGS), launch))
    return o, lse


def attention_backward(q, k, v, o, lse, cu, do, max_seqlen: int, sm_scale: float):
    """dq, dk, dv."""
    T, H, D = q.shape
    B = cu.numel() - 1
    do = do.contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    delta = torch.empty_like(lse)
    if T and max_seqlen:
        block = 16 if _interpreting() else 64
        _attention_bwd_delta[(triton.cdiv(T, block), H)](o, do, delta, T, H, H * D, HEAD_DIM=D, BLOCK=block)
        args = (lse, delta, cu, T, H, H * D, sm_scale * LOG2E, sm_scale)
        key = _key(q, max_seqlen)
        dkdv = _launch(
            _attention_bwd_dkdv, "BLOCK_N", max_seqlen, B, H, q, k, v, do, dk, dv, *args, HEAD_DIM=D
        )
        dkdv(pick("varlen_attention.dkdv", key, _configs(DKDV_CONFIGS), dkdv))
        dq_launch = _launch(
            _attention_bwd_dq, "BLOCK_M", max_seqlen, B, H, q, k, v, do, dq, *args, HEAD_DIM=D
        )
        dq_launch(pick("varlen_attention.dq", key, _configs(DQ_CONFIGS), dq_launch))
    return dq, dk, dv


class _VarlenAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens, max_seqlen, scale):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        D = q.shape[2]
        if D not in (16, 32, 64, 128, 256):
            raise RuntimeError(f"triton varlen_attention: head_dim {D} is not a power of two in 16..256")
        cu = cu_seqlens.to(torch.int32).contiguous()
        sm_scale = scale if scale is not None else 1.0 / math.sqrt(D)
        o, lse = attention_forward(q, k, v, cu, max_seqlen, sm_scale)
        ctx.save_for_backward(q, k, v, o, lse, cu)
        ctx.max_seqlen, ctx.sm_scale = max_seqlen, sm_scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, cu = ctx.saved_tensors
        dq, dk, dv = attention_backward(q, k, v, o, lse, cu, do, ctx.max_seqlen, ctx.sm_scale)
        return dq, dk, dv, None, None, None


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    scale: float | None = None,
) -> torch.Tensor:
    return _VarlenAttention.apply(q, k, v, cu_seqlens, int(max_seqlen), scale)


varlen_attention.device_lengths = True  # cu_seqlens read on the device: graph-safe across lengths

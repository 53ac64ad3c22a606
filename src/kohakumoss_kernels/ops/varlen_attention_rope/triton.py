"""Varlen attention with the rotary embedding in the kernel's prologue (Triton, flash-attention-2 style).

Same kernels as ops/varlen_attention/triton.py, except that every q or k tile is loaded as its two
halves and rotated in registers (half-split pairs, fp32, rounded to the input dtype as the
reference's separate rope does); q k^T is then two dots over the halves, so the rotated q and k
never go to memory and no register shuffle is needed. The backward recomputes the rotation from the
saved unrotated q, k, keeps dq and dk as halves, and un-rotates them before their store.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..varlen_attention.triton import LOG2E, _bwd_delta, _configs, _interpreting
from ..varlen_attention.triton import supports as supports

# Smaller tiles than the plain kernel (the cos/sin tiles take registers too); these compile for sm90
# without register spills. Two per kernel, so a fresh machine compiles few.
FWD_CONFIGS = _configs([(128, 64, 8, 3), (64, 64, 4, 3)])
DKDV_CONFIGS = _configs([(64, 64, 8, 3), (32, 64, 8, 3)])
DQ_CONFIGS = _configs([(128, 64, 8, 3), (64, 64, 8, 3)])


@triton.jit
def _load_rotated(X, COS, SIN, base, cs_base, offs, ok, stride_t, HALF: tl.constexpr):
    """Rows `offs` of one head of X (masked by `ok`) as their two rotated halves, in X's dtype:
    (x1 cos - x2 sin, x2 cos + x1 sin). The halves stay separate, so no register shuffle is needed."""
    cols = tl.arange(0, HALF)
    at = X + base + offs[:, None] * stride_t + cols[None, :]
    x1 = tl.load(at, mask=ok[:, None], other=0.0)
    x2 = tl.load(at + HALF, mask=ok[:, None], other=0.0).to(tl.float32)
    cs = cs_base + offs[:, None] * HALF + cols[None, :]
    c = tl.load(COS + cs, mask=ok[:, None], other=0.0)
    s = tl.load(SIN + cs, mask=ok[:, None], other=0.0)
    x1f = x1.to(tl.float32)
    return (x1f * c - x2 * s).to(x1.dtype), (x2 * c + x1f * s).to(x1.dtype)


@triton.jit
def _unrotate_store(OUT, g1, g2, COS, SIN, base, cs_base, offs, ok, stride_t, HALF: tl.constexpr):
    """Store the gradient w.r.t. the unrotated rows: the inverse rotation of (g1, g2)."""
    cols = tl.arange(0, HALF)
    cs = cs_base + offs[:, None] * HALF + cols[None, :]
    c = tl.load(COS + cs, mask=ok[:, None], other=0.0)
    s = tl.load(SIN + cs, mask=ok[:, None], other=0.0)
    at = OUT + base + offs[:, None] * stride_t + cols[None, :]
    tl.store(at, (g1 * c + g2 * s).to(OUT.dtype.element_ty), mask=ok[:, None])
    tl.store(at + HALF, (g2 * c - g1 * s).to(OUT.dtype.element_ty), mask=ok[:, None])


@triton.autotune(configs=FWD_CONFIGS, key=["HEAD_DIM"])
@triton.jit
def _fwd(
    Q,
    K,
    V,
    COS,
    SIN,
    Out,
    LSE,
    CU,
    T,
    H,
    stride_t,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    HALF: tl.constexpr = HEAD_DIM // 2
    start_m = tl.program_id(0) * BLOCK_M
    b = tl.program_id(1)
    h = tl.program_id(2)
    seq_start = tl.load(CU + b)
    seq_len = tl.load(CU + b + 1) - seq_start
    if start_m >= seq_len:
        return
    base = seq_start.to(tl.int64) * stride_t + h * HEAD_DIM
    cs_base = seq_start.to(tl.int64) * HALF
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    m_ok = offs_m < seq_len
    q1, q2 = _load_rotated(Q, COS, SIN, base, cs_base, offs_m, m_ok, stride_t, HALF)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in range(0, seq_len, BLOCK_N):
        offs_n = start_n + offs_n0
        n_ok = offs_n < seq_len
        k1, k2 = _load_rotated(K, COS, SIN, base, cs_base, offs_n, n_ok, stride_t, HALF)
        v = tl.load(V + base + offs_n[:, None] * stride_t + offs_d[None, :], mask=n_ok[:, None], other=0.0)
        qk = tl.dot(q2, tl.trans(k2), acc=tl.dot(q1, tl.trans(k1))) * qk_scale
        qk = tl.where(n_ok[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    acc = acc / l_i[:, None]
    tl.store(
        Out + base + offs_m[:, None] * stride_t + offs_d[None, :],
        acc.to(Out.dtype.element_ty),
        mask=m_ok[:, None],
    )
    tl.store(LSE + h.to(tl.int64) * T + seq_start + offs_m, m_i + tl.math.log2(l_i), mask=m_ok)


@triton.autotune(configs=DKDV_CONFIGS, key=["HEAD_DIM"])
@triton.jit
def _bwd_dkdv(
    Q,
    K,
    V,
    COS,
    SIN,
    DO,
    DK,
    DV,
    LSE,
    DELTA,
    CU,
    T,
    H,
    stride_t,
    qk_scale,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    HALF: tl.constexpr = HEAD_DIM // 2
    start_n = tl.program_id(0) * BLOCK_N
    b = tl.program_id(1)
    h = tl.program_id(2)
    seq_start = tl.load(CU + b)
    seq_len = tl.load(CU + b + 1) - seq_start
    if start_n >= seq_len:
        return
    base = seq_start.to(tl.int64) * stride_t + h * HEAD_DIM
    cs_base = seq_start.to(tl.int64) * HALF
    row_base = h.to(tl.int64) * T + seq_start
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    n_ok = offs_n < seq_len
    kv_off = offs_n[:, None] * stride_t + offs_d[None, :]
    k1, k2 = _load_rotated(K, COS, SIN, base, cs_base, offs_n, n_ok, stride_t, HALF)
    v = tl.load(V + base + kv_off, mask=n_ok[:, None], other=0.0)
    dk1 = tl.zeros([BLOCK_N, HALF], dtype=tl.float32)
    dk2 = tl.zeros([BLOCK_N, HALF], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    for start_m in range(0, seq_len, BLOCK_M):
        offs_m = start_m + offs_m0
        m_ok = offs_m < seq_len
        q1, q2 = _load_rotated(Q, COS, SIN, base, cs_base, offs_m, m_ok, stride_t, HALF)
        do = tl.load(DO + base + offs_m[:, None] * stride_t + offs_d[None, :], mask=m_ok[:, None], other=0.0)
        lse = tl.load(LSE + row_base + offs_m, mask=m_ok, other=0.0)
        delta = tl.load(DELTA + row_base + offs_m, mask=m_ok, other=0.0)
        qkT = tl.dot(k2, tl.trans(q2), acc=tl.dot(k1, tl.trans(q1))) * qk_scale
        pT = tl.math.exp2(qkT - lse[None, :])
        pT = tl.where(m_ok[None, :], pT, 0.0)
        dv += tl.dot(pT.to(do.dtype), do)
        dpT = tl.dot(v, tl.trans(do)).to(tl.float32)
        dsT = (pT * (dpT - delta[None, :])).to(q1.dtype)
        dk1 += tl.dot(dsT, q1)
        dk2 += tl.dot(dsT, q2)
    _unrotate_store(DK, dk1 * sm_scale, dk2 * sm_scale, COS, SIN, base, cs_base, offs_n, n_ok, stride_t, HALF)
    tl.store(DV + base + kv_off, dv.to(DV.dtype.element_ty), mask=n_ok[:, None])


@triton.autotune(configs=DQ_CONFIGS, key=["HEAD_DIM"])
@triton.jit
def _bwd_dq(
    Q,
    K,
    V,
    COS,
    SIN,
    DO,
    DQ,
    LSE,
    DELTA,
    CU,
    T,
    H,
    stride_t,
    qk_scale,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    HALF: tl.constexpr = HEAD_DIM // 2
    start_m = tl.program_id(0) * BLOCK_M
    b = tl.program_id(1)
    h = tl.program_id(2)
    seq_start = tl.load(CU + b)
    seq_len = tl.load(CU + b + 1) - seq_start
    if start_m >= seq_len:
        return
    base = seq_start.to(tl.int64) * stride_t + h * HEAD_DIM
    cs_base = seq_start.to(tl.int64) * HALF
    row_base = h.to(tl.int64) * T + seq_start
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    m_ok = offs_m < seq_len
    q1, q2 = _load_rotated(Q, COS, SIN, base, cs_base, offs_m, m_ok, stride_t, HALF)
    do = tl.load(DO + base + offs_m[:, None] * stride_t + offs_d[None, :], mask=m_ok[:, None], other=0.0)
    lse = tl.load(LSE + row_base + offs_m, mask=m_ok, other=0.0)
    delta = tl.load(DELTA + row_base + offs_m, mask=m_ok, other=0.0)
    dq1 = tl.zeros([BLOCK_M, HALF], dtype=tl.float32)
    dq2 = tl.zeros([BLOCK_M, HALF], dtype=tl.float32)
    for start_n in range(0, seq_len, BLOCK_N):
        offs_n = start_n + offs_n0
        n_ok = offs_n < seq_len
        k1, k2 = _load_rotated(K, COS, SIN, base, cs_base, offs_n, n_ok, stride_t, HALF)
        v = tl.load(V + base + offs_n[:, None] * stride_t + offs_d[None, :], mask=n_ok[:, None], other=0.0)
        qk = tl.dot(q2, tl.trans(k2), acc=tl.dot(q1, tl.trans(k1))) * qk_scale
        p = tl.math.exp2(qk - lse[:, None])
        p = tl.where(n_ok[None, :], p, 0.0)
        dp = tl.dot(do, tl.trans(v)).to(tl.float32)
        ds = (p * (dp - delta[:, None])).to(k1.dtype)
        dq1 += tl.dot(ds, k1)
        dq2 += tl.dot(ds, k2)
    _unrotate_store(DQ, dq1 * sm_scale, dq2 * sm_scale, COS, SIN, base, cs_base, offs_m, m_ok, stride_t, HALF)


def _grid(max_seqlen: int, B: int, H: int, block: str):
    return lambda meta: (triton.cdiv(max_seqlen, meta[block]), B, H)


class _VarlenAttentionRope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens, max_seqlen, cos, sin, scale):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        cos, sin = cos.float().contiguous(), sin.float().contiguous()
        T, H, D = q.shape
        if D not in (32, 64, 128, 256):  # each half feeds a dot, which needs K >= 16
            raise RuntimeError(f"triton varlen_attention_rope: head_dim {D} is not a power of two in 32..256")
        if cos.shape != (T, D // 2) or sin.shape != (T, D // 2):
            raise RuntimeError(
                f"triton varlen_attention_rope: cos/sin {tuple(cos.shape)}, need ({T}, {D // 2})"
            )
        cu = cu_seqlens.to(torch.int32).contiguous()
        B = cu.numel() - 1
        sm_scale = scale if scale is not None else 1.0 / math.sqrt(D)
        o = torch.empty_like(q)
        lse = torch.empty(H, T, device=q.device, dtype=torch.float32)
        if T and max_seqlen:
            _fwd[_grid(max_seqlen, B, H, "BLOCK_M")](
                q, k, v, cos, sin, o, lse, cu, T, H, H * D, sm_scale * LOG2E, HEAD_DIM=D
            )
        ctx.save_for_backward(q, k, v, cos, sin, o, lse, cu)
        ctx.max_seqlen, ctx.sm_scale = max_seqlen, sm_scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, cos, sin, o, lse, cu = ctx.saved_tensors
        T, H, D = q.shape
        B = cu.numel() - 1
        do = do.contiguous()
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        delta = torch.empty_like(lse)
        if T and ctx.max_seqlen:
            block = 16 if _interpreting() else 64
            _bwd_delta[(triton.cdiv(T, block), H)](o, do, delta, T, H, H * D, HEAD_DIM=D, BLOCK=block)
            args = (T, H, H * D, ctx.sm_scale * LOG2E, ctx.sm_scale)
            _bwd_dkdv[_grid(ctx.max_seqlen, B, H, "BLOCK_N")](
                q, k, v, cos, sin, do, dk, dv, lse, delta, cu, *args, HEAD_DIM=D
            )
            _bwd_dq[_grid(ctx.max_seqlen, B, H, "BLOCK_M")](
                q, k, v, cos, sin, do, dq, lse, delta, cu, *args, HEAD_DIM=D
            )
        return dq, dk, dv, None, None, None, None, None


def varlen_attention_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    cos: torch.Tensor,
    sin: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    return _VarlenAttentionRope.apply(q, k, v, cu_seqlens, int(max_seqlen), cos, sin, scale)

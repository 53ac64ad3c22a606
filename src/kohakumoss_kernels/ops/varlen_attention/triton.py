"""Varlen attention in Triton, flash-attention-2 style, over the packed layout (no padding, no causal mask).

q, k, v [T, H, D] with samples delimited by cu_seqlens; each program owns one block of queries
(forward, dq) or of keys (dk/dv) of one (sample, head) and loops over the other side within that
sample only. Softmax in base 2 with fp32 accumulation; the forward keeps lse [H, T] (base 2) for the
backward, which recomputes P. The kernels also serve varlen_attention_rope: with `HAS_ROPE` (a
constexpr, so the plain kernels compile without any of it) every q or k tile is loaded as its two
rotated halves, q k^T is two dots over the halves, and dq, dk are un-rotated before their store.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from ...triton_utils import supports as _triton_supports

LOG2E = 1.4426950408889634


def supports(arch: str, dtype: torch.dtype) -> bool:
    return _triton_supports(arch, dtype) and dtype != torch.float32


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _configs(pairs):
    if _interpreting():
        return [triton.Config({"BLOCK_M": 16, "BLOCK_N": 16}, num_warps=1, num_stages=1)]
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s) for m, n, w, s in pairs]


FWD_CONFIGS = _configs([(128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 4, 4), (64, 64, 4, 3)])
DKDV_CONFIGS = _configs([(64, 128, 8, 3), (32, 128, 4, 3), (64, 64, 4, 3), (128, 128, 8, 2)])
DQ_CONFIGS = _configs([(128, 64, 8, 3), (128, 32, 4, 3), (64, 64, 4, 3), (128, 128, 8, 2)])


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


@triton.jit
def _grad_acc(ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, HAS_ROPE: tl.constexpr):
    """Zeroed fp32 accumulators of dq or dk: two halves with rope, else one (returned twice)."""
    if HAS_ROPE:
        g1 = tl.zeros([ROWS, HEAD_DIM // 2], dtype=tl.float32)
        g2 = tl.zeros([ROWS, HEAD_DIM // 2], dtype=tl.float32)
    else:
        g1 = tl.zeros([ROWS, HEAD_DIM], dtype=tl.float32)
        g2 = g1
    return g1, g2


@triton.jit
def _store_grad(
    OUT, g1, g2, COS, SIN, base, cs_base, offs, ok, off, mask, sm_scale, stride_t,
    HALF: tl.constexpr, HAS_ROPE: tl.constexpr,
):  # fmt: skip
    """Store sm_scale * dq or dk: with rope the halves un-rotated (rows `ok`), else at `off` (`mask`)."""
    if HAS_ROPE:
        _unrotate_store(OUT, g1 * sm_scale, g2 * sm_scale, COS, SIN, base, cs_base, offs, ok, stride_t, HALF)
    else:
        tl.store(OUT + base + off, (g1 * sm_scale).to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _dot_t(a1, a2, b1, b2, HAS_ROPE: tl.constexpr):
    """a b^T; with rope a and b are kept as halves, so it is a1 b1^T + a2 b2^T."""
    if HAS_ROPE:
        ab = tl.dot(a2, tl.trans(b2), acc=tl.dot(a1, tl.trans(b1)))
    else:
        ab = tl.dot(a1, tl.trans(b1))
    return ab


@triton.jit
def _load_block(
    X, Y, COS, SIN, base, cs_base, offs, ok, offs_d, stride_t, HALF: tl.constexpr, HAS_ROPE: tl.constexpr
):
    """Rows `offs` of q or k as (x1, x2) (the rotated halves with rope, else x twice), the same rows of
    do or v, and (plain) their offsets."""
    off = offs[:, None] * stride_t + offs_d[None, :]
    if HAS_ROPE:  # the address sums as the rope kernel always had them (`off` would change its PTX)
        x1, x2 = _load_rotated(X, COS, SIN, base, cs_base, offs, ok, stride_t, HALF)
        y = tl.load(Y + base + offs[:, None] * stride_t + offs_d[None, :], mask=ok[:, None], other=0.0)
    else:
        x1 = tl.load(X + base + off, mask=ok[:, None], other=0.0)
        x2 = x1
        y = tl.load(Y + base + off, mask=ok[:, None], other=0.0)
    return x1, x2, y, off


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
    """Offsets of the sample's first row: in q, k, v (head h), in cos/sin, and in lse/delta (head h)."""
    base = seq_start.to(tl.int64) * stride_t + h * HEAD_DIM
    cs_base = seq_start.to(tl.int64) * (HEAD_DIM // 2)
    row_base = h.to(tl.int64) * T + seq_start
    return base, cs_base, row_base


@triton.jit
def _row_stats(LSE, DELTA, row_base, offs, ok):
    lse = tl.load(LSE + row_base + offs, mask=ok, other=0.0)
    delta = tl.load(DELTA + row_base + offs, mask=ok, other=0.0)
    return lse, delta


@triton.jit
def _attention_fwd_inner(
    acc,
    l_i,
    m_i,
    q1,
    q2,
    K,
    V,
    COS,
    SIN,
    base,
    cs_base,
    offs_n,
    offs_d,
    start_n,
    seq_len,
    stride_t,
    qk_scale,
    MASK: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HAS_ROPE: tl.constexpr,
):
    cols = start_n + offs_n
    if HAS_ROPE:  # always masked
        n_ok = cols < seq_len
        k1, k2 = _load_rotated(K, COS, SIN, base, cs_base, cols, n_ok, stride_t, HEAD_DIM // 2)
        v = tl.load(V + base + cols[:, None] * stride_t + offs_d[None, :], mask=n_ok[:, None], other=0.0)
        qk = _dot_t(q1, q2, k1, k2, HAS_ROPE) * qk_scale
        qk = tl.where(n_ok[None, :], qk, float("-inf"))
    else:
        kv_off = cols[:, None] * stride_t + offs_d[None, :]
        if MASK:
            k = tl.load(K + base + kv_off, mask=cols[:, None] < seq_len, other=0.0)
            v = tl.load(V + base + kv_off, mask=cols[:, None] < seq_len, other=0.0)
        else:
            k = tl.load(K + base + kv_off)
            v = tl.load(V + base + kv_off)
        qk = _dot_t(q1, q2, k, k, HAS_ROPE) * qk_scale
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
    Q, K, V, COS, SIN, Out, LSE, CU, T, H, stride_t, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_ROPE: tl.constexpr,
):  # fmt: skip
    start_m, h, seq_start, seq_len = _program(CU, BLOCK_M)
    if start_m >= seq_len:
        return
    base = seq_start.to(tl.int64) * stride_t + h * HEAD_DIM
    cs_base = seq_start.to(tl.int64) * (HEAD_DIM // 2)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    if HAS_ROPE:
        q1, q2 = _load_rotated(Q, COS, SIN, base, cs_base, offs_m, offs_m < seq_len, stride_t, HEAD_DIM // 2)
    else:
        q1 = tl.load(
            Q + base + offs_m[:, None] * stride_t + offs_d[None, :], mask=offs_m[:, None] < seq_len, other=0.0
        )
        q2 = q1
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    if HAS_ROPE:  # one masked loop: the cos/sin tiles leave no registers for a second, unmasked copy
        n_main = seq_len
    else:
        n_main = (seq_len // BLOCK_N) * BLOCK_N
    for start_n in range(0, n_main, BLOCK_N):
        acc, l_i, m_i = _attention_fwd_inner(
            acc, l_i, m_i, q1, q2, K, V, COS, SIN, base, cs_base, offs_n, offs_d, start_n, seq_len, stride_t,
            qk_scale, MASK=HAS_ROPE, BLOCK_N=BLOCK_N, HEAD_DIM=HEAD_DIM, HAS_ROPE=HAS_ROPE,
        )  # fmt: skip
    if not HAS_ROPE:  # noqa: SIM102 -- a constexpr test of its own, so the rope kernel has no such branch
        if n_main < seq_len:  # the masked last block
            acc, l_i, m_i = _attention_fwd_inner(
                acc, l_i, m_i, q1, q2, K, V, COS, SIN, base, cs_base, offs_n, offs_d, n_main, seq_len,
                stride_t, qk_scale, MASK=True, BLOCK_N=BLOCK_N, HEAD_DIM=HEAD_DIM, HAS_ROPE=False,
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
def _attention_bwd_dkdv(
    Q, K, V, COS, SIN, DO, DK, DV, LSE, DELTA, CU, T, H, stride_t, qk_scale, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_ROPE: tl.constexpr,
):  # fmt: skip
    HALF: tl.constexpr = HEAD_DIM // 2
    start_n, h, seq_start, seq_len = _program(CU, BLOCK_N)
    if start_n >= seq_len:
        return
    base, cs_base, row_base = _bases(seq_start, h, T, stride_t, HEAD_DIM)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    n_ok = offs_n < seq_len
    kv_off = offs_n[:, None] * stride_t + offs_d[None, :]
    if HAS_ROPE:
        k1, k2 = _load_rotated(K, COS, SIN, base, cs_base, offs_n, n_ok, stride_t, HALF)
        v = tl.load(V + base + kv_off, mask=n_ok[:, None], other=0.0)
    else:
        k1 = tl.load(K + base + kv_off, mask=offs_n[:, None] < seq_len, other=0.0)
        k2 = k1
        v = tl.load(V + base + kv_off, mask=offs_n[:, None] < seq_len, other=0.0)
    dk1, dk2 = _grad_acc(BLOCK_N, HEAD_DIM, HAS_ROPE)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    for start_m in range(0, seq_len, BLOCK_M):
        offs_m = start_m + offs_m0
        m_ok = offs_m < seq_len
        q1, q2, do, q_off = _load_block(
            Q, DO, COS, SIN, base, cs_base, offs_m, m_ok, offs_d, stride_t, HALF, HAS_ROPE
        )
        lse, delta = _row_stats(LSE, DELTA, row_base, offs_m, m_ok)
        qkT = _dot_t(k1, k2, q1, q2, HAS_ROPE) * qk_scale
        pT = tl.math.exp2(qkT - lse[None, :])
        pT = tl.where(m_ok[None, :], pT, 0.0)
        dv += tl.dot(pT.to(do.dtype), do)
        dpT = tl.dot(v, tl.trans(do)).to(tl.float32)
        dsT = (pT * (dpT - delta[None, :])).to(q1.dtype)
        dk1 += tl.dot(dsT, q1)
        if HAS_ROPE:
            dk2 += tl.dot(dsT, q2)
    if HAS_ROPE:
        kv_mask = n_ok[:, None]
    else:
        kv_mask = offs_n[:, None] < seq_len
    _store_grad(
        DK, dk1, dk2, COS, SIN, base, cs_base, offs_n, n_ok, kv_off, kv_mask, sm_scale, stride_t,
        HALF, HAS_ROPE,
    )  # fmt: skip
    tl.store(DV + base + kv_off, dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _attention_bwd_dq(
    Q, K, V, COS, SIN, DO, DQ, LSE, DELTA, CU, T, H, stride_t, qk_scale, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_ROPE: tl.constexpr,
):  # fmt: skip
    HALF: tl.constexpr = HEAD_DIM // 2
    start_m, h, seq_start, seq_len = _program(CU, BLOCK_M)
    if start_m >= seq_len:
        return
    base, cs_base, row_base = _bases(seq_start, h, T, stride_t, HEAD_DIM)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    m_ok = offs_m < seq_len
    q1, q2, do, q_off = _load_block(
        Q, DO, COS, SIN, base, cs_base, offs_m, m_ok, offs_d, stride_t, HALF, HAS_ROPE
    )
    lse, delta = _row_stats(LSE, DELTA, row_base, offs_m, m_ok)
    dq1, dq2 = _grad_acc(BLOCK_M, HEAD_DIM, HAS_ROPE)
    for start_n in range(0, seq_len, BLOCK_N):
        offs_n = start_n + offs_n0
        n_ok = offs_n < seq_len
        k1, k2, v, kv_off = _load_block(
            K, V, COS, SIN, base, cs_base, offs_n, n_ok, offs_d, stride_t, HALF, HAS_ROPE
        )
        qk = _dot_t(q1, q2, k1, k2, HAS_ROPE) * qk_scale
        p = tl.math.exp2(qk - lse[:, None])
        p = tl.where(n_ok[None, :], p, 0.0)
        dp = tl.dot(do, tl.trans(v)).to(tl.float32)
        ds = (p * (dp - delta[:, None])).to(k1.dtype)
        dq1 += tl.dot(ds, k1)
        if HAS_ROPE:
            dq2 += tl.dot(ds, k2)
    _store_grad(
        DQ, dq1, dq2, COS, SIN, base, cs_base, offs_m, m_ok, q_off, m_ok[:, None], sm_scale, stride_t,
        HALF, HAS_ROPE,
    )  # fmt: skip


def tuned(kernel, configs):
    """One autotuned launcher of a shared kernel (the plain and the rope op tune their own tile sizes)."""
    return triton.autotune(configs=configs, key=["HEAD_DIM"])(kernel)


def _grid(max_seqlen: int, B: int, H: int, block: str):
    return lambda meta: (triton.cdiv(max_seqlen, meta[block]), B, H)


def attention_forward(fwd, q, k, v, cos, sin, cu, max_seqlen: int, sm_scale: float):
    """o and lse [H, T] (base 2) from the autotuned `fwd`; cos, sin None for the plain op."""
    T, H, D = q.shape
    o = torch.empty_like(q)
    lse = torch.empty(H, T, device=q.device, dtype=torch.float32)
    if T and max_seqlen:
        fwd[_grid(max_seqlen, cu.numel() - 1, H, "BLOCK_M")](
            q, k, v, cos, sin, o, lse, cu, T, H, H * D, sm_scale * LOG2E, HEAD_DIM=D, HAS_ROPE=cos is not None
        )
    return o, lse


def attention_backward(dkdv, dq_kernel, q, k, v, cos, sin, o, lse, cu, do, max_seqlen: int, sm_scale: float):
    """dq, dk, dv from the autotuned backward kernels; cos, sin None for the plain op."""
    T, H, D = q.shape
    B = cu.numel() - 1
    do = do.contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    delta = torch.empty_like(lse)
    if T and max_seqlen:
        block = 16 if _interpreting() else 64
        _attention_bwd_delta[(triton.cdiv(T, block), H)](o, do, delta, T, H, H * D, HEAD_DIM=D, BLOCK=block)
        args = (T, H, H * D, sm_scale * LOG2E, sm_scale)
        rope = cos is not None
        dkdv[_grid(max_seqlen, B, H, "BLOCK_N")](
            q, k, v, cos, sin, do, dk, dv, lse, delta, cu, *args, HEAD_DIM=D, HAS_ROPE=rope
        )
        dq_kernel[_grid(max_seqlen, B, H, "BLOCK_M")](
            q, k, v, cos, sin, do, dq, lse, delta, cu, *args, HEAD_DIM=D, HAS_ROPE=rope
        )
    return dq, dk, dv


_FWD = tuned(_attention_fwd, FWD_CONFIGS)
_DKDV = tuned(_attention_bwd_dkdv, DKDV_CONFIGS)
_DQ = tuned(_attention_bwd_dq, DQ_CONFIGS)


class _VarlenAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens, max_seqlen, scale):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        D = q.shape[2]
        if D not in (16, 32, 64, 128, 256):
            raise RuntimeError(f"triton varlen_attention: head_dim {D} is not a power of two in 16..256")
        cu = cu_seqlens.to(torch.int32).contiguous()
        sm_scale = scale if scale is not None else 1.0 / math.sqrt(D)
        o, lse = attention_forward(_FWD, q, k, v, None, None, cu, max_seqlen, sm_scale)
        ctx.save_for_backward(q, k, v, o, lse, cu)
        ctx.max_seqlen, ctx.sm_scale = max_seqlen, sm_scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, cu = ctx.saved_tensors
        dq, dk, dv = attention_backward(
            _DKDV, _DQ, q, k, v, None, None, o, lse, cu, do, ctx.max_seqlen, ctx.sm_scale
        )
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

"""Varlen attention in TileLang (the sm70/sm75 path): a flash-attention forward over cu_seqlens.

The forward is a TileLang kernel that also writes lse [H, T] (base 2, the Triton kernel's layout);
the backward is a TileLang flash backward (dK, dV per key tile, dQ added atomically in fp32); should it
not build, the Triton backward runs where Triton does (sm75+), else a recompute through the eager
reference. Compiled once per (heads, head_dim, dtype); token and sample counts are symbolic.
"""

# no `from __future__ import annotations`: TileLang evaluates the kernels' annotations itself

import functools
import math

import tilelang
import tilelang.language as T
import torch

from kohakumoss_common.log import get_logger, log_once

from ...backends.tilelang_utils import DTYPE
from ...backends.tilelang_utils import supports as _tilelang_supports
from .eager import varlen_attention as _eager

log = get_logger("kohakumoss.kernels.tilelang")

LOG2E = 1.4426950408889634
BLOCK_M, BLOCK_N, THREADS, STAGES = 64, 64, 128, 1  # fits Turing's 64 KiB shared memory at head_dim 128


def supports(arch: str, dtype: torch.dtype) -> bool:
    return _tilelang_supports(arch, dtype)


def fwd_program(
    heads: int,
    dim: int,
    dtype: str,
    block_m: int = BLOCK_M,
    block_n: int = BLOCK_N,
    threads: int = THREADS,
    stages: int = STAGES,
):
    """Outputs: Out (index 5) and LSE (index 6)."""
    TT = T.symbolic("tt")
    B1 = T.symbolic("b1")
    acc = "float32"

    @T.prim_func
    def main(
        Q: T.Tensor((TT, heads, dim), dtype),
        K: T.Tensor((TT, heads, dim), dtype),
        V: T.Tensor((TT, heads, dim), dtype),
        CU: T.Tensor((B1,), "int32"),
        max_seqlen: T.int32,
        Out: T.Tensor((TT, heads, dim), dtype),
        LSE: T.Tensor((heads, TT), acc),
        qk_scale: T.float32,
    ):
        with T.Kernel(T.ceildiv(max_seqlen, block_m), heads, B1 - 1, threads=threads) as (bx, by, bz):
            q_s = T.alloc_shared((block_m, dim), dtype)
            k_s = T.alloc_shared((block_n, dim), dtype)
            v_s = T.alloc_shared((block_n, dim), dtype)
            s = T.alloc_fragment((block_m, block_n), acc)
            s_cast = T.alloc_shared((block_m, block_n), dtype)  # shared: the sm70 MMA layouts do not chain
            o = T.alloc_fragment((block_m, dim), acc)
            m_i = T.alloc_fragment((block_m,), acc)
            m_prev = T.alloc_fragment((block_m,), acc)
            alpha = T.alloc_fragment((block_m,), acc)
            row_sum = T.alloc_fragment((block_m,), acc)
            l_i = T.alloc_fragment((block_m,), acc)

            start = CU[bz]
            seq_len = CU[bz + 1] - start
            m0 = bx * block_m
            for i, j in T.Parallel(block_m, dim):
                q_s[i, j] = T.if_then_else(m0 + i < seq_len, Q[start + m0 + i, by, j], 0)
            T.fill(o, 0)
            T.fill(l_i, 0)
            T.fill(m_i, -T.infinity(acc))
            for kb in T.Pipelined(T.ceildiv(seq_len, block_n), num_stages=stages):
                n0 = kb * block_n
                for i, j in T.Parallel(block_n, dim):
                    k_s[i, j] = T.if_then_else(n0 + i < seq_len, K[start + n0 + i, by, j], 0)
                    v_s[i, j] = T.if_then_else(n0 + i < seq_len, V[start + n0 + i, by, j], 0)
                T.clear(s)
                T.gemm(q_s, k_s, s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                for i, j in T.Parallel(block_m, block_n):
                    s[i, j] = T.if_then_else(n0 + j < seq_len, s[i, j] * qk_scale, -T.infinity(acc))
                T.copy(m_i, m_prev)
                T.reduce_max(s, m_i, dim=1, clear=False)
                for i in T.Parallel(block_m):
                    alpha[i] = T.exp2(m_prev[i] - m_i[i])
                for i, j in T.Parallel(block_m, block_n):
                    s[i, j] = T.exp2(s[i, j] - m_i[i])
                T.reduce_sum(s, row_sum, dim=1)
                for i in T.Parallel(block_m):
                    l_i[i] = l_i[i] * alpha[i] + row_sum[i]
                T.copy(s, s_cast)
                for i, j in T.Parallel(block_m, dim):
                    o[i, j] *= alpha[i]
                T.gemm(s_cast, v_s, o, policy=T.GemmWarpPolicy.FullRow)
            for i, j in T.Parallel(block_m, dim):
                if m0 + i < seq_len:
                    Out[start + m0 + i, by, j] = T.cast(o[i, j] / l_i[i], dtype)
            for i in T.Parallel(block_m):
                if m0 + i < seq_len:
                    LSE[by, start + m0 + i] = m_i[i] + T.log2(l_i[i])

    return main


BWD_BLOCK_M, BWD_BLOCK_N = 32, 64  # q tiles of 32 keep Q, dO, K, V, P and dS within 64 KiB of shared memory


def bwd_program(
    heads: int,
    dim: int,
    dtype: str,
    block_m: int = BWD_BLOCK_M,
    block_n: int = BWD_BLOCK_N,
    threads: int = THREADS,
):
    """The flash-attention backward: one program per (key tile, head, sample) walks the sample's query
    tiles, keeps dK and dV in registers and adds each tile's dQ atomically (fp32). Outputs: DK (index 8),
    DV (index 9); DQ (index 10) is passed in zeroed. Delta = rowsum(dO * O) comes in [H, T]."""
    TT = T.symbolic("tt")
    B1 = T.symbolic("b1")
    acc = "float32"

    @T.prim_func
    def main(
        Q: T.Tensor((TT, heads, dim), dtype),
        K: T.Tensor((TT, heads, dim), dtype),
        V: T.Tensor((TT, heads, dim), dtype),
        DO: T.Tensor((TT, heads, dim), dtype),
        LSE: T.Tensor((heads, TT), acc),
        DELTA: T.Tensor((heads, TT), acc),
        CU: T.Tensor((B1,), "int32"),
        max_seqlen: T.int32,
        DK: T.Tensor((TT, heads, dim), dtype),
        DV: T.Tensor((TT, heads, dim), dtype),
        DQ: T.Tensor((TT, heads, dim), acc),
        qk_scale: T.float32,
        sm_scale: T.float32,
    ):
        with T.Kernel(T.ceildiv(max_seqlen, block_n), heads, B1 - 1, threads=threads) as (bx, by, bz):
            k_s = T.alloc_shared((block_n, dim), dtype)
            v_s = T.alloc_shared((block_n, dim), dtype)
            q_s = T.alloc_shared((block_m, dim), dtype)
            do_s = T.alloc_shared((block_m, dim), dtype)
            p_cast = T.alloc_shared((block_m, block_n), dtype)
            ds_cast = T.alloc_shared((block_m, block_n), dtype)
            s = T.alloc_fragment((block_m, block_n), acc)
            dp = T.alloc_fragment((block_m, block_n), acc)
            dq = T.alloc_fragment((block_m, dim), acc)
            dk = T.alloc_fragment((block_n, dim), acc)
            dv = T.alloc_fragment((block_n, dim), acc)
            lse = T.alloc_fragment((block_m,), acc)
            delta = T.alloc_fragment((block_m,), acc)

            start = CU[bz]
            seq_len = CU[bz + 1] - start
            n0 = bx * block_n
            for i, j in T.Parallel(block_n, dim):
                k_s[i, j] = T.if_then_else(n0 + i < seq_len, K[start + n0 + i, by, j], 0)
                v_s[i, j] = T.if_then_else(n0 + i < seq_len, V[start + n0 + i, by, j], 0)
            T.fill(dk, 0)
            T.fill(dv, 0)
            for qb in T.serial(T.ceildiv(seq_len, block_m)):
                m0 = qb * block_m
                for i, j in T.Parallel(block_m, dim):
                    q_s[i, j] = T.if_then_else(m0 + i < seq_len, Q[start + m0 + i, by, j], 0)
                    do_s[i, j] = T.if_then_else(m0 + i < seq_len, DO[start + m0 + i, by, j], 0)
                for i in T.Parallel(block_m):
                    lse[i] = T.if_then_else(m0 + i < seq_len, LSE[by, start + m0 + i], 0)
                    delta[i] = T.if_then_else(m0 + i < seq_len, DELTA[by, start + m0 + i], 0)
                T.clear(s)
                T.gemm(q_s, k_s, s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                for i, j in T.Parallel(block_m, block_n):  # P, zero outside both sequences
                    s[i, j] = T.if_then_else(
                        (m0 + i < seq_len) & (n0 + j < seq_len), T.exp2(s[i, j] * qk_scale - lse[i]), 0
                    )
                T.copy(s, p_cast)
                T.gemm(p_cast, do_s, dv, transpose_A=True, policy=T.GemmWarpPolicy.FullRow)
                T.clear(dp)
                T.gemm(do_s, v_s, dp, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                for i, j in T.Parallel(block_m, block_n):
                    dp[i, j] = s[i, j] * (dp[i, j] - delta[i])
                T.copy(dp, ds_cast)
                T.gemm(ds_cast, q_s, dk, transpose_A=True, policy=T.GemmWarpPolicy.FullRow)
                T.clear(dq)
                T.gemm(ds_cast, k_s, dq, policy=T.GemmWarpPolicy.FullRow)
                for i, j in T.Parallel(block_m, dim):
                    if m0 + i < seq_len:
                        T.atomic_add(DQ[start + m0 + i, by, j], dq[i, j] * sm_scale)
            for i, j in T.Parallel(block_n, dim):
                if n0 + i < seq_len:
                    DK[start + n0 + i, by, j] = T.cast(dk[i, j] * sm_scale, dtype)
                    DV[start + n0 + i, by, j] = T.cast(dv[i, j], dtype)

    return main


@functools.cache
def _fwd_kernel(heads: int, dim: int, dtype: str):
    return tilelang.compile(fwd_program(heads, dim, dtype), out_idx=[5, 6])


@functools.cache
def _bwd_kernel(heads: int, dim: int, dtype: str):
    return tilelang.compile(bwd_program(heads, dim, dtype), out_idx=[8, 9])


def _backward_tilelang(q, k, v, o, lse, cu, max_seqlen, sm_scale, do):
    T_, H, D = q.shape
    delta = (do.float() * o.float()).sum(-1).t().contiguous()  # [H, T], rowsum(dO * O)
    dq = torch.zeros(T_, H, D, device=q.device, dtype=torch.float32)
    dk, dv = _bwd_kernel(H, D, DTYPE[q.dtype])(
        q, k, v, do, lse, delta, cu, max_seqlen, dq, sm_scale * LOG2E, sm_scale
    )
    return dq.to(q.dtype), dk, dv


def _backward_triton(q, k, v, o, lse, cu, max_seqlen, sm_scale, do):
    from . import triton as tri

    ctx = type("Ctx", (), {})()
    ctx.saved_tensors = (q, k, v, o, lse, cu)
    ctx.max_seqlen, ctx.sm_scale = max_seqlen, sm_scale
    return tri._VarlenAttention.backward(ctx, do)[:3]


class _VarlenAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens, max_seqlen, scale):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        T_, H, D = q.shape
        cu = cu_seqlens.to(torch.int32).contiguous()
        sm_scale = scale if scale is not None else 1.0 / math.sqrt(D)
        o, lse = _fwd_kernel(H, D, DTYPE[q.dtype])(q, k, v, cu, int(max_seqlen), sm_scale * LOG2E)
        ctx.save_for_backward(q, k, v, o, lse, cu)
        ctx.max_seqlen, ctx.sm_scale, ctx.scale = int(max_seqlen), sm_scale, scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, cu = ctx.saved_tensors
        args = (q, k, v, o, lse, cu, ctx.max_seqlen, ctx.sm_scale, do.contiguous())
        try:
            return (*_backward_tilelang(*args), None, None, None)
        except Exception as e:  # the backward kernel does not build here: Triton's, else recompute
            log_once(log, f"varlen_attention: TileLang backward unavailable ({type(e).__name__}: {e})")
        major = torch.cuda.get_device_capability(q.device)[0] if q.is_cuda else 0
        if major * 10 >= 75 or major >= 8:
            try:
                return (*_backward_triton(*args), None, None, None)
            except ImportError:
                pass
        with torch.enable_grad():  # recompute through the reference
            qr, kr, vr = (t.detach().requires_grad_(True) for t in (q, k, v))
            out = _eager(qr, kr, vr, cu, ctx.max_seqlen, ctx.scale)
            dq, dk, dv = torch.autograd.grad(out, (qr, kr, vr), do)
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


def programs_for_check() -> list[tuple[str, object]]:
    """The forward and backward at the moss-image-5b head shape, for a lowering check without a GPU."""
    return [("fwd", fwd_program(24, 128, "float16")), ("bwd", bwd_program(24, 128, "float16"))]


varlen_attention.device_lengths = True  # cu_seqlens read on the device: graph-safe across lengths

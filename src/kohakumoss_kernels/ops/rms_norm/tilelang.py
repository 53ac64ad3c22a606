"""RMSNorm in TileLang (the sm70/sm75 path): a tile of rows per program, fp32 sums.

Forward and the input gradient are TileLang kernels; the weight gradient is one torch reduction
over rows. Compiled once per (d, dtype) for any token count (the row count is symbolic).
"""

# no `from __future__ import annotations`: TileLang evaluates the kernels' annotations itself

import functools

import tilelang
import tilelang.language as T
import torch

from ...backends.tilelang_utils import DTYPE
from ...backends.tilelang_utils import supports as supports

BLOCK_M = 4


def fwd_program(d: int, dtype: str, has_w: bool, block_m: int = BLOCK_M, threads: int = 128):
    """The forward as a TileLang program (Y and RSTD are its outputs 2 and 3)."""
    M = T.symbolic("m")

    @T.prim_func
    def main(
        X: T.Tensor((M, d), dtype),
        W: T.Tensor((d,), dtype),
        Y: T.Tensor((M, d), dtype),
        RSTD: T.Tensor((M,), "float32"),
        eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(M, block_m), threads=threads) as bx:
            x = T.alloc_fragment((block_m, d), "float32")
            sq = T.alloc_fragment((block_m, d), "float32")
            ss = T.alloc_fragment((block_m,), "float32")
            for i, j in T.Parallel(block_m, d):
                x[i, j] = T.if_then_else(bx * block_m + i < M, T.cast(X[bx * block_m + i, j], "float32"), 0.0)
            for i, j in T.Parallel(block_m, d):
                sq[i, j] = x[i, j] * x[i, j]
            T.reduce_sum(sq, ss, dim=1)
            for i in T.Parallel(block_m):
                ss[i] = T.rsqrt(ss[i] / d + eps)
            for i, j in T.Parallel(block_m, d):
                if bx * block_m + i < M:
                    if has_w:
                        Y[bx * block_m + i, j] = T.cast(x[i, j] * ss[i] * T.cast(W[j], "float32"), dtype)
                    else:
                        Y[bx * block_m + i, j] = T.cast(x[i, j] * ss[i], dtype)
            for i in T.Parallel(block_m):
                if bx * block_m + i < M:
                    RSTD[bx * block_m + i] = ss[i]

    return main


def bwd_program(d: int, dtype: str, has_w: bool, block_m: int = BLOCK_M, threads: int = 128):
    """The input gradient as a TileLang program (DX is output 4)."""
    M = T.symbolic("m")

    @T.prim_func
    def main(
        DY: T.Tensor((M, d), dtype),
        X: T.Tensor((M, d), dtype),
        W: T.Tensor((d,), dtype),
        RSTD: T.Tensor((M,), "float32"),
        DX: T.Tensor((M, d), dtype),
    ):
        with T.Kernel(T.ceildiv(M, block_m), threads=threads) as bx:
            xh = T.alloc_fragment((block_m, d), "float32")
            g = T.alloc_fragment((block_m, d), "float32")
            prod = T.alloc_fragment((block_m, d), "float32")
            dot = T.alloc_fragment((block_m,), "float32")
            r = T.alloc_fragment((block_m,), "float32")
            for i in T.Parallel(block_m):
                r[i] = T.if_then_else(bx * block_m + i < M, RSTD[bx * block_m + i], 0.0)
            for i, j in T.Parallel(block_m, d):
                xh[i, j] = T.if_then_else(
                    bx * block_m + i < M, T.cast(X[bx * block_m + i, j], "float32") * r[i], 0.0
                )
                g[i, j] = T.if_then_else(
                    bx * block_m + i < M, T.cast(DY[bx * block_m + i, j], "float32"), 0.0
                )
            if has_w:
                for i, j in T.Parallel(block_m, d):
                    g[i, j] = g[i, j] * T.cast(W[j], "float32")
            for i, j in T.Parallel(block_m, d):
                prod[i, j] = g[i, j] * xh[i, j]
            T.reduce_sum(prod, dot, dim=1)
            for i, j in T.Parallel(block_m, d):
                if bx * block_m + i < M:
                    DX[bx * block_m + i, j] = T.cast(r[i] * (g[i, j] - xh[i, j] * dot[i] / d), dtype)

    return main


@functools.cache
def _fwd_kernel(d: int, dtype: str, has_w: bool):
    return tilelang.compile(fwd_program(d, dtype, has_w), out_idx=[2, 3])


@functools.cache
def _bwd_kernel(d: int, dtype: str, has_w: bool):
    return tilelang.compile(bwd_program(d, dtype, has_w), out_idx=[4])


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).contiguous()
        d = x2.shape[1]
        w = weight.contiguous() if weight is not None else torch.ones(d, device=x.device, dtype=x.dtype)
        y, rstd = _fwd_kernel(d, DTYPE[x.dtype], weight is not None)(x2, w, float(eps))
        ctx.save_for_backward(x2, w, rstd)
        ctx.shape, ctx.has_w = shape, weight is not None
        return y.reshape(shape)

    @staticmethod
    def backward(ctx, dy):
        x2, w, rstd = ctx.saved_tensors
        d = x2.shape[1]
        dy2 = dy.reshape(-1, d).contiguous()
        dx = _bwd_kernel(d, DTYPE[x2.dtype], ctx.has_w)(dy2, x2, w, rstd)
        dw = None
        if ctx.has_w:
            dw = (dy2.float() * x2.float() * rstd[:, None]).sum(0).to(w.dtype)
        return dx.reshape(ctx.shape), dw, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    return _RMSNorm.apply(x, weight, eps)


def programs_for_check() -> list[tuple[str, object]]:
    """The programs at the moss-image-5b width, for a lowering check without a GPU."""
    return [("fwd", fwd_program(3072, "float16", True)), ("bwd", bwd_program(3072, "float16", True))]

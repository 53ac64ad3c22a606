"""QK-norm + RoPE in TileLang (the sm70/sm75 path): per-head RMSNorm and the half-split rotation in one
pass over a tile of head-rows (x [T, H, D] viewed as T*H rows of D; a row's cos/sin is its token's).

Forward and input gradient are TileLang kernels; the backward also writes each program's partial weight
gradient, summed by torch afterwards (deterministic, no atomics). Compiled once per (heads, D, dtype,
weight or not) for any token count.
"""

# no `from __future__ import annotations`: TileLang evaluates the kernels' annotations itself

import functools

import tilelang
import tilelang.language as T
import torch

from ...backends.tilelang_utils import DTYPE
from ...backends.tilelang_utils import supports as supports

BLOCK_M = 16  # head-rows per program: 16 x 128 fp32 values per tensor, spread over 128 threads


def fwd_program(heads: int, dim: int, dtype: str, has_w: bool, block_m: int = BLOCK_M, threads: int = 128):
    """Outputs: Y (index 4) and RSTD (index 5)."""
    R, TT = T.symbolic("r"), T.symbolic("tt")
    half = dim // 2

    @T.prim_func
    def main(
        X: T.Tensor((R, dim), dtype),
        W: T.Tensor((dim,), dtype),
        COS: T.Tensor((TT, half), "float32"),
        SIN: T.Tensor((TT, half), "float32"),
        Y: T.Tensor((R, dim), dtype),
        RSTD: T.Tensor((R,), "float32"),
        eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(R, block_m), threads=threads) as bx:
            x1 = T.alloc_fragment((block_m, half), "float32")
            x2 = T.alloc_fragment((block_m, half), "float32")
            sq = T.alloc_fragment((block_m, half), "float32")
            r = T.alloc_fragment((block_m,), "float32")
            for i, j in T.Parallel(block_m, half):
                x1[i, j] = T.if_then_else(
                    bx * block_m + i < R, T.cast(X[bx * block_m + i, j], "float32"), 0.0
                )
                x2[i, j] = T.if_then_else(
                    bx * block_m + i < R, T.cast(X[bx * block_m + i, j + half], "float32"), 0.0
                )
            for i, j in T.Parallel(block_m, half):
                sq[i, j] = x1[i, j] * x1[i, j] + x2[i, j] * x2[i, j]
            T.reduce_sum(sq, r, dim=1)
            for i in T.Parallel(block_m):
                r[i] = T.rsqrt(r[i] / dim + eps)
            for i, j in T.Parallel(block_m, half):
                if has_w:
                    x1[i, j] = x1[i, j] * r[i] * T.cast(W[j], "float32")
                    x2[i, j] = x2[i, j] * r[i] * T.cast(W[j + half], "float32")
                else:
                    x1[i, j] = x1[i, j] * r[i]
                    x2[i, j] = x2[i, j] * r[i]
            for i, j in T.Parallel(block_m, half):
                if bx * block_m + i < R:
                    c = COS[(bx * block_m + i) // heads, j]
                    s = SIN[(bx * block_m + i) // heads, j]
                    Y[bx * block_m + i, j] = T.cast(x1[i, j] * c - x2[i, j] * s, dtype)
                    Y[bx * block_m + i, j + half] = T.cast(x2[i, j] * c + x1[i, j] * s, dtype)
            for i in T.Parallel(block_m):
                if bx * block_m + i < R:
                    RSTD[bx * block_m + i] = r[i]

    return main


def bwd_program(heads: int, dim: int, dtype: str, has_w: bool, block_m: int = BLOCK_M, threads: int = 128):
    """Output: DX (index 6); DWP [programs, dim] (index 7, passed in) gets each program's weight-grad sum."""
    R, TT, P = T.symbolic("r"), T.symbolic("tt"), T.symbolic("p")
    half = dim // 2

    @T.prim_func
    def main(
        DY: T.Tensor((R, dim), dtype),
        X: T.Tensor((R, dim), dtype),
        W: T.Tensor((dim,), dtype),
        COS: T.Tensor((TT, half), "float32"),
        SIN: T.Tensor((TT, half), "float32"),
        RSTD: T.Tensor((R,), "float32"),
        DX: T.Tensor((R, dim), dtype),
        DWP: T.Tensor((P, dim), "float32"),
    ):
        with T.Kernel(T.ceildiv(R, block_m), threads=threads) as bx:
            h1 = T.alloc_fragment((block_m, half), "float32")  # x * rstd
            h2 = T.alloc_fragment((block_m, half), "float32")
            d1 = T.alloc_fragment((block_m, half), "float32")  # grad of the normed x (before the weight)
            d2 = T.alloc_fragment((block_m, half), "float32")
            prod = T.alloc_fragment((block_m, half), "float32")
            part = T.alloc_fragment((half,), "float32")
            r = T.alloc_fragment((block_m,), "float32")
            dot = T.alloc_fragment((block_m,), "float32")
            for i in T.Parallel(block_m):
                r[i] = T.if_then_else(bx * block_m + i < R, RSTD[bx * block_m + i], 0.0)
            for i, j in T.Parallel(block_m, half):
                h1[i, j] = T.if_then_else(
                    bx * block_m + i < R, T.cast(X[bx * block_m + i, j], "float32") * r[i], 0.0
                )
                h2[i, j] = T.if_then_else(
                    bx * block_m + i < R, T.cast(X[bx * block_m + i, j + half], "float32") * r[i], 0.0
                )
            for i, j in T.Parallel(block_m, half):  # the rotation's transpose
                c = T.if_then_else(bx * block_m + i < R, COS[(bx * block_m + i) // heads, j], 0.0)
                s = T.if_then_else(bx * block_m + i < R, SIN[(bx * block_m + i) // heads, j], 0.0)
                g1 = T.if_then_else(bx * block_m + i < R, T.cast(DY[bx * block_m + i, j], "float32"), 0.0)
                g2 = T.if_then_else(
                    bx * block_m + i < R, T.cast(DY[bx * block_m + i, j + half], "float32"), 0.0
                )
                d1[i, j] = g1 * c + g2 * s
                d2[i, j] = g2 * c - g1 * s
            if has_w:
                for i, j in T.Parallel(block_m, half):
                    prod[i, j] = d1[i, j] * h1[i, j]
                T.reduce_sum(prod, part, dim=0)
                for j in T.Parallel(half):
                    DWP[bx, j] = part[j]
                for i, j in T.Parallel(block_m, half):
                    prod[i, j] = d2[i, j] * h2[i, j]
                T.reduce_sum(prod, part, dim=0)
                for j in T.Parallel(half):
                    DWP[bx, j + half] = part[j]
                for i, j in T.Parallel(block_m, half):
                    d1[i, j] = d1[i, j] * T.cast(W[j], "float32")
                    d2[i, j] = d2[i, j] * T.cast(W[j + half], "float32")
            for i, j in T.Parallel(block_m, half):
                prod[i, j] = d1[i, j] * h1[i, j] + d2[i, j] * h2[i, j]
            T.reduce_sum(prod, dot, dim=1)
            for i, j in T.Parallel(block_m, half):
                if bx * block_m + i < R:
                    DX[bx * block_m + i, j] = T.cast(r[i] * (d1[i, j] - h1[i, j] * dot[i] / dim), dtype)
                    DX[bx * block_m + i, j + half] = T.cast(
                        r[i] * (d2[i, j] - h2[i, j] * dot[i] / dim), dtype
                    )

    return main


@functools.cache
def _fwd_kernel(heads: int, dim: int, dtype: str, has_w: bool):
    return tilelang.compile(fwd_program(heads, dim, dtype, has_w), out_idx=[4, 5])


@functools.cache
def _bwd_kernel(heads: int, dim: int, dtype: str, has_w: bool):
    return tilelang.compile(bwd_program(heads, dim, dtype, has_w), out_idx=[6])


class _QKNormRope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, cos, sin, eps):
        T_, H, D = x.shape
        x2 = x.reshape(T_ * H, D).contiguous()
        w = weight.contiguous() if weight is not None else torch.ones(D, device=x.device, dtype=x.dtype)
        cos, sin = cos.float().contiguous(), sin.float().contiguous()
        y, rstd = _fwd_kernel(H, D, DTYPE[x.dtype], weight is not None)(x2, w, cos, sin, float(eps))
        ctx.save_for_backward(x2, w, cos, sin, rstd)
        ctx.shape, ctx.has_w = x.shape, weight is not None
        return y.reshape(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x2, w, cos, sin, rstd = ctx.saved_tensors
        T_, H, D = ctx.shape
        programs = -(-x2.shape[0] // BLOCK_M)
        dwp = torch.empty(programs, D, device=x2.device, dtype=torch.float32)
        dy2 = dy.reshape(T_ * H, D).contiguous()
        dx = _bwd_kernel(H, D, DTYPE[x2.dtype], ctx.has_w)(dy2, x2, w, cos, sin, rstd, dwp)
        dw = dwp.sum(0).to(w.dtype) if ctx.has_w else None
        return dx.reshape(ctx.shape), dw, None, None, None


def qk_norm_rope(
    x: torch.Tensor, weight: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor, eps: float = 1e-6
) -> torch.Tensor:
    return _QKNormRope.apply(x, weight, cos, sin, eps)


def programs_for_check() -> list[tuple[str, object]]:
    """The programs at the moss-image-5b head shape, for a lowering check without a GPU."""
    return [
        ("fwd", fwd_program(24, 128, "float16", True)),
        ("bwd", bwd_program(24, 128, "float16", True)),
    ]

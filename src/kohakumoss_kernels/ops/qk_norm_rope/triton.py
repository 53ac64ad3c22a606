"""QK-norm + RoPE in Triton: per-head RMSNorm (with weight) and the half-split rotation in one pass.

x [T, H, D] is viewed as T*H rows of D; a program takes a tile of ROWS head-rows (the rotation's
cos/sin row is the token, row // H), or, as a launch candidate of its own, one token with all its heads. The backward walks a chunk of tiles per program (next tile's
loads issued first) and writes one partial weight gradient per program, summed afterwards
(deterministic, no atomics).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...backends import pdl, stream
from ...backends import sample_sums as ss
from ...backends.triton_utils import (
    backward_configs,
    next_pow2,
    persistent_programs,
    pick,
    register_budget,
    size_bucket,
    tile_configs,
)
from ...backends.triton_utils import supports as supports


@triton.jit
def _cos_sin(COS, SIN, row0, rid, H, half, cols, mask):
    """The rotation's cos and sin rows of head-rows row0 + rid (token = row // H): one int64 division per
    tile, the rows' tokens as int32 offsets from its token (per-element int64 offsets cost registers)."""
    tok0 = row0 // H
    off = ((row0 - tok0 * H).to(tl.int32) + rid)[:, None] // H * half + cols[None, :]
    return tl.load(COS + tok0 * half + off, mask=mask, other=0.0), tl.load(
        SIN + tok0 * half + off, mask=mask, other=0.0
    )


@triton.jit
def _qk_norm_rope_fwd(
    X, W, COS, SIN, OUT, RSTD, R, H, half, eps, HAS_W: tl.constexpr, ROWS: tl.constexpr, BD: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    pdl.wait_inputs(PDL)
    row0 = tl.program_id(0).to(tl.int64) * ROWS
    rid = tl.arange(0, ROWS)
    cols = tl.arange(0, BD)
    rmask = rid < R - row0
    cmask = cols < half
    mask = rmask[:, None] & cmask[None, :]
    loc = rid[:, None] * (2 * half) + cols[None, :]
    base = X + row0 * (2 * half)
    x1 = tl.load(base + loc, mask=mask, other=0.0, eviction_policy=stream.LOAD).to(tl.float32)
    x2 = tl.load(base + loc + half, mask=mask, other=0.0, eviction_policy=stream.LOAD).to(tl.float32)
    c, s = _cos_sin(COS, SIN, row0, rid, H, half, cols, mask)
    rstd = 1.0 / tl.sqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * half) + eps)
    n1 = x1 * rstd[:, None]
    n2 = x2 * rstd[:, None]
    if HAS_W:
        n1 = n1 * tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
        n2 = n2 * tl.load(W + half + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    n1 = n1.to(OUT.dtype.element_ty).to(tl.float32)  # the reference rounds between norm and rope
    n2 = n2.to(OUT.dtype.element_ty).to(tl.float32)
    out = OUT + row0 * (2 * half)
    tl.store(out + loc, (n1 * c - n2 * s).to(OUT.dtype.element_ty), mask=mask, cache_modifier=stream.STORE)
    tl.store(
        out + loc + half, (n2 * c + n1 * s).to(OUT.dtype.element_ty), mask=mask, cache_modifier=stream.STORE
    )
    tl.store(RSTD + row0 + rid, rstd, mask=rmask)


@triton.jit
def _qk_norm_rope_fwd_token(
    X, W, COS, SIN, OUT, RSTD, H, half, eps, HAS_W: tl.constexpr, BH: tl.constexpr, BD: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """The forward with one token (all its heads) per program: one cos/sin row shared by the heads."""
    pdl.wait_inputs(PDL)
    t = tl.program_id(0).to(tl.int64)
    heads = tl.arange(0, BH)[:, None]
    cols = tl.arange(0, BD)[None, :]
    mask = (heads < H) & (cols < half)
    base = t * H * 2 * half + heads * 2 * half + cols
    x1 = tl.load(X + base, mask=mask, other=0.0, eviction_policy=stream.LOAD).to(tl.float32)
    x2 = tl.load(X + base + half, mask=mask, other=0.0, eviction_policy=stream.LOAD).to(tl.float32)
    rstd = 1.0 / tl.sqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * half) + eps)
    n1 = x1 * rstd[:, None]
    n2 = x2 * rstd[:, None]
    if HAS_W:
        n1 = n1 * tl.load(W + cols, mask=cols < half, other=0.0).to(tl.float32)
        n2 = n2 * tl.load(W + half + cols, mask=cols < half, other=0.0).to(tl.float32)
    n1 = n1.to(OUT.dtype.element_ty).to(tl.float32)
    n2 = n2.to(OUT.dtype.element_ty).to(tl.float32)
    c = tl.load(COS + t * half + cols, mask=cols < half, other=0.0)
    s = tl.load(SIN + t * half + cols, mask=cols < half, other=0.0)
    tl.store(OUT + base, (n1 * c - n2 * s).to(OUT.dtype.element_ty), mask=mask, cache_modifier=stream.STORE)
    tl.store(
        OUT + base + half, (n2 * c + n1 * s).to(OUT.dtype.element_ty), mask=mask, cache_modifier=stream.STORE
    )
    tl.store(RSTD + t * H + tl.arange(0, BH), rstd, mask=tl.arange(0, BH) < H)


@triton.jit
def _qk_norm_rope_bwd(
    DY, X, W, COS, SIN, RSTD, DX, DW, R, H, half, tiles_per_prog, HAS_W: tl.constexpr, NEED_DW: tl.constexpr,
    ROWS: tl.constexpr, BD: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    pdl.wait_inputs(PDL)
    pid = tl.program_id(0)
    rid = tl.arange(0, ROWS)
    cols = tl.arange(0, BD)
    cmask = cols < half
    loc = rid[:, None] * (2 * half) + cols[None, :]
    w1 = tl.full([1, BD], 1.0, tl.float32)
    w2 = tl.full([1, BD], 1.0, tl.float32)
    if HAS_W:
        w1 = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
        w2 = tl.load(W + half + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    dw1 = tl.zeros([ROWS, BD], dtype=tl.float32)
    dw2 = tl.zeros([ROWS, BD], dtype=tl.float32)
    start = pid.to(tl.int64) * tiles_per_prog * ROWS
    end = tl.minimum(start + tiles_per_prog * ROWS, R)
    n = tl.cdiv(end - start, ROWS)
    row = start
    rmask = rid < end - row
    mask = rmask[:, None] & cmask[None, :]
    x1n = tl.load(X + row * (2 * half) + loc, mask=mask, other=0.0, eviction_policy=stream.LOAD)
    x2n = tl.load(X + row * (2 * half) + loc + half, mask=mask, other=0.0, eviction_policy=stream.LOAD)
    d1n = tl.load(DY + row * (2 * half) + loc, mask=mask, other=0.0, eviction_policy=stream.LOAD)
    d2n = tl.load(DY + row * (2 * half) + loc + half, mask=mask, other=0.0, eviction_policy=stream.LOAD)
    rstd_next = tl.load(RSTD + row + rid, mask=rmask, other=0.0)
    for _ in range(0, n):
        x1 = x1n.to(tl.float32)
        x2 = x2n.to(tl.float32)
        dy1 = d1n.to(tl.float32)
        dy2 = d2n.to(tl.float32)
        rstd = rstd_next[:, None]
        cur_row, cur_mask = row, mask
        row += ROWS  # issue the next tile's loads first
        rmask = rid < end - row
        mask = rmask[:, None] & cmask[None, :]
        x1n = tl.load(X + row * (2 * half) + loc, mask=mask, other=0.0, eviction_policy=stream.LOAD)
        x2n = tl.load(X + row * (2 * half) + loc + half, mask=mask, other=0.0, eviction_policy=stream.LOAD)
        d1n = tl.load(DY + row * (2 * half) + loc, mask=mask, other=0.0, eviction_policy=stream.LOAD)
        d2n = tl.load(DY + row * (2 * half) + loc + half, mask=mask, other=0.0, eviction_policy=stream.LOAD)
        rstd_next = tl.load(RSTD + row + rid, mask=rmask, other=0.0)
        c, s = _cos_sin(COS, SIN, cur_row, rid, H, half, cols, cur_mask)
        dn1 = dy1 * c + dy2 * s
        dn2 = dy2 * c - dy1 * s
        xh1 = x1 * rstd
        xh2 = x2 * rstd
        g1 = dn1 * w1
        g2 = dn2 * w2
        dot = (tl.sum(g1 * xh1, axis=1) + tl.sum(g2 * xh2, axis=1))[:, None] / (2 * half)
        dx = DX + cur_row * (2 * half)
        tl.store(
            dx + loc,
            (rstd * (g1 - xh1 * dot)).to(DX.dtype.element_ty),
            mask=cur_mask,
            cache_modifier=stream.STORE,
        )
        tl.store(
            dx + loc + half,
            (rstd * (g2 - xh2 * dot)).to(DX.dtype.element_ty),
            mask=cur_mask,
            cache_modifier=stream.STORE,
        )
        if NEED_DW:  # a frozen weight (LoRA training) needs no gradient: no sums, no partials
            dw1 += dn1 * xh1
            dw2 += dn2 * xh2
    if NEED_DW:
        tl.store(DW + pid.to(tl.int64) * 2 * half + cols, tl.sum(dw1, axis=0), mask=cmask)
        tl.store(DW + pid.to(tl.int64) * 2 * half + half + cols, tl.sum(dw2, axis=0), mask=cmask)


class _QKNormRope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, cos, sin, eps):
        x = x.contiguous()
        cos, sin = cos.float().contiguous(), sin.float().contiguous()
        T, H, D = x.shape
        R = T * H
        out = torch.empty_like(x)
        rstd = torch.empty(T, H, device=x.device, dtype=torch.float32)
        bd = next_pow2(D // 2)
        w = weight.contiguous() if weight is not None else x

        def launch(cfg):
            rows, warps = cfg
            if rows == 0:  # one token per program
                _qk_norm_rope_fwd_token[(T,)](
                    x, w, cos, sin, out, rstd, H, D // 2, eps,
                    HAS_W=weight is not None, BH=next_pow2(H), BD=bd, num_warps=warps, **pdl.options(x),
                )  # fmt: skip
                return
            _qk_norm_rope_fwd[(triton.cdiv(R, rows),)](
                x, w, cos, sin, out, rstd, R, H, D // 2, eps,
                HAS_W=weight is not None, ROWS=rows, BD=bd, num_warps=warps, **pdl.options(x),
            )  # fmt: skip

        if R:
            key = (H, D, x.dtype, size_bucket(R), x.device)
            tiles = tile_configs(2 * bd, min_rows=2, max_per_thread=64)
            launch(pick("qk_norm_rope.fwd", key, tiles + [(0, 4), (0, 8)], launch))
        ctx.save_for_backward(x, weight, cos, sin, rstd)
        return out

    @staticmethod
    def backward(ctx, dy):
        x, weight, cos, sin, rstd = ctx.saved_tensors
        T, H, D = x.shape
        R = T * H
        dy = dy.contiguous()
        dx = torch.empty_like(x)
        bd = next_pow2(D // 2)
        has_w = weight is not None
        need_dw = has_w and ctx.needs_input_grad[1]
        grads = {}

        def launch(cfg):
            rows, warps, per_sm = cfg
            tiles = triton.cdiv(R, rows)
            grid = persistent_programs(x, tiles, per_sm)
            dw = torch.empty(grid, D, device=x.device, dtype=torch.float32) if need_dw else rstd
            _qk_norm_rope_bwd[(grid,)](
                dy, x, weight if has_w else x, cos, sin, rstd, dx, dw, R, H, D // 2,
                triton.cdiv(tiles, grid), HAS_W=has_w, NEED_DW=need_dw, ROWS=rows, BD=bd, num_warps=warps,
                **register_budget(x, warps, per_sm), **pdl.options(x),
            )  # fmt: skip
            grads["dw"] = ss.sum_rows(dw, weight.dtype) if need_dw else None  # timed with the pick

        key = (H, D, x.dtype, size_bucket(R), x.device)
        name = "qk_norm_rope.bwd" if need_dw else "qk_norm_rope.bwd_nodw"  # another kernel: its own pick
        launch(pick(name, key, backward_configs(2 * bd, min_rows=2), launch))
        return dx, grads["dw"], None, None, None


def qk_norm_rope(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float = 1e-6,
) -> torch.Tensor:
    return _QKNormRope.apply(x, weight, cos, sin, eps)

"""norm_modulate in Triton: rms_norm(x) * (1 + scale[s]) + shift[s], a tile of ROWS rows per program.

The backward walks a chunk of row tiles per program (next tile's loads issued first) and sums
d(scale), d(shift) per sample in registers; per-program partials are added by sample_sums.finish.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import sample_sums as ss
from ...triton_utils import pick, row_configs, row_key, row_launch
from ...triton_utils import supports as supports


@triton.jit
def _norm_modulate_fwd(X, SHIFT, SCALE, TS, Y, RSTD, T, d, eps, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    # one int64 base per tile, int32 offsets within it: per-element int64 offsets cost registers
    row0 = tl.program_id(0).to(tl.int64) * ROWS
    rid = tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    rmask = rid < T - row0
    mask = rmask[:, None] & (cols < d)[None, :]
    loc = rid[:, None] * d + cols[None, :]
    s = tl.load(TS + row0 + rid, mask=rmask, other=0).to(tl.int32)
    x = tl.load(X + row0 * d + loc, mask=mask, other=0.0).to(tl.float32)
    poff = s[:, None] * d + cols[None, :]
    sc = tl.load(SCALE + poff, mask=mask, other=0.0).to(tl.float32)
    sh = tl.load(SHIFT + poff, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / d + eps)
    y = x * rstd[:, None] * (1.0 + sc) + sh
    tl.store(Y + row0 * d + loc, y.to(Y.dtype.element_ty), mask=mask)
    tl.store(RSTD + row0 + rid, rstd, mask=rmask)


@triton.jit
def _load_tile(X, DY, DRES, RSTD, TS, row, end, rid, loc, cmask, d, HAS_RES: tl.constexpr):
    """The tile of rows from `row` (masked to the chunk's end): its mask, x, dy, the residual's gradient
    (HAS_RES; else x again, unused), rstd, samples (-1 past it)."""
    rmask = rid < end - row
    mask = rmask[:, None] & cmask[None, :]
    x = tl.load(X + row * d + loc, mask=mask, other=0.0)
    dy = tl.load(DY + row * d + loc, mask=mask, other=0.0)
    if HAS_RES:
        dres = tl.load(DRES + row * d + loc, mask=mask, other=0.0)
    else:
        dres = x
    rstd = tl.load(RSTD + row + rid, mask=rmask, other=0.0)
    s = tl.load(TS + row + rid, mask=rmask, other=-1).to(tl.int64)
    return mask, x, dy, dres, rstd, s


@triton.jit
def _norm_modulate_bwd(
    DY, X, SCALE, TS, RSTD, DX, DRES, HAS_RES: tl.constexpr, P, D, FIRST, LAST, T, d, tiles_per_prog,
    NEED_SUMS: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    cmask = cols < d
    rid = tl.arange(0, ROWS)
    loc = rid[:, None] * d + cols[None, :]  # int32 within the tile; the tile's base row is one int64
    start, end, n, first = ss.chunk(TS, pid, tiles_per_prog, T, ROWS)
    cur = first
    seg = pid * 0
    acc_sc = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
    acc_sh = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
    row = start
    mask, x_next, dy_next, dres_next, rstd_next, s_next = _load_tile(
        X, DY, DRES, RSTD, TS, row, end, rid, loc, cmask, d, HAS_RES
    )
    for _ in range(0, n):
        x = x_next.to(tl.float32)
        dy = dy_next.to(tl.float32)
        dres = dres_next
        rstd = rstd_next[:, None]
        s = s_next  # -1: a row past the chunk (its contributions are zero)
        cur_row, cur_mask = row, mask
        row += ROWS  # issue the next tile's loads first
        mask, x_next, dy_next, dres_next, rstd_next, s_next = _load_tile(
            X, DY, DRES, RSTD, TS, row, end, rid, loc, cmask, d, HAS_RES
        )
        poff = tl.maximum(s, 0).to(tl.int32)[:, None] * d + cols[None, :]
        sc = tl.load(SCALE + poff, mask=cur_mask, other=0.0).to(tl.float32)
        xhat = x * rstd
        g = dy * (1.0 + sc)
        dx = rstd * (g - xhat * (tl.sum(g * xhat, axis=1) / d)[:, None])
        if HAS_RES:  # fork: the gradient x got through its other use (prefetched with the tile), added here
            dx += dres.to(tl.float32)
        tl.store(DX + cur_row * d + loc, dx.to(DX.dtype.element_ty), mask=cur_mask)
        c_sc = dy * xhat  # d(scale), d(shift) per sample: none for a frozen modulation (NEED_SUMS)
        acc_sc, acc_sh, unused, cur, seg = ss.add_tile(
            acc_sc, acc_sh, acc_sh, c_sc, dy, dy, s, cur, seg, rid, P, D, pid, d, cols, cmask, 2, ROWS, BLOCK,
            NEED_SUMS,
        )  # fmt: skip
    ss.close_chunk(
        acc_sc, acc_sh, acc_sh, P, FIRST, LAST, pid, n, first, cur, seg, d, cols, cmask, 2, NEED_SUMS
    )


class _NormModulate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, shift, scale, token_sample, eps, fork):
        x = x.contiguous()
        shift, scale, ts = shift.contiguous(), scale.contiguous(), token_sample.contiguous()
        T, d = x.shape
        y = torch.empty_like(x)
        rstd = torch.empty(T, device=x.device, dtype=torch.float32)
        launch = row_launch(_norm_modulate_fwd, T, d, x, shift, scale, ts, y, rstd, T, d, eps)
        if T:
            launch(pick("norm_modulate.fwd", row_key(x, T, d), row_configs(d), launch))
        ctx.save_for_backward(x, scale, ts, rstd)
        ctx.shift_dtype = shift.dtype
        return (y, x.view_as(x)) if fork else y

    @staticmethod
    def backward(ctx, dy, dres=None):
        x, scale, ts, rstd = ctx.saved_tensors
        T, d = x.shape
        dy = dy.contiguous()
        dx = torch.empty_like(x)
        if not T:
            z = torch.zeros_like(scale)
            return dx, z.to(ctx.shift_dtype), z, None, None, None
        res = (dx, 0) if dres is None else (dres.contiguous(), 1)
        args = (dy, x, scale, ts, rstd, dx, *res)
        need_sums = ctx.needs_input_grad[1] or ctx.needs_input_grad[2]  # a trained modulation
        launch = ss.PerSampleBackward(_norm_modulate_bwd, args, x, scale.shape[0], 2, need_sums, scale.dtype)
        # each variant its own pick: the fork reads one more tensor, no sums need fewer registers
        name = "norm_modulate.bwd" + ("" if dres is None else "_fork") + ("" if need_sums else "_nosums")
        launch(pick(name, row_key(x, T, d), launch.configs(), launch))
        out = launch.sums  # [B, (scale, shift), d]
        if out is None:
            return dx, None, None, None, None, None
        return dx, out[:, 1].to(ctx.shift_dtype), out[:, 0], None, None, None


def norm_modulate(
    x: torch.Tensor,
    shift: torch.Tensor,
    scale: torch.Tensor,
    token_sample: torch.Tensor,
    eps: float = 1e-6,
    fork: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    return _NormModulate.apply(x, shift, scale, token_sample, eps, fork)

"""norm_modulate in Triton: rms_norm(x) * (1 + scale[s]) + shift[s], a tile of ROWS rows per program.

The backward walks a chunk of row tiles per program (next tile's loads issued first) and sums
d(scale), d(shift) per sample in registers; per-program partials are added by sample_sums.finish.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import sample_sums as ss
from ...triton_utils import backward_configs, next_pow2, persistent_programs, pick, size_bucket, tile_configs
from ...triton_utils import supports as supports


@triton.jit
def _fwd(X, SHIFT, SCALE, TS, Y, RSTD, T, d, eps, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    rmask = rows < T
    mask = rmask[:, None] & (cols < d)[None, :]
    off = rows[:, None] * d + cols[None, :]
    s = tl.load(TS + rows, mask=rmask, other=0).to(tl.int64)
    x = tl.load(X + off, mask=mask, other=0.0).to(tl.float32)
    poff = s[:, None] * d + cols[None, :]
    sc = tl.load(SCALE + poff, mask=mask, other=0.0).to(tl.float32)
    sh = tl.load(SHIFT + poff, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / d + eps)
    y = x * rstd[:, None] * (1.0 + sc) + sh
    tl.store(Y + off, y.to(Y.dtype.element_ty), mask=mask)
    tl.store(RSTD + rows, rstd, mask=rmask)


@triton.jit
def _bwd(
    DY,
    X,
    SCALE,
    TS,
    RSTD,
    DX,
    P,
    D,
    FIRST,
    LAST,
    T,
    d,
    tiles_per_prog,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    cmask = cols < d
    rid = tl.arange(0, ROWS)
    start = pid.to(tl.int64) * tiles_per_prog * ROWS
    end = tl.minimum(start + tiles_per_prog * ROWS, T)
    n = tl.cdiv(end - start, ROWS)
    first = tl.load(TS + start, mask=n > 0, other=0).to(tl.int64)
    cur = first
    seg = pid * 0
    acc_sc = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
    acc_sh = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
    rows = start + rid
    mask = (rows < end)[:, None] & cmask[None, :]
    off = rows[:, None] * d + cols[None, :]
    x_next = tl.load(X + off, mask=mask, other=0.0)
    dy_next = tl.load(DY + off, mask=mask, other=0.0)
    rstd_next = tl.load(RSTD + rows, mask=rows < end, other=0.0)
    s_next = tl.load(TS + rows, mask=rows < end, other=-1).to(tl.int64)
    for _ in range(0, n):
        x = x_next.to(tl.float32)
        dy = dy_next.to(tl.float32)
        rstd = rstd_next[:, None]
        s = s_next  # -1: a row past the chunk (its contributions are zero)
        cur_off, cur_mask = off, mask
        rows += ROWS
        mask = (rows < end)[:, None] & cmask[None, :]
        off = rows[:, None] * d + cols[None, :]
        x_next = tl.load(X + off, mask=mask, other=0.0)
        dy_next = tl.load(DY + off, mask=mask, other=0.0)
        rstd_next = tl.load(RSTD + rows, mask=rows < end, other=0.0)
        s_next = tl.load(TS + rows, mask=rows < end, other=-1).to(tl.int64)
        sc = tl.load(SCALE + tl.maximum(s, 0)[:, None] * d + cols[None, :], mask=cur_mask, other=0.0).to(
            tl.float32
        )
        xhat = x * rstd
        g = dy * (1.0 + sc)
        dx = rstd * (g - xhat * (tl.sum(g * xhat, axis=1) / d)[:, None])
        tl.store(DX + cur_off, dx.to(DX.dtype.element_ty), mask=cur_mask)
        c_sc = dy * xhat
        if tl.sum(((s != cur) & (s >= 0)).to(tl.int32), axis=0) == 0:
            acc_sc += c_sc
            acc_sh += dy
        else:  # a sample boundary inside this tile: row by row
            for i in tl.static_range(ROWS):
                sel = rid == i
                si = tl.sum(tl.where(sel, s, 0), axis=0)
                if (si != cur) & (si >= 0):
                    ss.flush(acc_sc, P, D, pid, 0, 2, cur, seg, d, cols, cmask)
                    ss.flush(acc_sh, P, D, pid, 1, 2, cur, seg, d, cols, cmask)
                    acc_sc = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
                    acc_sh = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
                    seg += 1
                    cur = si
                acc_sc += tl.where(sel[:, None], c_sc, 0.0)
                acc_sh += tl.where(sel[:, None], dy, 0.0)
    ss.close(acc_sc, P, pid, 0, 2, seg, d, cols, cmask)
    ss.close(acc_sh, P, pid, 1, 2, seg, d, cols, cmask)
    ss.mark(FIRST, LAST, pid, n, first, cur, seg)


class _NormModulate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, shift, scale, token_sample, eps):
        x = x.contiguous()
        shift, scale, ts = shift.contiguous(), scale.contiguous(), token_sample.contiguous()
        T, d = x.shape
        y = torch.empty_like(x)
        rstd = torch.empty(T, device=x.device, dtype=torch.float32)
        block = next_pow2(d)

        def launch(cfg):
            rows, warps = cfg
            _fwd[(triton.cdiv(T, rows),)](
                x, shift, scale, ts, y, rstd, T, d, eps, ROWS=rows, BLOCK=block, num_warps=warps
            )

        if T:
            key = (d, x.dtype, size_bucket(T), x.device)
            launch(pick("norm_modulate.fwd", key, tile_configs(block, max_per_thread=64), launch))
        ctx.save_for_backward(x, scale, ts, rstd)
        ctx.shift_dtype = shift.dtype
        return y

    @staticmethod
    def backward(ctx, dy):
        x, scale, ts, rstd = ctx.saved_tensors
        T, d = x.shape
        dy = dy.contiguous()
        dx = torch.empty_like(x)
        block = next_pow2(d)
        bufs = {}

        def launch(cfg):
            rows, warps, per_sm = cfg
            tiles = triton.cdiv(T, rows)
            grid = persistent_programs(x, tiles, per_sm)
            p, first, last, out = ss.buffers(grid, scale.shape[0], 2, d, x.device)
            _bwd[(grid,)](
                dy,
                x,
                scale,
                ts,
                rstd,
                dx,
                p,
                out,
                first,
                last,
                T,
                d,
                triton.cdiv(tiles, grid),
                ROWS=rows,
                BLOCK=block,
                num_warps=warps,
            )
            bufs["b"] = (p, first, last, out)

        if not T:
            z = torch.zeros_like(scale)
            return dx, z.to(ctx.shift_dtype), z, None, None
        key = (d, x.dtype, size_bucket(T), x.device)
        launch(pick("norm_modulate.bwd", key, backward_configs(block), launch))
        out = ss.finish(*bufs["b"], scale.dtype)  # [B, (scale, shift), d]
        return dx, out[:, 1].to(ctx.shift_dtype), out[:, 0], None, None


def norm_modulate(
    x: torch.Tensor,
    shift: torch.Tensor,
    scale: torch.Tensor,
    token_sample: torch.Tensor,
    eps: float = 1e-6,
) -> torch.Tensor:
    return _NormModulate.apply(x, shift, scale, token_sample, eps)

"""residual_norm_modulate in Triton: r = x + gate[s] * y and h = rms_norm(r) * (1 + scale[s]) + shift[s]
in one read of x and y, a tile of ROWS rows per program; the backward sums d(gate), d(shift),
d(scale) per sample with per-program partials (see sample_sums and norm_modulate)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...backends import pdl
from ...backends import sample_sums as ss
from ...backends.triton_utils import pick, row_configs, row_key, row_launch
from ...backends.triton_utils import supports as supports


@triton.jit
def _residual_norm_modulate_fwd(
    X, Y, GATE, SHIFT, SCALE, TS, R, H, RSTD, ACC, ACC_N, T, d, eps, ROWS: tl.constexpr, BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    pdl.wait_inputs(PDL)
    row0 = tl.program_id(0).to(tl.int64) * ROWS
    rid = tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    rmask = rid < T - row0
    mask = rmask[:, None] & (cols < d)[None, :]
    loc = rid[:, None] * d + cols[None, :]
    s = tl.load(TS + row0 + rid, mask=rmask, other=0).to(tl.int64)
    poff = s.to(tl.int32)[:, None] * d + cols[None, :]
    x = tl.load(X + row0 * d + loc, mask=mask, other=0.0).to(tl.float32)
    y = tl.load(Y + row0 * d + loc, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(GATE + poff, mask=mask, other=0.0).to(tl.float32)
    r = (x + g * y).to(R.dtype.element_ty)  # the residual stream is kept in the model dtype
    tl.store(R + row0 * d + loc, r, mask=mask)
    r = r.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(r * r, axis=1) / d + eps)
    sc = tl.load(SCALE + poff, mask=mask, other=0.0).to(tl.float32)
    sh = tl.load(SHIFT + poff, mask=mask, other=0.0).to(tl.float32)
    h = r * rstd[:, None] * (1.0 + sc) + sh
    tl.store(H + row0 * d + loc, h.to(H.dtype.element_ty), mask=mask)
    tl.store(RSTD + row0 + rid, rstd, mask=rmask)
    ss.zero_acc(ACC, ACC_N, BLOCK)


@triton.jit
def _load_tile(R, Y, DH, DR, RSTD, TS, row, end, rid, loc, cmask, d):
    """The tile of rows from `row` (masked to the chunk's end): its mask, r, y, dh, dr, rstd and samples
    (-1 past the end)."""
    rmask = rid < end - row
    mask = rmask[:, None] & cmask[None, :]
    r = tl.load(R + row * d + loc, mask=mask, other=0.0)
    y = tl.load(Y + row * d + loc, mask=mask, other=0.0)
    dh = tl.load(DH + row * d + loc, mask=mask, other=0.0)
    dr = tl.load(DR + row * d + loc, mask=mask, other=0.0)
    rstd = tl.load(RSTD + row + rid, mask=rmask, other=0.0)
    s = tl.load(TS + row + rid, mask=rmask, other=-1).to(tl.int64)
    return mask, r, y, dh, dr, rstd, s


@triton.jit
def _residual_norm_modulate_bwd(
    DR, DH, R, Y, GATE, SCALE, TS, RSTD, DX, DY, P, D, FIRST, LAST, T, d, tiles_per_prog,
    NEED_SUMS: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    pdl.wait_inputs(PDL)
    pid = tl.program_id(0)
    rid = tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    cmask = cols < d
    loc = rid[:, None] * d + cols[None, :]
    start, end, n, first = ss.chunk(TS, pid, tiles_per_prog, T, ROWS)
    cur = first
    seg = pid * 0
    acc_g = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
    acc_sc = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
    acc_sh = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
    row = start
    mask, r_next, y_next, dh_next, dr_next, rstd_next, s_next = _load_tile(
        R, Y, DH, DR, RSTD, TS, row, end, rid, loc, cmask, d
    )
    for _ in range(0, n):
        r = r_next.to(tl.float32)
        y = y_next.to(tl.float32)
        dh = dh_next.to(tl.float32)
        dr = dr_next.to(tl.float32)
        rstd = rstd_next[:, None]
        s = s_next  # -1: a row past the chunk (its contributions are zero)
        cur_row, cur_mask = row, mask
        row += ROWS  # issue the next tile's loads first
        mask, r_next, y_next, dh_next, dr_next, rstd_next, s_next = _load_tile(
            R, Y, DH, DR, RSTD, TS, row, end, rid, loc, cmask, d
        )
        poff = tl.maximum(s, 0).to(tl.int32)[:, None] * d + cols[None, :]  # int32: fewer registers
        sc = tl.load(SCALE + poff, mask=cur_mask, other=0.0).to(tl.float32)
        g = tl.load(GATE + poff, mask=cur_mask, other=0.0).to(tl.float32)
        rhat = r * rstd
        gn = dh * (1.0 + sc)
        dr += rstd * (gn - rhat * (tl.sum(gn * rhat, axis=1) / d)[:, None])
        tl.store(DX + cur_row * d + loc, dr.to(DX.dtype.element_ty), mask=cur_mask)
        tl.store(DY + cur_row * d + loc, (g * dr).to(DY.dtype.element_ty), mask=cur_mask)
        c_g = dr * y  # d(gate), d(scale), d(shift) per sample: none for a frozen modulation (NEED_SUMS)
        c_sc = dh * rhat
        acc_g, acc_sc, acc_sh, cur, seg = ss.add_tile(
            acc_g, acc_sc, acc_sh, c_g, c_sc, dh, s, cur, seg, rid, P, D, pid, d, cols, cmask, 3, ROWS, BLOCK,
            NEED_SUMS,
        )  # fmt: skip
    ss.close_chunk(
        acc_g, acc_sc, acc_sh, P, FIRST, LAST, pid, n, first, cur, seg, d, cols, cmask, 3, NEED_SUMS
    )


class _ResidualNormModulate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y, gate, shift, scale, token_sample, eps):
        x, y = x.contiguous(), y.contiguous()
        gate, shift, scale, ts = (t.contiguous() for t in (gate, shift, scale, token_sample))
        T, d = x.shape
        r, h = torch.empty_like(x), torch.empty_like(x)
        rstd = torch.empty(T, device=x.device, dtype=torch.float32)
        ctx.acc, acc_args = ss.forward_acc(any(ctx.needs_input_grad[2:5]), gate.shape[0], 3, x)
        launch = row_launch(
            _residual_norm_modulate_fwd, T, d, x, y, gate, shift, scale, ts, r, h, rstd, *acc_args, T, d,
            eps, **pdl.options(x),
        )  # fmt: skip
        if T:
            launch(pick("residual_norm_modulate.fwd", row_key(x, T, d), row_configs(d), launch))
        ctx.save_for_backward(r, y, gate, scale, ts, rstd)
        ctx.dtypes = (x.dtype, shift.dtype)
        return r, h

    @staticmethod
    def backward(ctx, dr, dh):
        r, y, gate, scale, ts, rstd = ctx.saved_tensors
        T, d = r.shape
        x_dtype, shift_dtype = ctx.dtypes
        dx, dy = torch.empty_like(r), torch.empty_like(y)
        if not T:
            z = torch.zeros_like(gate)
            return dx.to(x_dtype), dy, z, z.to(shift_dtype), z.to(scale.dtype), None, None
        dr, dh = dr.contiguous(), dh.contiguous()
        need_sums = any(ctx.needs_input_grad[2:5])  # gate, shift, scale: a trained modulation
        args = (dr, dh, r, y, gate, scale, ts, rstd, dx, dy)
        launch = ss.PerSampleBackward(
            _residual_norm_modulate_bwd, args, r, gate.shape[0], 3, need_sums, scale.dtype, acc=ss.take(ctx)
        )
        name = "residual_norm_modulate.bwd" + ("" if need_sums else "_nosums")
        launch.run(pick(name, row_key(r, T, d), launch.configs(), launch))
        out = launch.sums  # [B, (gate, scale, shift), d]
        if out is None:
            return dx.to(x_dtype), dy, None, None, None, None, None
        return (
            dx.to(x_dtype),
            dy,
            out[:, 0].to(gate.dtype),
            out[:, 2].to(shift_dtype),
            out[:, 1],
            None,
            None,
        )


def residual_norm_modulate(
    x: torch.Tensor,
    y: torch.Tensor,
    gate: torch.Tensor,
    shift: torch.Tensor,
    scale: torch.Tensor,
    token_sample: torch.Tensor,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    return _ResidualNormModulate.apply(x, y, gate, shift, scale, token_sample, eps)

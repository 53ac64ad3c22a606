"""Triton forms of fp8.py's two memory-bound passes, each giving the eager form's exact bytes:

- `quantize_rows`: rows of up to three sources side by side (a group's gradients, no cat first), times
  the column scales, one read: the row's largest magnitude, then the e4m3 row and its scale. One division
  per row (the reciprocal), multiplies per element, as the eager reference does.
- `transpose_cat`: fp8 weights [O_i, I] -> one [I, sum O_i] buffer, tiled (torch's `.t().contiguous()`
  on a one-byte dtype runs an uncoalesced elementwise copy, ~7x slower on the H200).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..backends.triton_utils import pick, row_configs, row_key, row_launch
from .fp8 import _TINY, E4M3, E4M3_MAX


@triton.jit
def _load_part(X, stride, rows, cols, start, width, rmask):
    inside = (cols >= start) & (cols < start + width)
    ptr = X + rows[:, None] * stride + (cols - start)[None, :]
    return tl.load(ptr, mask=rmask[:, None] & inside[None, :], other=0.0).to(tl.float32)


@triton.jit
def _quantize_rows(
    X0, X1, X2, C, Q, S, T, K0, K1, K2, s0, s1, s2, TINY, INV_QMAX, QMAX,
    PARTS: tl.constexpr, HAS_COL: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    rmask = rows < T
    cols = tl.arange(0, BLOCK)
    K = K0 + K1 + K2
    v = _load_part(X0, s0, rows, cols, 0, K0, rmask)
    if PARTS > 1:
        v += _load_part(X1, s1, rows, cols, K0, K1, rmask)
    if PARTS > 2:
        v += _load_part(X2, s2, rows, cols, K0 + K1, K2, rmask)
    if HAS_COL:
        v = v * tl.load(C + cols, mask=cols < K, other=0.0).to(tl.float32)[None, :]
    s = tl.maximum(tl.max(tl.abs(v), axis=1), TINY) * INV_QMAX
    inv = tl.math.div_rn(tl.full([ROWS], 1.0, tl.float32), s)
    q = tl.minimum(tl.maximum(v * inv[:, None], -QMAX), QMAX)
    mask = rmask[:, None] & (cols < K)[None, :]
    tl.store(Q + rows[:, None] * K + cols[None, :], q.to(Q.dtype.element_ty), mask=mask)
    tl.store(S + rows, s, mask=rmask)


def quantize_rows(
    xs: torch.Tensor | list[torch.Tensor], col_scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, K] or up to three [T, K_i] side by side (unit column stride) -> (e4m3 [T, sum K_i], fp32 [T, 1])."""
    xs = [xs] if isinstance(xs, torch.Tensor) else list(xs)
    if len(xs) > 3:
        raise ValueError(f"quantize_rows takes at most three sources, got {len(xs)}")
    xs = [x if x.stride(-1) == 1 else x.contiguous() for x in xs]
    T, widths = xs[0].shape[0], [x.shape[1] for x in xs]
    K = sum(widths)
    q = torch.empty(T, K, dtype=E4M3, device=xs[0].device)
    s = torch.empty(T, 1, dtype=torch.float32, device=xs[0].device)
    if T:
        pad = xs + [xs[0]] * (3 - len(xs))  # an unused source is never read (PARTS)
        launch = row_launch(
            _quantize_rows, T, K,
            *pad, col_scale if col_scale is not None else s, q, s, T,
            *(widths + [0] * (3 - len(xs))), *(x.stride(0) for x in pad), _TINY, 1.0 / E4M3_MAX, E4M3_MAX,
            PARTS=len(xs), HAS_COL=col_scale is not None,
        )  # fmt: skip
        launch(pick("fp8.quantize_rows", row_key(xs[0], T, K), row_configs(K), launch))
    return q, s


@triton.jit
def _transpose(SRC, DST, n_out, n_in, ld, BO: tl.constexpr, BI: tl.constexpr):
    o = tl.program_id(0) * BO + tl.arange(0, BO)
    i = tl.program_id(1) * BI + tl.arange(0, BI)
    mask = (o < n_out)[:, None] & (i < n_in)[None, :]
    tile = tl.load(SRC + o[:, None].to(tl.int64) * n_in + i[None, :], mask=mask)
    tl.store(DST + i[None, :].to(tl.int64) * ld + o[:, None], tile, mask=mask)


def transpose_cat(datas: list[torch.Tensor]) -> torch.Tensor:
    """[O_i, I] contiguous (one-byte dtype) -> [I, sum O_i], member i in columns sum_{j<i} O_j onward."""
    n_in, ld = datas[0].shape[1], sum(d.shape[0] for d in datas)
    out = torch.empty(n_in, ld, dtype=datas[0].dtype, device=datas[0].device)
    off, BO, BI = 0, 64, 64
    for d in datas:
        n_out = d.shape[0]
        src, dst = d.contiguous().view(torch.uint8), out.view(torch.uint8)[:, off:]
        grid = (triton.cdiv(n_out, BO), triton.cdiv(n_in, BI))
        _transpose[grid](src, dst, n_out, n_in, ld, BO=BO, BI=BI, num_warps=4)
        off += n_out
    return out

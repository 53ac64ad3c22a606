"""fp8.quantize_rows as one Triton pass: each program reads a whole row once (times the column scales),
takes its largest magnitude and writes the e4m3 row and its scale; the same float32 steps as the eager
reference (IEEE divisions), so both give the same bytes."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .fp8 import _TINY, E4M3, E4M3_MAX
from .triton_utils import row_block


@triton.jit
def _quantize_rows(X, C, Q, S, K, stride_x, TINY, QMAX, HAS_COL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < K
    v = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_COL:
        v = v * tl.load(C + cols, mask=mask, other=0.0).to(tl.float32)
    s = tl.math.div_rn(tl.maximum(tl.max(tl.abs(v), axis=0), TINY), QMAX)
    q = tl.minimum(tl.maximum(tl.math.div_rn(v, s), -QMAX), QMAX)
    tl.store(Q + row * K + cols, q.to(Q.dtype.element_ty), mask=mask)
    tl.store(S + row, s)


def quantize_rows(
    x: torch.Tensor, col_scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, K] (any float dtype, unit column stride) -> (e4m3 [T, K], fp32 [T, 1])."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    T, K = x.shape
    q = torch.empty(T, K, dtype=E4M3, device=x.device)
    s = torch.empty(T, 1, dtype=torch.float32, device=x.device)
    if T:
        block, warps = row_block(K)
        col = col_scale if col_scale is not None else s  # not read without HAS_COL
        _quantize_rows[(T,)](
            x, col, q, s, K, x.stride(0), _TINY, E4M3_MAX,
            HAS_COL=col_scale is not None, BLOCK=block, num_warps=warps,
        )  # fmt: skip
    return q, s

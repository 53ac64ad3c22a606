"""sdpa_slots' merge of its two partial attentions in one Triton pass (the forward's only full-size pass).

Per query row of a slot, with the image part's (o_a, lse_a) and the text and pad part's (o_b, lse_b):

    lse_a <- -inf on pad rows (they see no image key)
    lse = logaddexp(lse_a, lse_b)
    o = o_b + exp(lse_a - lse) (o_a - o_b)        in float32, written in o's dtype

`sdpa_slots.merge_torch` is the reference (and the CPU's path): five passes over [B, H, S, D] in
float32 where this kernel reads o_a and o_b once and writes o once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_ROWS = 32


@triton.jit
def _merge_kernel(
    o_a, o_b, lse_a, lse_b, real, out, lse_out, S, H,
    a_sb, a_sh, a_ss, b_sb, b_sh, b_ss, o_sb, o_sh, o_ss, la_sb, la_sh, lb_sb, lb_sh,
    D: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = rows < S
    cols = tl.arange(0, D)
    la = tl.load(lse_a + b * la_sb + h * la_sh + rows, mask=live, other=0.0).to(tl.float32)
    lb = tl.load(lse_b + b * lb_sb + h * lb_sh + rows, mask=live, other=0.0).to(tl.float32)
    is_real = tl.load(real + b * S + rows, mask=live, other=0)
    la = tl.where(is_real != 0, la, float("-inf"))
    top = tl.maximum(la, lb)  # lb is finite on every row: each row sees a text or pad key
    lse = top + tl.log(tl.exp(la - top) + tl.exp(lb - top))
    w = tl.exp(la - lse)
    r = rows[:, None].to(tl.int64)
    xa = tl.load(o_a + b * a_sb + h * a_sh + r * a_ss + cols[None, :], mask=live[:, None], other=0.0)
    xb = tl.load(o_b + b * b_sb + h * b_sh + r * b_ss + cols[None, :], mask=live[:, None], other=0.0)
    xa, xb = xa.to(tl.float32), xb.to(tl.float32)
    o = xb + w[:, None] * (xa - xb)
    tl.store(
        out + b * o_sb + h * o_sh + r * o_ss + cols[None, :], o.to(out.dtype.element_ty), mask=live[:, None]
    )
    tl.store(lse_out + bh * S + rows, lse, mask=live)


def fits(o_a, o_b, lse_a, lse_b, out) -> bool:
    """The kernel's layouts: a power-of-two head dim, each row contiguous, the lse rows too."""
    D = out.shape[-1]
    return D & (D - 1) == 0 and all(t.stride(-1) == 1 for t in (o_a, o_b, out, lse_a, lse_b))


def merge(o_a, o_b, lse_a, lse_b, real_rows, out) -> torch.Tensor:
    """`sdpa_slots.merge_torch` in one Triton kernel (where `fits`)."""
    B, H, S, D = out.shape
    lse = torch.empty(B, H, S, device=out.device, dtype=torch.float32)
    grid = (triton.cdiv(S, BLOCK_ROWS), B * H)
    _merge_kernel[grid](
        o_a, o_b, lse_a, lse_b, real_rows.contiguous().view(torch.uint8), out, lse, S, H,
        *o_a.stride()[:3], *o_b.stride()[:3], *out.stride()[:3], *lse_a.stride()[:2], *lse_b.stride()[:2],
        D=D, BLOCK=BLOCK_ROWS, num_warps=4,
    )  # fmt: skip
    return lse

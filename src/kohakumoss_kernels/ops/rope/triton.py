"""Half-split RoPE in Triton: one token (all heads) per program; the backward is the inverse rotation."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...backends import pdl, stream
from ...backends.triton_utils import supports as supports


@triton.jit
def _rope_rotate(
    X, COS, SIN, OUT, H, half, SIGN: tl.constexpr, BH: tl.constexpr, BD: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    pdl.wait_inputs(PDL)
    t = tl.program_id(0).to(tl.int64)
    heads = tl.arange(0, BH)[:, None]
    cols = tl.arange(0, BD)[None, :]
    mask = (heads < H) & (cols < half)
    base = t * H * 2 * half + heads * 2 * half + cols
    x1 = tl.load(X + base, mask=mask, other=0.0, eviction_policy=stream.LOAD).to(tl.float32)
    x2 = tl.load(X + base + half, mask=mask, other=0.0, eviction_policy=stream.LOAD).to(tl.float32)
    c = tl.load(COS + t * half + cols, mask=cols < half, other=0.0)
    s = tl.load(SIN + t * half + cols, mask=cols < half, other=0.0) * SIGN
    tl.store(OUT + base, (x1 * c - x2 * s).to(OUT.dtype.element_ty), mask=mask, cache_modifier=stream.STORE)
    tl.store(
        OUT + base + half, (x2 * c + x1 * s).to(OUT.dtype.element_ty), mask=mask, cache_modifier=stream.STORE
    )


def _launch(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sign: float) -> torch.Tensor:
    x = x.contiguous()
    T, H, D = x.shape
    out = torch.empty_like(x)
    if T:
        _rope_rotate[(T,)](
            x,
            cos.float().contiguous(),
            sin.float().contiguous(),
            out,
            H,
            D // 2,
            SIGN=sign,
            BH=triton.next_power_of_2(H),
            BD=triton.next_power_of_2(D // 2),
            num_warps=4,
            **pdl.options(x),
        )
    return out


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _launch(x, cos, sin, 1.0)

    @staticmethod
    def backward(ctx, dy):
        cos, sin = ctx.saved_tensors
        return _launch(dy, cos, sin, -1.0), None, None


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return _Rope.apply(x, cos, sin)

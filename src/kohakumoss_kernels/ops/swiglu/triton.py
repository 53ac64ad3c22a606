"""SwiGLU in Triton on the fused gate/up projection: silu(h[:, :H]) * h[:, H:], tiled over columns."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import pdl
from ...triton_utils import supports as supports

BLOCK = 1024


@triton.jit
def _swiglu_fwd(Hp, OUT, n_half, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl.wait_inputs(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_half
    a = tl.load(Hp + row * 2 * n_half + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(Hp + row * 2 * n_half + n_half + cols, mask=mask, other=0.0).to(tl.float32)
    out = a * tl.sigmoid(a) * b
    tl.store(OUT + row * n_half + cols, out.to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_bwd(DOUT, Hp, DH, n_half, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl.wait_inputs(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_half
    a = tl.load(Hp + row * 2 * n_half + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(Hp + row * 2 * n_half + n_half + cols, mask=mask, other=0.0).to(tl.float32)
    do = tl.load(DOUT + row * n_half + cols, mask=mask, other=0.0).to(tl.float32)
    sig = tl.sigmoid(a)
    silu = a * sig
    da = do * b * sig * (1.0 + a * (1.0 - sig))
    db = do * silu
    tl.store(DH + row * 2 * n_half + cols, da.to(DH.dtype.element_ty), mask=mask)
    tl.store(DH + row * 2 * n_half + n_half + cols, db.to(DH.dtype.element_ty), mask=mask)


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h):
        shape = h.shape
        h2 = h.reshape(-1, shape[-1]).contiguous()
        T, n = h2.shape
        out = torch.empty(T, n // 2, device=h.device, dtype=h.dtype)
        if T:
            _swiglu_fwd[(T, triton.cdiv(n // 2, BLOCK))](
                h2, out, n // 2, BLOCK=BLOCK, num_warps=4, **pdl.options(h2)
            )
        ctx.save_for_backward(h2)
        ctx.shape = shape
        return out.reshape(*shape[:-1], n // 2)

    @staticmethod
    def backward(ctx, dout):
        (h2,) = ctx.saved_tensors
        T, n = h2.shape
        dh = torch.empty_like(h2)
        if T:
            _swiglu_bwd[(T, triton.cdiv(n // 2, BLOCK))](
                dout.reshape(T, n // 2).contiguous(), h2, dh, n // 2, BLOCK=BLOCK, num_warps=4,
                **pdl.options(h2),
            )  # fmt: skip
        return dh.reshape(ctx.shape)


def swiglu(h: torch.Tensor) -> torch.Tensor:
    return _SwiGLU.apply(h)

"""SiTU-GLU in Triton on the fused projection h = [hidden | gate] (halves of the last dim), tiled over
columns, math in float32, output in h's dtype:

    a(g) = 4 tanh(g / 4) sigmoid(g)        b(u) = 25 tanh(u / 25)        out = a(gate) * b(hidden)

The backward reads h and d(out) once and writes both halves of d(h):

    d(gate)   = d(out) * b(hidden) * ((1 - tanh(g / 4)^2) sigmoid(g) + 4 tanh(g / 4) sigmoid(g) sigmoid(-g))
    d(hidden) = d(out) * a(gate) * (1 - tanh(u / 25)^2)

Triton has no tanh that also runs in its interpreter, so tanh is Cephes' tanhf: an odd polynomial below
|x| = 0.625, (1 - e) / (1 + e) with e = exp(-2|x|) above (within 2e-7 relative of tanh in float32;
2 sigmoid(2x) - 1 loses all relative precision near 0). The gate's tanh and sigmoid share one exp and
one reciprocal: with q = exp(-|g| / 2), tanh(|g| / 4) = (1 - q) / (1 + q) and sigmoid(|g|) = 1 / (1 + q^2)
(sigmoid(-|g|) = q^2 / (1 + q^2), with no 1 - sigmoid cancellation), so an element takes two exps and two
reciprocals. The forward is bound by instruction issue, not memory (~72 SASS instructions per element,
the range checks of the non-ftz exp and division among them; docs/internals/kernels.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...backends import pdl
from ...backends.triton_utils import supports as supports

BLOCK = 1024
SMALL: tl.constexpr = tl.constexpr(0.625)  # below this |x|, tanh(x) from the polynomial


@triton.jit
def _tanh_poly(x):
    """Cephes' tanhf polynomial, for |x| < SMALL."""
    s = x * x
    p = (((-5.70498872745e-3 * s + 2.06390887954e-2) * s - 5.37397155531e-2) * s + 1.33314422036e-1) * s
    return (p - 3.33332819422e-1) * s * x + x


@triton.jit
def _tanh(x):
    t = tl.abs(x)
    e = tl.exp(-2.0 * t)  # in (0, 1]: no overflow at any |x|
    big = (1.0 - e) / (1.0 + e)
    out = tl.where(t < SMALL, _tanh_poly(t), big)
    return tl.where(x < 0, -out, out)


@triton.jit
def _gate(g):
    """tanh(g / 4), sigmoid(g) and sigmoid(-g) = 1 - sigmoid(g) (without its cancellation)."""
    t = tl.abs(g)
    q = tl.exp(-0.5 * t)  # in (0, 1]
    q2 = q * q
    r = 1.0 / ((1.0 + q) * (1.0 + q2))
    pos = (1.0 + q) * r  # sigmoid(|g|)
    neg = q2 * pos  # sigmoid(-|g|)
    th = tl.where(t * 0.25 < SMALL, _tanh_poly(t * 0.25), (1.0 - q) * (1.0 + q2) * r)
    up = g >= 0
    return tl.where(up, th, -th), tl.where(up, pos, neg), tl.where(up, neg, pos)


@triton.jit
def _load_halves(Hp, row, cols, mask, n_half):
    """A row's hidden and gate columns `cols`, in float32."""
    base = Hp + row * 2 * n_half + cols
    u = tl.load(base, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(base + n_half, mask=mask, other=0.0).to(tl.float32)
    return u, g


@triton.jit
def _situ_glu_fwd(Hp, OUT, n_half, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl.wait_inputs(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_half
    u, g = _load_halves(Hp, row, cols, mask, n_half)
    tg, sg, _ = _gate(g)
    out = (4.0 * tg * sg) * (25.0 * _tanh(u * 0.04))
    tl.store(OUT + row * n_half + cols, out.to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _situ_glu_bwd(DOUT, Hp, DH, n_half, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl.wait_inputs(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_half
    u, g = _load_halves(Hp, row, cols, mask, n_half)
    do = tl.load(DOUT + row * n_half + cols, mask=mask, other=0.0).to(tl.float32)
    tg, sg, sgc = _gate(g)
    tu = _tanh(u * 0.04)
    a = 4.0 * tg * sg
    da = (1.0 - tg * tg) * sg + 4.0 * tg * sg * sgc
    du = do * a * (1.0 - tu * tu)
    dg = do * (25.0 * tu) * da
    base = DH + row * 2 * n_half + cols
    tl.store(base, du.to(DH.dtype.element_ty), mask=mask)
    tl.store(base + n_half, dg.to(DH.dtype.element_ty), mask=mask)


class _SiTUGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h):
        shape = h.shape
        if shape[-1] % 2:
            raise ValueError(f"situ_glu: the last dim of h ({shape[-1]}) is not [hidden | gate] (odd)")
        h2 = h.reshape(-1, shape[-1]).contiguous()
        T, n = h2.shape
        out = torch.empty(T, n // 2, device=h.device, dtype=h.dtype)
        if T and n:
            _situ_glu_fwd[(T, triton.cdiv(n // 2, BLOCK))](
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
        if T and n:
            _situ_glu_bwd[(T, triton.cdiv(n // 2, BLOCK))](
                dout.reshape(T, n // 2).contiguous(), h2, dh, n // 2, BLOCK=BLOCK, num_warps=4,
                **pdl.options(h2),
            )  # fmt: skip
        return dh.reshape(ctx.shape)


def situ_glu(h: torch.Tensor) -> torch.Tensor:
    return _SiTUGLU.apply(h)

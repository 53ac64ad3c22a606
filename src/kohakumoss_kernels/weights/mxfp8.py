"""MXFP8 (OCP Microscaling): e4m3 values with one power-of-two scale (e8m0) per block of 32 consecutive
values along the reduction axis, and the frozen-linear products over it.

Quantization per block (the OCP MX v1.0 rule, "floor"): shared exponent e = floor(log2(amax)) - 8 (8:
e4m3's largest exponent), clamped to e8m0's [-127, 127]; values x / 2^e rounded to e4m3, saturated at
+-448 (a block's amax lands in [256, 512) before saturation). An all-zero block gets e = -127.

Compute: `torch._scaled_mm` with both operands' e8m0 scales in cuBLAS's swizzled 128x4 tile layout
(`to_blocked`), on sm100+ (Blackwell) only: Hopper (the H200) and older cards have no block-scaled fp8
GEMM, and neither has the CPU. Elsewhere a weight can still be dequantized (the eager reference). The
input gradient of a frozen linear is a GEMM in the compute dtype over the per-call dequantized weight
(MX blocks run along the forward's reduction axis, not the backward's).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import stored_weight
from .stored_weight import StoredWeight

BLOCK = 32
E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
E4M3_EMAX = 8  # floor(log2(448))
E8M0_BIAS = 127


def can_compute(device: torch.device) -> bool:
    """Whether block-scaled MXFP8 GEMMs run here: CUDA sm100+ (Blackwell: sm100, sm103, sm120, ...)."""
    device = torch.device(device)
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 10


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[R, K] (K a multiple of 32) -> (e4m3 [R, K], e8m0 scales [R, K / 32]) per 32-wide block of a row."""
    rows, k = x.shape
    if k % BLOCK:
        raise ValueError(f"MXFP8 blocks of {BLOCK} do not tile {k} columns")
    blocks = x.detach().float().reshape(rows, k // BLOCK, BLOCK)
    amax = blocks.abs().amax(dim=-1)
    _, e = torch.frexp(amax)  # amax = m * 2^e, m in [0.5, 1): floor(log2(amax)) = e - 1
    exp = torch.where(amax > 0, e - 1 - E4M3_EMAX, torch.full_like(e, -E8M0_BIAS)).clamp_(
        -E8M0_BIAS, E8M0_BIAS
    )
    scaled = torch.ldexp(blocks, -exp[..., None].float())
    data = scaled.clamp_(-E4M3_MAX, E4M3_MAX).to(E4M3).reshape(rows, k)
    return data, (exp + E8M0_BIAS).to(torch.uint8).view(torch.float8_e8m0fnu)


def scale_exponents(scale: torch.Tensor) -> torch.Tensor:
    """e8m0 scales -> their exponents (int32)."""
    return scale.view(torch.uint8).to(torch.int32) - E8M0_BIAS


def dequantize(data: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(e4m3 [R, K], e8m0 [R, K / 32]) -> [R, K] in `dtype` (exact in float32)."""
    rows, k = data.shape
    blocks = data.float().reshape(rows, k // BLOCK, BLOCK)
    return torch.ldexp(blocks, scale_exponents(scale)[..., None].float()).reshape(rows, k).to(dtype)


def to_blocked(scale: torch.Tensor) -> torch.Tensor:
    """[R, C] scales -> cuBLAS's block-scaled GEMM layout, flat: padded to 128-row x 4-column tiles, each
    tile stored as 32 rows of (4 row groups x 4 columns)."""
    rows, cols = scale.shape
    rb, cb = -(-rows // 128), -(-cols // 4)
    raw = scale.view(torch.uint8)
    if (rows, cols) != (rb * 128, cb * 4):
        padded = torch.zeros(rb * 128, cb * 4, dtype=torch.uint8, device=scale.device)
        padded[:rows, :cols] = raw
        raw = padded
    tiles = raw.view(rb, 128, cb, 4).permute(0, 2, 1, 3)  # [rb, cb, 128, 4]
    out = tiles.reshape(-1, 4, 32, 4).transpose(1, 2).reshape(-1, 32, 16)
    return out.flatten().view(torch.float8_e8m0fnu)


@dataclass(frozen=True, eq=False)
class Mxfp8Weight(StoredWeight):
    """A frozen [O, I] weight in MXFP8: `data` e4m3, `scale` e8m0 [O, I / 32], `blocked` the same scales
    in the GEMM's layout (made once); `compute` picks block-scaled GEMMs over dequantizing."""

    kind = "mxfp8"

    data: torch.Tensor
    scale: torch.Tensor
    blocked: torch.Tensor
    compute: bool = True

    def dequant(self, dtype: torch.dtype) -> torch.Tensor:
        return dequantize(self.data, self.scale, dtype)


def quantize_weight(w: torch.Tensor, compute: bool = True) -> Mxfp8Weight:
    data, scale = quantize(w)
    return Mxfp8Weight(data, scale, to_blocked(scale), compute)


def gemm_fits(w: Mxfp8Weight) -> bool:
    """Block-scaled GEMM shapes: the reduction a multiple of 32 (quantize's own rule), outputs of 16."""
    return w.shape[1] % BLOCK == 0 and w.shape[0] % 16 == 0


def linear_scaled_mm(x2: torch.Tensor, w: Mxfp8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x2 [T, I] @ W^T (+ bias) as one block-scaled fp8 GEMM (sm100+): x quantized to MXFP8 per call."""
    xq, xs = quantize(x2)
    out = torch._scaled_mm(xq, w.data.t(), scale_a=to_blocked(xs), scale_b=w.blocked, out_dtype=x2.dtype)
    return out if bias is None else out.add_(bias)


def linear(x2: torch.Tensor, w: Mxfp8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x2 [T, I] @ W^T (+ bias): block-scaled where the weight computes, else over the dequantized weight."""
    if w.compute and gemm_fits(w):
        return linear_scaled_mm(x2, w, bias)
    return torch.nn.functional.linear(x2, w.dequant(x2.dtype), bias)


def grad_input(gys: list[torch.Tensor], ws: list[Mxfp8Weight]) -> torch.Tensor:
    """sum_i gy_i @ W_i, each weight dequantized to gy's dtype for this call."""
    out = torch.mm(gys[0], ws[0].dequant(gys[0].dtype))
    for g, w in zip(gys[1:], ws[1:], strict=True):
        out.addmm_(g, w.dequant(g.dtype))
    return out


def frozen_linear(x: torch.Tensor, w: Mxfp8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., I] @ W^T (+ bias) with autograd: a frozen MXFP8 linear that has no LoRA."""
    return stored_weight.frozen_linear(x, w, bias, linear, grad_input)

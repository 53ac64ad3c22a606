"""Frozen linear weights in int8 (one float32 scale per output row, optionally ConvRot-rotated) and the
two products a frozen linear needs: x W^T (forward) and gy W (its input gradient).

A weight is `q` int8 [O, I] times `scale` [O]; a ConvRot one (`group` > 0, the released
`*_int8_convrot` files, `kohakumoss_common.quant`) was rotated per group of `group` input columns by the
normalised regular Hadamard H (symmetric, H @ H = I): W = (q * scale) @ H per group. The int8 bytes stay
as stored and the rotation moves to the activations: x W^T = (x H) (q * scale)^T per group, and
gy W = (gy (q * scale)) H. Rotating [T, I] activations costs 2 T I g flops (g = 256: 1/12 of a
3072-wide GEMM's), dequantizing and un-rotating the weight would cost 2 O I g per call.

Two modes, chosen per weight when it is quantized:
- compute (`int8`): the forward is an int8 GEMM (`torch._int_mm`, int32 accumulation; CUDA sm80+ and the
  CPU): x (rotated) quantized per row to int8 on the fly, the int32 product scaled by x's row scales and
  W's row scales. The input gradient is a GEMM in the compute dtype over the per-call dequantized rows
  (an int8 gradient would round gy to 8 bits).
- weight only (`int8_weight`): int8 storage, dequantized to the compute dtype per call (rows scaled, the
  rotation left on x), the products as usual; any device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kohakumoss_common.quant import convrot_hadamard

from . import stored_weight
from .stored_weight import StoredWeight

INT8_MAX = 127.0
_TINY = 1e-12  # an all-zero row keeps a finite scale
# torch._int_mm on CUDA takes more than 16 rows and widths in multiples of 8 (fewer rows: dequantized)
INT_MM_MIN_ROWS = 17


def can_compute(device: torch.device) -> bool:
    """Whether int8 GEMMs (`torch._int_mm`) run here: CUDA sm80+ or the CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device) >= (8, 0)
    return device.type == "cpu"


@dataclass(frozen=True, eq=False)
class Int8Weight(StoredWeight):
    """A frozen [O, I] weight: W = (data * scale[:, None]) @ H per `group` input columns (group 0: no
    rotation); `compute` picks int8 GEMMs over dequantizing."""

    kind = "int8"

    data: torch.Tensor  # [O, I] int8
    scale: torch.Tensor  # [O] float32
    group: int = 0
    compute: bool = True

    def rows(self, dtype: torch.dtype) -> torch.Tensor:
        """q * scale in `dtype`, still rotated: the operand that meets rotated activations."""
        return self.data.to(dtype).mul_(self.scale.to(dtype)[:, None])

    def dequant(self, dtype: torch.dtype) -> torch.Tensor:
        """The float weight in `dtype` (un-rotated through float32): the reference's operand."""
        w = self.data.float() * self.scale.float()[:, None]
        return (rotate(w, self.group) if self.group else w).to(dtype)


def quantize_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[O, I] -> (data int8 [O, I], scale fp32 [O]): each row rounded to the nearest of 255 levels
    spanning its largest magnitude."""
    w32 = w.detach().float()
    scale = w32.abs().amax(dim=1).clamp_min(_TINY) / INT8_MAX
    return (w32 / scale[:, None]).round_().clamp_(-INT8_MAX, INT8_MAX).to(torch.int8), scale


def rotate(x: torch.Tensor, group: int) -> torch.Tensor:
    """x @ H per group of `group` trailing columns, in x's dtype (H's entries +-1/sqrt(g) are exact in
    bf16 / fp16 for g a power of four); H is its own inverse, so this also un-rotates."""
    h = convrot_hadamard(group, x.device).to(x.dtype)
    return (x.reshape(-1, group) @ h).reshape(x.shape)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[T, K] -> (int8 [T, K], fp32 row scales [T, 1]): symmetric, the row's largest magnitude at 127."""
    v = x.float()
    s = v.abs().amax(dim=1, keepdim=True).clamp_min(_TINY) * (1.0 / INT8_MAX)
    return (v * (1.0 / s)).round_().clamp_(-INT8_MAX, INT8_MAX).to(torch.int8), s


def int_mm_fits(x2: torch.Tensor, w: Int8Weight) -> bool:
    rows_ok = x2.shape[0] >= INT_MM_MIN_ROWS or not x2.is_cuda
    return rows_ok and w.shape[0] % 8 == 0 and w.shape[1] % 8 == 0


def prepare(x2: torch.Tensor, w: Int8Weight) -> tuple:
    """x2 as `w`'s GEMM reads it: (rotated x, its int8 rows and row scales or None); members of a group
    that share x and its rotation prepare it once."""
    xr = rotate(x2, w.group) if w.group else x2
    return xr, quantize_rows(xr) if w.compute and int_mm_fits(x2, w) else None


def linear_int_mm(
    x2: torch.Tensor, w: Int8Weight, bias: torch.Tensor | None = None, prepared: tuple | None = None
) -> torch.Tensor:
    """x2 [T, I] @ W^T (+ bias) as one int8 GEMM: x (rotated) quantized per row, int32 accumulation."""
    if prepared is None or prepared[1] is None:
        prepared = (None, quantize_rows(rotate(x2, w.group) if w.group else x2))
    q, s = prepared[1]
    acc = torch._int_mm(q, w.data.t())  # [T, O] int32; the column-major operand is W's own storage
    out = (acc.float() * s).mul_(w.scale[None, :]).to(x2.dtype)
    return out if bias is None else out.add_(bias)


def linear_weight_only(
    x2: torch.Tensor, w: Int8Weight, bias: torch.Tensor | None = None, prepared: tuple | None = None
) -> torch.Tensor:
    """x2 [T, I] @ W^T (+ bias) in x2's dtype: the rotation on x, the rows dequantized for this call."""
    xr = prepared[0] if prepared is not None else rotate(x2, w.group) if w.group else x2
    return torch.nn.functional.linear(xr, w.rows(x2.dtype), bias)


def linear(
    x2: torch.Tensor, w: Int8Weight, bias: torch.Tensor | None = None, prepared: tuple | None = None
) -> torch.Tensor:
    """x2 [T, I] @ W^T (+ bias): an int8 GEMM where the weight computes and the shapes fit.
    prepared: `prepare(x2, w)`'s result, shared by the members of a group."""
    if w.compute and int_mm_fits(x2, w):
        return linear_int_mm(x2, w, bias, prepared)
    return linear_weight_only(x2, w, bias, prepared)


def grad_input(gys: list[torch.Tensor], ws: list[Int8Weight]) -> torch.Tensor:
    """sum_i gy_i [T, O_i] @ W_i [O_i, I]: each member's rows dequantized for this call, one rotation of
    the sum (members of one group share their input, so their rotation)."""
    out = torch.mm(gys[0], ws[0].rows(gys[0].dtype))
    for g, w in zip(gys[1:], ws[1:], strict=True):
        if w.group != ws[0].group:
            raise ValueError(f"int8 group members rotate differently ({w.group} vs {ws[0].group})")
        out.addmm_(g, w.rows(g.dtype))
    return rotate(out, ws[0].group) if ws[0].group else out


def frozen_linear(
    x: torch.Tensor, w: Int8Weight, bias: torch.Tensor | None = None, compute: bool | None = None
) -> torch.Tensor:
    """x [..., I] @ W^T (+ bias) with autograd: a frozen int8 linear that has no LoRA. compute: force the
    int8 GEMM (True) or the weight-only form (False); None: `linear`'s choice."""
    if compute is None:
        compute = w.compute and int_mm_fits(x.reshape(-1, x.shape[-1]), w)
    forward = linear_int_mm if compute else linear_weight_only
    return stored_weight.frozen_linear(x, w, bias, forward, grad_input)

"""Frozen linear weights in float8 (e4m3, one scale per output row) and the two products a frozen linear
needs: x W^T (forward) and gy W (its input gradient; a frozen base has no weight gradient).

Two modes, chosen per weight when it is quantized:
- compute (`fp8`): both products are fp8 GEMMs (`torch._scaled_mm`, row-wise scales, sm89+ or the CPU):
  x and gy are quantized per row on the fly (one Triton pass on CUDA, `quantize_rows`); W's row scales
  scale the output columns forward and are folded into gy's columns backward, so one stored copy serves
  both products (the backward's column-major operand is a transposed copy made per call, freed after).
- weight only (`fp8_weight`): fp8 storage, dequantized to the compute dtype per call, products as usual;
  any device. The dequantized copy is never saved for the backward (it is made again there).
Either way the frozen weights take one byte per parameter (plus 4 bytes per row), half of bf16.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import stored_weight
from .stored_weight import StoredWeight

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
_TINY = 1e-12  # an all-zero row keeps a finite scale


def is_float8(dtype: torch.dtype) -> bool:
    return dtype in (torch.float8_e4m3fn, torch.float8_e5m2)


def castable(t: torch.Tensor) -> bool:
    """A float tensor that follows the compute dtype when a model is cast: not a stored float8 one."""
    return t.is_floating_point() and not is_float8(t.dtype)


def can_compute(device: torch.device) -> bool:
    """Whether fp8 GEMMs run here: CUDA sm89+ (Ada, Hopper, Blackwell) or the CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device) >= (8, 9)
    return device.type == "cpu"


@dataclass(frozen=True, eq=False)
class Fp8Weight(StoredWeight):
    """A frozen [O, I] weight: w ~= data * scale[:, None]; `compute` picks fp8 GEMMs over dequantizing."""

    kind = "fp8"

    data: torch.Tensor  # [O, I] float8_e4m3fn
    scale: torch.Tensor  # [O] float32
    compute: bool = True

    def dequant(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight in `dtype`, made in place in one buffer of that dtype (e4m3 values are exact in
        fp16 / bf16; the row scale rounds once to `dtype`, as a weight stored in it would)."""
        return self.data.to(dtype).mul_(self.scale.to(dtype)[:, None])


def quantize_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[O, I] -> (data e4m3 [O, I], scale fp32 [O]): each row scaled so its largest magnitude is 448."""
    w32 = w.detach().float()
    scale = w32.abs().amax(dim=1).clamp_min(_TINY) / E4M3_MAX
    return (w32 / scale[:, None]).clamp_(-E4M3_MAX, E4M3_MAX).to(E4M3), scale


def quantize_rows_eager(
    xs: torch.Tensor | list[torch.Tensor], col_scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference: (x * col_scale) per row -> (e4m3 [T, K], fp32 row scales [T, 1]); a list of
    [T, K_i] is quantized as its concatenation. One reciprocal per row, a multiply per element."""
    x = xs if isinstance(xs, torch.Tensor) else torch.cat(list(xs), dim=1)
    v = x.float() if col_scale is None else x.float() * col_scale.float()
    s = v.abs().amax(dim=1, keepdim=True).clamp_min(_TINY) * (1.0 / E4M3_MAX)
    return (v * (1.0 / s)).clamp_(-E4M3_MAX, E4M3_MAX).to(E4M3), s


def _triton():
    try:
        from . import fp8_triton
    except ImportError:  # no Triton: the references are correct, only slower
        return None
    return fp8_triton


def quantize_rows(
    xs: torch.Tensor | list[torch.Tensor], col_scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """`quantize_rows_eager`, as one Triton pass on CUDA (the sources read in place, no cat)."""
    if not isinstance(xs, torch.Tensor) and len(xs) > 3:  # the kernel reads up to three sources
        xs = torch.cat(list(xs), dim=1)
    first = xs if isinstance(xs, torch.Tensor) else xs[0]
    fast = _triton() if first.is_cuda else None
    return fast.quantize_rows(xs, col_scale) if fast is not None else quantize_rows_eager(xs, col_scale)


def transpose_cat(datas: list[torch.Tensor]) -> torch.Tensor:
    """[O_i, I] -> [I, sum O_i] (row-major): the column-major operand of the input-gradient GEMM."""
    fast = _triton() if datas[0].is_cuda else None
    if fast is not None:
        return fast.transpose_cat(datas)
    return torch.cat(datas).t().contiguous()


def _ones(n: int, device: torch.device) -> torch.Tensor:
    return torch.ones(1, n, dtype=torch.float32, device=device)


def linear(
    x2: torch.Tensor, w: Fp8Weight, bias: torch.Tensor | None = None, xq: tuple | None = None
) -> torch.Tensor:
    """x2 [T, I] @ W^T (+ bias) in x2's dtype. `xq`: x2 already quantized (a group sharing one input)."""
    if not w.compute:
        return torch.nn.functional.linear(x2, w.dequant(x2.dtype), bias)
    q, s = xq if xq is not None else quantize_rows(x2)
    out = torch._scaled_mm(q, w.data.t(), scale_a=s, scale_b=w.scale[None, :], out_dtype=x2.dtype)
    return out if bias is None else out.add_(bias)


def grad_input(gys: list[torch.Tensor], ws: list[Fp8Weight]) -> torch.Tensor:
    """sum_i gy_i [T, O_i] @ W_i [O_i, I], as one GEMM over the members' concatenated outputs."""
    if not ws[0].compute:
        out = torch.mm(gys[0], ws[0].dequant(gys[0].dtype))
        for g, w in zip(gys[1:], ws[1:], strict=True):
            out.addmm_(g, w.dequant(g.dtype))
        return out
    col = ws[0].scale if len(ws) == 1 else torch.cat([w.scale for w in ws])
    q, s = quantize_rows(gys, col)  # W's row scales belong to gy's columns here
    w_t = transpose_cat([w.data for w in ws])  # [I, sum O]: _scaled_mm's second operand is column-major
    return torch._scaled_mm(
        q, w_t.t(), scale_a=s, scale_b=_ones(w_t.shape[0], q.device), out_dtype=gys[0].dtype
    )


def frozen_linear(x: torch.Tensor, w: Fp8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., I] @ W^T (+ bias) with autograd: a frozen fp8 linear that has no LoRA."""
    return stored_weight.frozen_linear(x, w, bias, linear, grad_input)

"""BASE_PRECISION mxfp8: a frozen linear stored in MXFP8 (e4m3, one e8m0 scale per 32 inputs;
`kohakumoss_kernels.weights.mxfp8`) whose forward is a block-scaled fp8 GEMM. Only Blackwell cards (sm100+) have
that GEMM: elsewhere `quantize_frozen_linears` refuses the mode by name (fp8_base.check_device)."""

from __future__ import annotations

import torch
from torch import nn

from kohakumoss.precision.default_ops import default_ops
from kohakumoss_kernels import OpSet
from kohakumoss_kernels.weights import mxfp8


class Mxfp8Linear(nn.Linear):
    """A frozen nn.Linear in MXFP8: `weight` (e4m3) with `weight_scale` (e8m0 [O, I / 32]) and the same
    scales in the GEMM's tile layout (`weight_scale_blocked`)."""

    mxfp8_compute: bool
    source_dtype: torch.dtype

    def mxfp8_weight(self) -> mxfp8.Mxfp8Weight:
        return mxfp8.Mxfp8Weight(
            self.weight, self.weight_scale, self.weight_scale_blocked, self.mxfp8_compute
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.bias.to(x.dtype) if self.bias is not None else None
        ops = self.__dict__.get("ops") or default_ops()  # the model's OpSet: the registry picks the GEMM
        return ops.stored_linear(x, self.mxfp8_weight(), bias)

    def _apply(self, fn, recurse: bool = True):
        """A model cast moves the fp8 bytes and their scales, never re-types them."""
        kept = self.weight.data, self.weight_scale, self.weight_scale_blocked
        super()._apply(fn, recurse)
        device = self.weight.device
        self.weight.data = kept[0].to(device)
        self.weight_scale, self.weight_scale_blocked = kept[1].to(device), kept[2].to(device)
        self.source_dtype = fn(torch.zeros((), dtype=self.source_dtype)).dtype
        return self


def to_mxfp8(lin: nn.Linear, ops: OpSet | None = None) -> None:
    """Turn frozen `lin` into an Mxfp8Linear in place (its input width a multiple of 32)."""
    if lin.in_features % mxfp8.BLOCK:
        raise ValueError(f"MXFP8 needs input widths in multiples of {mxfp8.BLOCK}, not {lin.in_features}")
    source = lin.weight.dtype
    w = mxfp8.quantize_weight(lin.weight)
    lin.weight = nn.Parameter(w.data, requires_grad=False)
    lin.register_buffer("weight_scale", w.scale)
    lin.register_buffer("weight_scale_blocked", w.blocked, persistent=False)
    lin.mxfp8_compute, lin.source_dtype = True, source
    if ops is not None:
        lin.__dict__["ops"] = ops
    lin.__class__ = Mxfp8Linear

"""BASE_PRECISION: the DiT blocks' frozen linears (q, k, v, o and the MLP's) stored in float8 e4m3 or int8
with one scale per output row (`kohakumoss_kernels.weights.fp8`, `kohakumoss_kernels.weights.int8`), for adapter
training and sampling.

- `same`: the compute dtype (bf16 / fp16), as loaded.
- `fp8`: fp8 storage and fp8 GEMMs (activations and gradients quantized per row on the fly), sm89+.
- `fp8_weight`: fp8 storage, dequantized per call: the memory saving on any card, GEMMs as before.
- `int8`: int8 storage and int8 forward GEMMs (`torch._int_mm`), sm80+ (`int8_base`); a ConvRot int8
  file's bytes are kept as stored (`quantize_frozen_linears(..., source=path)`).
- `int8_weight`: int8 storage, dequantized per call, any card.
- `mxfp8`: MXFP8 storage (e4m3, an e8m0 scale per 32 inputs) and block-scaled fp8 GEMMs, sm100+ only
  (`mxfp8_base`); refused by name on every other card and on the CPU.
The per-sample modulation linears, the embedders and the final layer stay in the compute dtype (small,
and they set every token's scale). A quantized linear becomes an `Fp8Linear` in place (same object, its
class swapped): an nn.Linear whose weight is an fp8 parameter beside a `weight_scale` buffer, which is
LyCORIS's own weight-only fp8 linear convention: it wraps such a linear in bypass mode, dequantizes it
where an algorithm needs the weight, and refuses to merge into it.
"""

from __future__ import annotations

import torch
from torch import nn

from kohakumoss_common.errors import ConfigError
from kohakumoss_kernels import OpSet
from kohakumoss_kernels.weights import fp8, int8, mxfp8

from .default_ops import default_ops
from .int8_base import Int8Linear, stored_int8_weights, to_int8
from .mxfp8_base import Mxfp8Linear, to_mxfp8

BASE_PRECISIONS = ("same", "fp8", "fp8_weight", "int8", "int8_weight", "mxfp8")
QUANTIZED = ("q", "k", "v", "o", "ffn_up_gate", "ffn_down")


def _quantized_linears(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    return [
        (f"layers.{i}.{name}", m)
        for i, block in enumerate(model.layers)
        for name, m in block.named_modules()
        if name.rsplit(".", 1)[-1] in QUANTIZED and type(m) is nn.Linear
    ]


def check_device(knob: str, mode: str, device: torch.device | None) -> None:
    """A ConfigError naming `knob` when `mode`'s GEMMs do not run on `device` (None: not checked)."""
    if device is None or mode not in ("fp8", "int8", "mxfp8"):
        return
    if mode == "mxfp8":
        _check_mxfp8(knob, torch.device(device))
        return
    ok, need, fallback = (
        (fp8.can_compute(device), "sm89+", "fp8 storage")
        if mode == "fp8"
        else (int8.can_compute(device), "sm80+", "int8 storage")
    )
    if ok:
        return
    cap = torch.cuda.get_device_capability(device) if torch.device(device).type == "cuda" else None
    raise ConfigError(
        knob,
        f"'{mode}' computes with {mode} GEMMs, which need {need} (this card: sm{cap[0]}{cap[1]}); "
        f"use '{mode}_weight' ({fallback}, GEMMs in the compute dtype)"
        if cap
        else f"'{mode}' needs a CUDA card of {need} or the CPU, not {device}",
    )


def _check_mxfp8(knob: str, device: torch.device) -> None:
    if mxfp8.can_compute(device):
        return
    where = (
        f"this card is sm{''.join(map(str, torch.cuda.get_device_capability(device)))}"
        if device.type == "cuda"
        else f"{device} has no block-scaled fp8 GEMM"
    )
    raise ConfigError(
        knob,
        f"'mxfp8' computes with block-scaled fp8 GEMMs (MXFP8), which only Blackwell cards have (sm100+); "
        f"{where}; use 'fp8' (row-scaled fp8 GEMMs, sm89+) or 'fp8_weight' / 'int8_weight' (storage only)",
    )


def to_fp8(lin: nn.Linear, compute: bool, ops: OpSet | None = None) -> None:
    """Turn frozen `lin` into an Fp8Linear in place (e4m3 rows, one float32 scale each); `ops`: the
    model's OpSet, whose stored_linear runs its forward."""
    source = lin.weight.dtype
    data, scale = fp8.quantize_weight(lin.weight)
    lin.weight = nn.Parameter(data, requires_grad=False)
    lin.register_buffer("weight_scale", scale)
    # fp8 GEMMs take widths in multiples of 16; another linear keeps the storage, dequantized per call
    gemm_ok = lin.in_features % 16 == 0 and lin.out_features % 16 == 0
    lin.fp8_compute, lin.source_dtype = compute and gemm_ok, source
    if ops is not None:
        lin.__dict__["ops"] = ops  # a plain attribute, not a submodule or state
    lin.__class__ = Fp8Linear


def quantize_linear(lin: nn.Linear, mode: str, stored=None, ops=None) -> None:
    """Store frozen nn.Linear `lin` per `mode` (fp8, fp8_weight, int8, int8_weight) in place; `stored`:
    an int8 file's (data, scale, ConvRot group) for it, kept as is in an int8 mode."""
    if mode.startswith("int8"):
        to_int8(lin, mode == "int8", stored, ops)
    elif mode == "mxfp8":
        to_mxfp8(lin, ops)
    else:
        to_fp8(lin, mode == "fp8", ops)


def quantize_frozen_linears(
    model: nn.Module, mode: str, device: torch.device | None = None, source=None
) -> int:
    """Quantize the blocks' frozen linears of `model` per BASE_PRECISION `mode`; returns how many.
    Call before the memory plan is installed (streaming then moves the fp8 bytes) and before LyCORIS
    wraps the linears (it keeps their forward as the bypass's base). source: the checkpoint the model
    was loaded from; with an int8 mode, its int8 weights (ConvRot ones included) are kept as stored."""
    if mode not in BASE_PRECISIONS:
        raise ConfigError("BASE_PRECISION", f"'{mode}' is not one of {BASE_PRECISIONS}")
    if mode == "same":
        return 0
    check_device("BASE_PRECISION", mode, device)
    stored = stored_int8_weights(source) if source is not None and mode.startswith("int8") else {}
    linears = _quantized_linears(model)
    ops = getattr(model, "ops", None)
    for name, lin in linears:
        if lin.weight.requires_grad:
            raise ConfigError(
                "BASE_PRECISION", f"'{mode}' is for a frozen base (adapter training); the weights train here"
            )
        quantize_linear(lin, mode, stored.get(f"{name}.weight"), ops)
    return len(linears)


def frozen_weight(lin: nn.Linear, dtype: torch.dtype):
    """The linear's frozen weight for an op computing in `dtype`: a tensor, or its fp8 / int8 / MXFP8 form."""
    if isinstance(lin, Int8Linear):
        return lin.int8_weight()
    if isinstance(lin, Mxfp8Linear):
        return lin.mxfp8_weight()
    if isinstance(lin, Fp8Linear):
        return fp8.Fp8Weight(lin.weight, lin.weight_scale, lin.fp8_compute)
    return lin.weight.to(dtype)


def base_dtype(lin: nn.Linear) -> torch.dtype:
    """The dtype the linear computes in (its weight's, or the one it was quantized from)."""
    return getattr(lin, "source_dtype", lin.weight.dtype)


class Fp8Linear(nn.Linear):
    """A frozen nn.Linear stored in float8: `weight` (e4m3) times `weight_scale` (one float32 per row);
    its forward is the registry's stored_linear over the `fp8` kind."""

    fp8_compute: bool
    source_dtype: torch.dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.bias.to(x.dtype) if self.bias is not None else None
        ops = self.__dict__.get("ops") or default_ops()  # the model's OpSet: the registry picks the GEMM
        return ops.stored_linear(x, frozen_weight(self, x.dtype), bias)

    def _apply(self, fn, recurse: bool = True):
        """A model cast (`.to(dtype)`, `.half()`) moves the fp8 bytes and their scales, never re-types them."""
        data, scale = self.weight.data, self.weight_scale
        super()._apply(fn, recurse)
        if self.weight.dtype != data.dtype:
            self.weight.data = data.to(self.weight.device)
            self.weight_scale = scale.to(self.weight.device)
        self.source_dtype = fn(torch.zeros((), dtype=self.source_dtype)).dtype  # the compute dtype follows
        return self

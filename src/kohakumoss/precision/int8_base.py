"""BASE_PRECISION int8 / int8_weight: a frozen linear stored in int8 with one float32 scale per output
row (`kohakumoss_kernels.weights.int8`), quantized here or kept as a released int8 file stores it.

- `int8`: int8 storage and int8 GEMMs for the forward (`torch._int_mm`), CUDA sm80+ or the CPU.
- `int8_weight`: int8 storage, dequantized per call: the memory saving on any card.
A ConvRot file's int8 weights (`*_int8_convrot.safetensors`, `kohakumoss_common.quant`) are kept as
stored, with their rotation applied to the activations (`stored_int8_weights`): no second rounding.
The linear keeps its class contract for LyCORIS (an nn.Linear subclass not named Linear: wrapped in
bypass mode; the algorithms allowed on it are the adapters' `Algo.quantized_base` ones (adapters/algos.py), which never read the weight).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from kohakumoss.precision.default_ops import default_ops
from kohakumoss_common.errors import CheckpointError
from kohakumoss_kernels import OpSet
from kohakumoss_kernels.weights import int8


class Int8Linear(nn.Linear):
    """A frozen nn.Linear stored in int8: `weight` (int8) times `weight_scale` (float32 per row), rotated
    back per `convrot_group` input columns where the weights came from a ConvRot file (0: no rotation)."""

    int8_compute: bool
    convrot_group: int
    source_dtype: torch.dtype

    def int8_weight(self) -> int8.Int8Weight:
        return int8.Int8Weight(self.weight, self.weight_scale, self.convrot_group, self.int8_compute)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.bias.to(x.dtype) if self.bias is not None else None
        ops = self.__dict__.get("ops") or default_ops()  # the model's OpSet: the registry picks the GEMM
        return ops.stored_linear(x, self.int8_weight(), bias)

    def _apply(self, fn, recurse: bool = True):
        """A model cast (`.to(dtype)`, `.half()`) moves the int8 bytes and their scales, never re-types them."""
        data, scale = self.weight.data, self.weight_scale
        super()._apply(fn, recurse)
        self.weight.data = data.to(self.weight.device)
        self.weight_scale = scale.to(self.weight.device)
        self.source_dtype = fn(torch.zeros((), dtype=self.source_dtype)).dtype  # the compute dtype follows
        return self


def to_int8(
    lin: nn.Linear,
    compute: bool,
    stored: tuple[torch.Tensor, torch.Tensor, int] | None = None,
    ops: OpSet | None = None,
    device: torch.device | str | None = None,
    source_dtype: torch.dtype | None = None,
) -> None:
    """Turn frozen `lin` into an Int8Linear in place: its weight quantized per row, or `stored`
    (int8 data [O, I], scale [O], ConvRot group) taken as is. device / source_dtype: where the bytes go
    and the compute dtype, for a linear still on the meta device (a streamed load); else its weight's."""
    source = source_dtype or lin.weight.dtype
    device = device if device is not None else lin.weight.device
    if stored is None:
        data, scale = int8.quantize_weight(lin.weight)
        group = 0
    else:
        data, scale, group = stored
        if tuple(data.shape) != tuple(lin.weight.shape):
            raise ValueError(
                f"stored int8 weight {tuple(data.shape)} for a linear of {tuple(lin.weight.shape)}"
            )
    lin.weight = nn.Parameter(data.to(device), requires_grad=False)
    lin.register_buffer("weight_scale", scale.to(device=device, dtype=torch.float32))
    lin.int8_compute, lin.convrot_group, lin.source_dtype = compute, group, source
    if ops is not None:
        lin.__dict__["ops"] = ops  # a plain attribute, not a submodule or state
    lin.__class__ = Int8Linear


def stored_int8_weights(path: str | Path) -> dict[str, tuple[torch.Tensor, torch.Tensor, int]]:
    """The int8 weights of a DiT checkpoint (any layout, native keys `layers.N.proj.q.weight`...):
    native weight key -> (int8 data [O, I], float32 scale [O], ConvRot group or 0). Fused tensors
    (Comfy-Org's `proj.qkv`) split by rows, with their row scales."""
    from kohakumoss.model.io import read_checkpoint  # the model package reads the file's layout
    from kohakumoss_common.io import iter_tensors

    info = read_checkpoint(path)
    plan = info.quant
    int8_keys = {k for k in plan.scales if info.entries.get(k, ("",))[0] == "I8"}
    if not int8_keys:
        return {}
    scales = dict(iter_tensors(info.path, keys={plan.scales[k] for k in int8_keys}))
    out: dict[str, tuple[torch.Tensor, torch.Tensor, int]] = {}
    for key, data in iter_tensors(info.path, keys=int8_keys):
        s = scales[plan.scales[key]].float().reshape(-1)
        if s.numel() == 1:
            s = s.expand(data.shape[0]).clone()
        if s.numel() != data.shape[0]:
            raise CheckpointError(
                info.path, f"{plan.scales[key]}: {s.numel()} scales for {data.shape[0]} rows"
            )
        group = plan.rotations.get(key, 0)
        parts = info.layout.fused_parts(key)
        if parts is None:
            out[info.layout.key_to_native(key)] = (data, s, group)
            continue
        # a fused tensor's rows are its members' rows in order; ConvRot rotates columns: each keeps it
        for name, d, sc in zip(parts, data.chunk(len(parts)), s.chunk(len(parts)), strict=True):
            out[name] = (d.contiguous(), sc.contiguous(), group)
    return out

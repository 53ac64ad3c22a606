"""What every frozen quantized weight (fp8, int8, MXFP8) shows of itself: its stored tensor's metadata."""

from __future__ import annotations

import torch

# The frozen weight types an op with a weight argument dispatches on (`op_list.OpSpec.weight_arg`):
# a plain tensor, then each StoredWeight subclass's `kind`.
WEIGHT_KINDS = ("dense", "fp8", "int8", "mxfp8")


def weight_kind(w) -> str:
    """'dense' for a tensor, the record's `kind` for a stored (quantized) weight."""
    return w.kind if isinstance(w, StoredWeight) else "dense"


class StoredWeight:
    """Base of the quantized weight records: `shape`, `dtype` and `device` are those of `data`; `kind`
    names the format (one of WEIGHT_KINDS) and picks the backends of the ops over it (op_list's
    `weight_arg`: the LoRA ops, stored_linear)."""

    data: torch.Tensor
    kind = ""

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.data.dtype

    @property
    def device(self) -> torch.device:
        return self.data.device


class _FrozenLinear(torch.autograd.Function):
    """y = forward(x2, w, bias); the input gradient from `grad_input`; a frozen weight gets none."""

    @staticmethod
    def forward(ctx, x2, w, bias, forward, grad_input):
        ctx.w, ctx.grad_input = w, grad_input
        return forward(x2, w, bias)

    @staticmethod
    def backward(ctx, gy):
        gx = ctx.grad_input([gy], [ctx.w]) if ctx.needs_input_grad[0] else None
        return gx, None, gy.sum(0) if ctx.needs_input_grad[2] else None, None, None


def frozen_linear(x: torch.Tensor, w: StoredWeight, bias, forward, grad_input) -> torch.Tensor:
    """x [..., I] @ W^T (+ bias) with autograd, for a stored weight with no LoRA (stored_linear's
    backends): `forward(x2, w, bias)` on the rows, `grad_input([gy], [w])` for the backward (each
    format's own GEMMs); the weight is kept on ctx, never a dequantized copy."""
    out = _FrozenLinear.apply(x.reshape(-1, x.shape[-1]), w, bias, forward, grad_input)
    return out.reshape(*x.shape[:-1], out.shape[-1])

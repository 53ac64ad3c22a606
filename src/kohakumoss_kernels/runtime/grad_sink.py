"""Weight gradients accumulated by their own GEMM into the parameter's `.grad` (beta = 1), not returned.

Autograd adds a returned gradient into an existing `.grad` with one more kernel per parameter (a read of
two fp32 tensors and a write): ~600 small kernels per step of the 5B model's LoRA under CUDA graphs, whose
micro-steps accumulate into fixed gradient buffers. Inside an `into(params)` window, opened by the owner
of those buffers, an op that supports it writes `grad += a @ b` in the GEMM and returns None instead.
Outside a window, or for a parameter without a fitting `.grad`, the op returns its gradient as usual.
The owner opens a window only where nothing watches gradients arrive (the graphed plain plan; gradient
offload's hooks are never graphed): autograd sees None for a sunk gradient.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch

_params: dict[int, torch.Tensor] = {}


@contextmanager
def into(params: Iterable[torch.Tensor]) -> Iterator[None]:
    """Inside: ops may accumulate the gradients of `params` straight into their `.grad`."""
    held = {id(p): p for p in params}
    _params.update(held)
    try:
        yield
    finally:
        for k in held:
            _params.pop(k, None)


def target(param: torch.Tensor, shape: torch.Size | tuple[int, ...]) -> torch.Tensor | None:
    """param's `.grad` when the window holds param and the buffer takes a GEMM's output directly."""
    if _params.get(id(param)) is not param:
        return None
    g = param.grad
    if g is None or tuple(g.shape) != tuple(shape) or not g.is_contiguous():
        return None
    return g


def mm_into(grad: torch.Tensor, a: torch.Tensor, b: torch.Tensor, alpha: float = 1.0) -> None:
    """grad += alpha * a @ b in one GEMM; on CUDA an fp32 grad takes bf16/fp16 products directly."""
    if a.dtype == grad.dtype:
        grad.addmm_(a, b, alpha=alpha)
    elif grad.is_cuda and grad.dtype == torch.float32:
        torch.addmm(grad, a, b, alpha=alpha, out_dtype=torch.float32, out=grad)
    else:
        grad.add_(torch.mm(a, b).to(grad.dtype), alpha=alpha)

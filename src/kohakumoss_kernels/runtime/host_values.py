"""Host copies of small index tensors (cu_seqlens) that ops need as Python ints.

Reading a device tensor's values (`.tolist()`) waits for the GPU: once per attention call that is one
stall per block, and it cannot be captured in a CUDA graph. Whoever builds such a tensor from host
values registers them here; ops read them back without touching the device. Unregistered tensors
fall back to `.tolist()`.
"""

from __future__ import annotations

import torch
from torch.utils.weak import WeakTensorKeyDictionary

# keyed by tensor identity (a plain WeakKeyDictionary would compare tensors with ==)
_VALUES = WeakTensorKeyDictionary()
_READS = [0]  # host_values calls so far: a CUDA graph captured around one bakes those values in


def reads() -> int:
    """How many times ops have read host values: compare before and after a capture."""
    return _READS[0]


def register_host_values(tensor: torch.Tensor, values) -> torch.Tensor:
    """Remember `values` (the tensor's contents, as ints) for `tensor`; returns the tensor."""
    values = tuple(int(v) for v in values)
    if len(values) != tensor.numel():
        raise ValueError(f"{len(values)} host values for a tensor of {tensor.numel()} elements")
    _VALUES[tensor] = values
    return tensor


@torch.compiler.disable  # traced, the count became a guard: one recompile per call until dynamo gave up
def host_values(tensor: torch.Tensor) -> tuple[int, ...]:
    """The tensor's values as ints: the registered copy, else read from the device (a sync).

    Never traced by torch.compile: an op's compile backend (its reference compiled) calls it as plain Python."""
    _READS[0] += 1
    values = _VALUES.get(tensor)
    if values is None:
        values = tuple(tensor.tolist())
    return values

"""Per-tensor streaming of a checkpoint into a module built on the meta device.

Tensors are read one at a time, renamed, optionally dequantized, cast to the target dtype and moved
to the target device; a full fp32 copy of the model never exists in host memory.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from kohakumoss_common.errors import CheckpointError
from kohakumoss_common.io import set_module_tensor

Shapes = dict[str, tuple[int, ...]]
_LIST = 20


def expected_shapes(module: nn.Module) -> Shapes:
    """Every persistent parameter and buffer of `module` with its shape (works on the meta device)."""
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


def _listing(keys: Iterable[str]) -> str:
    keys = sorted(keys)
    more = f" ... and {len(keys) - _LIST} more" if len(keys) > _LIST else ""
    return ", ".join(keys[:_LIST]) + more


def check_keys(path: str | Path, expected: Shapes, found: Shapes, optional: Iterable[str] = ()) -> None:
    """Raise a `CheckpointError` listing missing and unexpected keys, or naming a shape mismatch."""
    optional = set(optional)
    missing = set(expected) - set(found) - optional
    unexpected = set(found) - set(expected)
    problems = []
    if missing:
        problems.append(f"missing keys ({len(missing)}): {_listing(missing)}")
    if unexpected:
        problems.append(f"unexpected keys ({len(unexpected)}): {_listing(unexpected)}")
    for key in sorted(set(expected) & set(found)):
        if tuple(expected[key]) != tuple(found[key]):
            problems.append(
                f"shape mismatch at {key}: checkpoint {list(found[key])}, model {list(expected[key])}"
            )
    if problems:
        raise CheckpointError(path, "; ".join(problems))


def set_tensor(module: nn.Module, name: str, tensor: torch.Tensor) -> None:
    """Replace parameter or buffer `name` (dotted) of `module` by `tensor`, frozen, without a copy."""
    set_module_tensor(module, name, tensor, requires_grad=False)


def cast(tensor: torch.Tensor, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """Floating tensors to `dtype`, every tensor to `device` (integer buffers keep their dtype)."""
    if tensor.is_floating_point():
        tensor = tensor.to(dtype=dtype)
    return tensor.to(device)


def meta_leftovers(module: nn.Module) -> list[str]:
    """Names of parameters and buffers still on the meta device (nothing loaded them)."""
    names = [n for n, p in module.named_parameters() if p.is_meta]
    return names + [n for n, b in module.named_buffers() if b.is_meta]

"""Optimizer states as plain tensors: a tensor-subclass state (torchao's 8-bit / 4-bit / fp8 AdamW keep
theirs as `OptimState8bit` etc.) is saved as its component tensors plus a small description, and rebuilt
when the state is loaded into an optimizer.

Why: checkpoints are read with `torch.load(weights_only=True)`, which unpickles a subclass only when its
class was registered as a safe global in this process: the exporter (which never builds the optimizer)
and any reader that has not imported torchao could not open the file. The portable form loads anywhere;
only `restore_state` needs the class, and it takes it from the modules already imported (building the
optimizer imports them), never importing a module a file names.
"""

from __future__ import annotations

import sys

import torch

from kohakumoss_common.errors import CheckpointError

MARK = "__tensor_subclass__"
# what a subclass's flatten context may hold so the file still loads under weights_only
_PLAIN = (bool, int, float, str, type(None), torch.dtype, torch.device, torch.Size)


def _plain_ctx(ctx: object) -> bool:
    if isinstance(ctx, (list, tuple)):
        return all(_plain_ctx(c) for c in ctx)
    if isinstance(ctx, dict):
        return all(isinstance(k, str) and _plain_ctx(v) for k, v in ctx.items())
    return isinstance(ctx, _PLAIN)


def _flatten(t: torch.Tensor, where: str) -> dict:
    cls = type(t)
    if not hasattr(t, "__tensor_flatten__"):
        raise CheckpointError(where, f"{cls.__qualname__} is a tensor subclass without __tensor_flatten__")
    names, ctx = t.__tensor_flatten__()
    if not _plain_ctx(ctx):
        raise CheckpointError(where, f"{cls.__qualname__}'s flatten context {ctx!r} is not plain data")
    return {
        MARK: f"{cls.__module__}:{cls.__qualname__}",
        "tensors": {n: portable_state(getattr(t, n), f"{where}.{n}") for n in names},
        "ctx": ctx,
        "size": list(t.shape),
        "stride": list(t.stride()),
    }


def portable_state(obj: object, where: str = "<optimizer state>") -> object:
    """`obj` (an optimizer state_dict, nested) with every tensor subclass replaced by its plain form."""
    if isinstance(obj, torch.Tensor):
        if type(obj) is torch.Tensor or type(obj) is torch.nn.Parameter:
            return obj
        return _flatten(obj, where)
    return _map_containers(portable_state, obj, where)


def _map_containers(fn, obj: object, where: str) -> object:
    """fn applied to each item of a dict, list or tuple (its path in `where`); anything else as it is."""
    if isinstance(obj, dict):
        return {k: fn(v, f"{where}.{k}") for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = [fn(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        return tuple(items) if isinstance(obj, tuple) else items
    return obj


def _subclass(name: str, where: str) -> type:
    module, _, qualname = name.partition(":")
    mod = sys.modules.get(module)
    if mod is None:
        raise CheckpointError(
            where,
            f"holds {qualname} states from '{module}', which this process has not imported "
            "(build the optimizer that made them before loading its state)",
        )
    cls = mod
    for part in qualname.split("."):
        cls = getattr(cls, part, None)
    if not (isinstance(cls, type) and issubclass(cls, torch.Tensor) and hasattr(cls, "__tensor_unflatten__")):
        raise CheckpointError(where, f"'{name}' is not a tensor subclass that can be rebuilt")
    return cls


def restore_state(obj: object, where: str = "<optimizer state>") -> object:
    """Inverse of `portable_state`: plain forms rebuilt as their tensor subclass (states already live pass)."""
    if isinstance(obj, dict) and MARK in obj:
        cls = _subclass(obj[MARK], where)
        tensors = {n: restore_state(v, f"{where}.{n}") for n, v in obj["tensors"].items()}
        return cls.__tensor_unflatten__(tensors, obj["ctx"], torch.Size(obj["size"]), tuple(obj["stride"]))
    return _map_containers(restore_state, obj, where)

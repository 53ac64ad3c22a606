"""Compute-dtype copies of fp32 master weights, cast for a whole forward pass in one multi-tensor launch.

A LoRA linear casts its two fp32 weights to bf16 on every call: ~500 kernels of a few microseconds per
step of the 5B model. The caller that owns the weights (the adapter) opens a `cast_once` window around a
forward: every listed master is cast into one buffer at once, members of a group side by side so that
their concatenation is a view too. Ops call `cast` / `cast_cat`, which return the cached copy inside the
window and cast as before outside it (or for a tensor the window does not hold).

The buffer lives while the window is open and while autograd keeps a view of it for the backward, as the
per-call casts did. One window at a time per process (the forward of one model); windows do not nest.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

# id(master) -> (master, copy); (id, id, ...) of a group -> the members' copies concatenated (a view)
_copies: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
_groups: dict[tuple[int, ...], torch.Tensor] = {}


def begin(groups: Sequence[Sequence[torch.Tensor]], dtype: torch.dtype) -> None:
    """Open the window: cast every master of `groups` (each a run of same-width 2-D tensors, or one
    tensor) into one fresh buffer of `dtype`; a group's copies are consecutive rows (`cast_cat` is a view)."""
    end()
    masters = [t for g in groups for t in g]
    if not masters:
        return
    flat = torch.empty(sum(t.numel() for t in masters), dtype=dtype, device=masters[0].device)
    views = [v.view(t.shape) for v, t in zip(flat.split([t.numel() for t in masters]), masters, strict=True)]
    with torch.no_grad():
        torch._foreach_copy_(views, masters)
    it = iter(views)
    offset = 0
    for g in groups:
        members = [(t, next(it)) for t in g]
        for t, v in members:
            _copies[id(t)] = (t, v)
        rows = sum(t.shape[0] for t in g)
        if len(g) > 1 and all(t.dim() == 2 and t.shape[1] == g[0].shape[1] for t in g):
            _groups[tuple(id(t) for t in g)] = flat[offset : offset + rows * g[0].shape[1]].view(rows, -1)
        offset += sum(t.numel() for t in g)


def end() -> None:
    """Close the window (views autograd saved stay valid; the buffer goes when they do)."""
    _copies.clear()
    _groups.clear()


@contextmanager
def cast_once(groups: Sequence[Sequence[torch.Tensor]], dtype: torch.dtype) -> Iterator[None]:
    """Inside: `cast(t, dtype)` of a listed master returns its copy, cast once on entry."""
    begin(groups, dtype)
    try:
        yield
    finally:
        end()


def cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t in `dtype`: the window's copy when it holds t, else t.to(dtype) (no copy when already dtype)."""
    entry = _copies.get(id(t))
    if entry is not None and entry[0] is t and entry[1].dtype == dtype:
        return entry[1]
    return t.to(dtype)


def cast_cat(ts: Sequence[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """torch.cat(ts) in `dtype`: a view of the window's buffer when it holds ts as one group."""
    cat = _groups.get(tuple(id(t) for t in ts))
    if cat is not None and cat.dtype == dtype and all(_copies[id(t)][0] is t for t in ts):
        return cat
    return torch.cat([cast(t, dtype) for t in ts]) if len(ts) > 1 else cast(ts[0], dtype)

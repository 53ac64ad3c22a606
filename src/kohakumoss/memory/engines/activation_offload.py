"""Activation offload: what the forward saves for the backward goes to pinned host memory on a side
stream, and comes back, prefetched one block ahead, when the backward reaches it.

Installed per block through `torch.autograd.graph.saved_tensors_hooks`. Weights (parameters, the
streaming slots) and the block's shared inputs (rotary tables, the packed layout, the shared
block modulation) are never copied out; neither are tensors under MIN_BYTES, which cost more to move than keep.
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager

import torch

MIN_BYTES = 1 << 20


class _Saved:
    __slots__ = ("host", "event", "gpu", "gpu_event", "device", "block")

    def __init__(self, host: torch.Tensor, event, device: torch.device, block: int):
        self.host, self.event, self.device, self.block = host, event, device, block
        self.gpu: torch.Tensor | None = None
        self.gpu_event = None


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class ActivationOffload:
    """Per-block saved-tensor offload with backward prefetch; `block(i, keep)` wraps one block's call."""

    def __init__(self, device: torch.device, min_bytes: int = MIN_BYTES):
        self.device = device
        self.cuda = device.type == "cuda"
        self.min_bytes = min_bytes
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self.keep: set[int] = set()  # storages never offloaded (weights, slots)
        self.saved: dict[int, list[_Saved]] = defaultdict(list)
        self.offloaded_bytes = 0  # this step (for tests and the benchmark)

    def keep_tensors(self, tensors) -> None:
        self.keep.update(_storage(t) for t in tensors if t is not None and t.device.type != "meta")

    def keep_storages(self, ptrs: set[int]) -> None:
        self.keep.update(ptrs)

    def _skip(self, t: torch.Tensor, call_keep: set[int]) -> bool:
        if t.device.type != self.device.type or t.numel() * t.element_size() < self.min_bytes:
            return True
        if isinstance(t, torch.nn.Parameter) or (t.is_leaf and t.requires_grad):
            return True
        ptr = _storage(t)
        return ptr in self.keep or ptr in call_keep

    def _pack(self, t: torch.Tensor, block: int, call_keep: set[int]):
        if self._skip(t, call_keep):
            return t
        src = t if t.is_contiguous() else t.contiguous()
        host = torch.empty(src.shape, dtype=src.dtype, pin_memory=self.cuda)
        event = None
        if self.cuda:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.stream):
                host.copy_(src, non_blocking=True)
                event = torch.cuda.Event()
                event.record(self.stream)
            src.record_stream(self.stream)  # the allocator keeps it until the copy is done
        else:
            host.copy_(src)
        saved = _Saved(host, event, t.device, block)
        self.saved[block].append(saved)
        self.offloaded_bytes += host.numel() * host.element_size()
        return saved

    def stash(self, t: torch.Tensor, block: int):
        """Send one tensor to the host as if block `block` had saved it; `fetch` brings it back."""
        return self._pack(t, block, set())

    def fetch(self, packed) -> torch.Tensor:
        return self._unpack(packed)

    def _unpack(self, packed):
        if not isinstance(packed, _Saved):
            return packed
        if packed.gpu is None:
            self._upload(packed)
        t = packed.gpu
        if self.cuda:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(packed.gpu_event)
            t.record_stream(current)
        packed.gpu = None  # each saved tensor is unpacked once; let the memory go with its user
        return t

    def _upload(self, saved: _Saved) -> None:
        if self.cuda:
            self.stream.wait_event(saved.event)
            with torch.cuda.stream(self.stream):
                saved.gpu = saved.host.to(saved.device, non_blocking=True)
                saved.gpu_event = torch.cuda.Event()
                saved.gpu_event.record(self.stream)
        else:
            saved.gpu = saved.host.to(saved.device)

    def prefetch(self, block: int) -> None:
        """Start bringing back what `block` saved (called as the backward reaches the block above)."""
        for saved in self.saved.pop(block, []):
            if saved.gpu is None:
                self._upload(saved)

    @contextmanager
    def block(self, index: int, keep: tuple[torch.Tensor, ...] = ()):
        call_keep = {_storage(t) for t in keep if isinstance(t, torch.Tensor)}
        with torch.autograd.graph.saved_tensors_hooks(
            lambda t: self._pack(t, index, call_keep), self._unpack
        ):
            yield

    def new_step(self) -> None:
        self.saved.clear()
        self.offloaded_bytes = 0

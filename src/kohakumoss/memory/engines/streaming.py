"""Weight streaming: chosen blocks keep their weights in pinned host memory and are copied, ahead of
use, into a ring of GPU slots on a side stream.

Block number n among the streamed ones always uses slot n % K, in forward and in backward. That is
what keeps autograd correct: what the forward saved (the weight, or a view such as weight.t()) points
at that slot's memory, and the backward of the block runs only after the block is back in the same
slot. The ring advances in forward (prefetching the next blocks) and walks back in backward (each
block's backward start, seen by a barrier on its output, loads it and prefetches the blocks below).

The copies bump only the slot buffer's version counter: parameters see the slot through `.data`
views with their own counters, so a reload does not trip autograd's in-place check.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from kohakumoss_common.log import get_logger
from kohakumoss_kernels.weights.fp8 import castable

log = get_logger(__name__)
ALIGN = 256  # bytes; every tensor in a slot starts on an aligned address


@dataclass
class _BlockLayout:
    params: list[nn.Parameter]
    offsets: list[int]
    nbytes: int
    host: torch.Tensor  # uint8, pinned on CUDA
    host_views: list[torch.Tensor]
    slot_views: list[torch.Tensor] | None = None


def _nbytes(p: torch.Tensor) -> int:
    return p.numel() * p.element_size()


def _view(buf: torch.Tensor, offset: int, like: torch.Tensor) -> torch.Tensor:
    return buf[offset : offset + _nbytes(like)].view(like.dtype).view(like.shape)


class WeightStreamer:
    """Streams the weights of `blocks[i]` for i in `streamed` through `slots` device buffers."""

    def __init__(
        self,
        blocks: Sequence[nn.Module],
        streamed: Sequence[int],
        slots: int,
        device: torch.device,
        dtype: torch.dtype | None = None,
        trainable: bool = False,
    ):
        self.device = device
        self.streamed = list(streamed)
        self.position = {b: n for n, b in enumerate(self.streamed)}
        self.num_slots = max(1, min(int(slots), len(self.streamed)))
        self.cuda = device.type == "cuda"
        pin = self.cuda
        self.layouts: dict[int, _BlockLayout] = {}
        for i in self.streamed:
            params = [p for p in blocks[i].parameters() if trainable or not p.requires_grad]
            if dtype is not None:  # the streamed copy is stored in the compute dtype
                for p in params:
                    if castable(p) and p.dtype != dtype:
                        p.data = p.data.to(dtype)
            offsets, total = [], 0
            for p in params:
                offsets.append(total)
                total += -(-_nbytes(p) // ALIGN) * ALIGN
            host = torch.empty(total, dtype=torch.uint8, pin_memory=pin)
            views = []
            for p, off in zip(params, offsets, strict=True):
                v = _view(host.data, off, p)
                v.copy_(p.data)
                p.data = v
                views.append(v)
            self.layouts[i] = _BlockLayout(params, offsets, total, host, views)
        slot_bytes = max((lay.nbytes for lay in self.layouts.values()), default=0)
        self.slot_bytes = slot_bytes
        self.slots = [
            torch.empty(slot_bytes, dtype=torch.uint8, device=device) for _ in range(self.num_slots)
        ]
        for i, lay in self.layouts.items():  # views through .data: their own version counters
            buf = self.slots[self.slot_of(i)].data
            lay.slot_views = [_view(buf, off, p) for p, off in zip(lay.params, lay.offsets, strict=True)]
        self.loaded: list[int | None] = [None] * self.num_slots
        self.ready: list[torch.cuda.Event | None] = [None] * self.num_slots
        self.copy_stream = torch.cuda.Stream(device) if self.cuda else None
        self.loads = 0  # block copies issued (for tests and the benchmark)
        mib = sum(lay.nbytes for lay in self.layouts.values()) / 2**20
        log.info(
            f"weight streaming: {len(self.streamed)} blocks ({mib:,.0f} MiB) in host memory, "
            f"{self.num_slots} slots of {slot_bytes / 2**20:,.0f} MiB on {device}"
        )

    def slot_of(self, block: int) -> int:
        return self.position[block] % self.num_slots

    def is_streamed(self, block: int) -> bool:
        return block in self.position

    def storages(self) -> set[int]:
        """Data pointers of the slot buffers (what activation offload must never copy out)."""
        return {s.untyped_storage().data_ptr() for s in self.slots}

    def evict(self, slot: int) -> None:
        old = self.loaded[slot]
        if old is not None:  # outside its slot a block's parameters show its host copy
            lay = self.layouts[old]
            for p, v in zip(lay.params, lay.host_views, strict=True):
                p.data = v
        self.loaded[slot] = None

    def _load(self, block: int) -> None:
        s = self.slot_of(block)
        if self.loaded[s] == block:
            return
        self.evict(s)
        lay = self.layouts[block]
        if self.cuda:
            # the slot's previous user is enqueued on the compute stream: copy only after it
            self.copy_stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.copy_stream):
                self.slots[s][: lay.nbytes].copy_(lay.host, non_blocking=True)
                event = torch.cuda.Event()
                event.record(self.copy_stream)
            self.ready[s] = event
        else:
            self.slots[s][: lay.nbytes].copy_(lay.host)
        self.loaded[s] = block
        self.loads += 1

    def ensure(self, block: int) -> None:
        """Block's weights in its slot and usable on the current stream; parameters point there."""
        self._load(block)
        s = self.slot_of(block)
        if self.cuda and self.ready[s] is not None:
            torch.cuda.current_stream(self.device).wait_event(self.ready[s])
        lay = self.layouts[block]
        for p, v in zip(lay.params, lay.slot_views, strict=True):
            p.data = v

    def prefetch(self, block: int, direction: int) -> None:
        """Start copying the next K-1 streamed blocks in `direction` (+1 forward, -1 backward)."""
        n = self.position[block]
        for k in range(1, self.num_slots):
            m = n + direction * k
            if 0 <= m < len(self.streamed):
                self._load(self.streamed[m])

    def invalidate(self) -> None:
        """Forget what the slots hold; every streamed parameter points at its host copy (before a resume loads into them)."""
        for s in range(self.num_slots):
            self.evict(s)

    def write_back_fn(self) -> StreamedWriteBack:
        """A callback for the optimizer engine: updated master -> the streamed host copy (or the device)."""
        return StreamedWriteBack(self)


class StreamedWriteBack:
    """`(param, master)`: a streamed param's updated master into its host copy (a loaded slot goes stale
    and reloads on next use); any other param takes the master directly. `owns(param)`: streamed."""

    def __init__(self, streamer: WeightStreamer):
        self.streamer = streamer
        self.where = {
            id(p): (block, v)
            for block, lay in streamer.layouts.items()
            for p, v in zip(lay.params, lay.host_views, strict=True)
        }

    def owns(self, param: nn.Parameter) -> bool:
        return id(param) in self.where

    def __call__(self, param: nn.Parameter, master: torch.Tensor) -> None:
        found = self.where.get(id(param))
        if found is None:
            param.data.copy_(master, non_blocking=True)
            return
        block, host = found
        host.copy_(master)
        slot = self.streamer.slot_of(block)
        if self.streamer.loaded[slot] == block:
            self.streamer.evict(slot)

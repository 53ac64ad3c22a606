"""The next batches, ready before the step that needs them.

A background thread takes the loader's host batches and does their host work (patchify, cast, PackedSeq,
page-locked copies); the training thread only queues the copies, on a copy stream, and makes its stream
wait for them with an event. Without this the host work of each step (~280 ms at 1 MP on the H200's
host) ran between the GPU's steps, and pageable copies waited behind the previous step.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

import torch

from kohakumoss_common.errors import DataError

from .step import DeviceBatch, HostReady, host_ready, ready_to_device

_END = object()


class Prefetcher:
    """next() -> DeviceBatch, in the loader's order; `ahead` host batches prepared in a thread."""

    def __init__(
        self,
        batches: Iterator,
        device: torch.device,
        dtype: torch.dtype,
        ahead: int = 2,
        start: int = 0,
        pad_to: int = 0,
    ):
        self.device, self.dtype = device, dtype
        self.pad_to = (
            pad_to  # text tokens padded to a multiple of it (host_ready): graphs replay across captions
        )
        self.taken = start  # micro-steps handed out (counted from the plan's start)
        self.cuda = device.type == "cuda"
        self.copy_stream = torch.cuda.Stream(device) if self.cuda else None
        self.queue: queue.Queue = queue.Queue(maxsize=max(1, ahead))
        self.stop = threading.Event()
        self.done = False
        self.source = batches  # closed with the prefetcher when it can be (a Loader: its workers stop)
        self.thread = threading.Thread(target=self._work, args=(iter(batches),), daemon=True, name="prefetch")
        self.thread.start()

    def _work(self, batches: Iterator) -> None:
        while not self.stop.is_set():
            try:
                item = host_ready(next(batches), self.dtype, pin=self.cuda, pad_to=self.pad_to)
            except StopIteration:
                item = _END
            except BaseException as e:  # handed to the training thread, raised there
                item = e
            while not self.stop.is_set():
                try:
                    self.queue.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if item is _END or isinstance(item, BaseException):
                return

    def __iter__(self) -> Prefetcher:
        return self

    def __next__(self) -> DeviceBatch:
        if self.done:
            raise StopIteration
        item = self.queue.get()
        if item is _END:
            self.done = True
            raise StopIteration
        if isinstance(item, BaseException):
            self.done = True
            raise item
        return self._to_device(item)

    def next_batch(self) -> DeviceBatch:
        """next(), with running out of the plan as a DataError."""
        try:
            batch = next(self)
        except StopIteration as e:
            raise DataError(f"the plan ran out of steps at micro-step {self.taken}") from e
        self.taken += 1
        return batch

    def _to_device(self, ready: HostReady) -> DeviceBatch:
        if not self.cuda:
            return ready_to_device(ready, self.device)
        current = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self.copy_stream):
            batch = ready_to_device(ready, self.device)
        current.wait_stream(self.copy_stream)
        # allocated on the copy stream, used on this one: the allocator must not reuse them before it is done
        for t in (batch.x0, batch.text, *batch.seq.tensors()):
            t.record_stream(current)
        for t in (batch.weight, batch.refs):
            if t is not None:
                t.record_stream(current)
        return batch

    def close(self) -> None:
        self.stop.set()
        try:  # a worker blocked on a full queue wakes and sees the stop
            while True:
                self.queue.get_nowait()
        except queue.Empty:
            pass
        close_source = getattr(self.source, "close", None)
        if callable(close_source) and not isinstance(self.source, Iterator):
            close_source()  # a Loader (callable from any thread): a worker blocked on a read no longer holds us
        self.thread.join(timeout=5)

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

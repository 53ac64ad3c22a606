"""CUDA graph capture that cleans up after itself when the capture fails.

torch's `CUDAGraph.capture_end` can raise (an invalidated capture: an op that cannot be captured) before
it ends the caching allocator's window for the graph's pool, and `torch.cuda.graph` then skips restoring
the current stream. `capture` restores the stream, ends the window and releases the pool. On the H200
(torch 2.11) a capture after a failed one replays correctly (tests/kernels/test_capture.py); whether the
allocator then frees its cache to fit a later allocation is not established (a test of that failed
there), so failing captures are avoided where known: the onehot backends, whose F.one_hot failed every
timing capture, now spread per-sample rows with a comparison (`per_token.one_hot`).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import torch


@contextmanager
def capture(
    graph: torch.cuda.CUDAGraph,
    device: torch.device,
    pool=None,
    stream: torch.cuda.Stream | None = None,
) -> Iterator[None]:
    """Capture the block's work into `graph` on `stream` (a new side stream by default); on any error the
    allocator's window is closed and the pool released before the error propagates."""
    stream = stream if stream is not None else torch.cuda.Stream(device)
    # a pool id of our own: after a failed capture `graph.pool()` raises, and the pool would never be freed
    # (a failed timing capture once kept 4 GiB of a 24 GiB-capped first step reserved)
    pool = pool if pool is not None else torch.cuda.graph_pool_handle()
    current = torch.cuda.current_stream(device)
    stream.wait_stream(current)
    with torch.cuda.stream(stream):
        # thread_local: other threads (the loader's pinning, the prefetcher) may use CUDA meanwhile
        graph.capture_begin(pool=pool, capture_error_mode="thread_local")
        try:
            yield
        except BaseException:
            _end_failed(graph, device, pool)
            raise
        try:
            graph.capture_end()
        except BaseException:
            _end_window(device, pool)
            raise
    current.wait_stream(stream)


def _end_failed(graph: torch.cuda.CUDAGraph, device: torch.device, pool) -> None:
    """The block raised mid-capture: end it (the graph is dropped by the caller) and close the window."""
    try:
        graph.capture_end()  # ends the allocator's window too when the capture itself is still valid
    except BaseException:
        _end_window(device, pool)


def _end_window(device: torch.device, pool) -> None:
    """capture_end raised before closing the allocator's window: close it, release the pool and take the
    device's random generator out of capture mode."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    with suppress(RuntimeError):  # raises when the window is already closed: nothing to do
        torch._C._cuda_endAllocateToPool(index, pool)
    with suppress(RuntimeError):
        torch._C._cuda_releasePool(index, pool)
    _end_generator_capture(torch.device("cuda", index))


def _end_generator_capture(device: torch.device) -> None:
    """A capture_end that raised skipped the default generator's capture epilogue, so every later random
    draw on the device raises 'Offset increment outside graph capture'. An empty capture runs the
    prologue and epilogue on the same generator state (its seed and offset kept)."""
    graph = torch.cuda.CUDAGraph()
    with warnings.catch_warnings(), torch.cuda.stream(torch.cuda.Stream(device)):
        warnings.simplefilter("ignore")  # "the CUDA Graph is empty"
        graph.capture_begin(capture_error_mode="thread_local")
        graph.capture_end()
    del graph  # a graph whose capture ended releases its pool itself (releasing it again broke empty_cache)

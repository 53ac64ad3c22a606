"""Weight-gradient GEMMs queued on a side stream, to overlap the compute-bound GEMMs that follow them.

In a LoRA linear's backward, after `sq = scale * gy up`, the input gradient is one big compute-bound GEMM
(`gy W`) while the LoRA weights' gradients (`sq^T x`, `gy^T hs`, accumulated into `.grad` by grad_sink)
are small memory-bound ones that nothing in the backward reads. Inside an `overlap(device)` window,
opened by the owner of the `.grad` buffers around the backward (the graphed step), an op hands that work
to `run`: it is queued on a side stream forked from the current one, and may use SMs the big GEMMs
leave idle (their last wave). Ordering, without `record_stream` (whose frees a CUDA-graph capture defers
to its end): the tensors the side work reads are held until the next `run` call, which first makes the
current stream wait for the side stream; the window's exit waits for it too. So a tensor is freed only
after the side work that read it, as seen from the stream that reuses its memory, and it lives at most
one LoRA op longer than before. Outside a window (or on a CPU), `run` just calls the function.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch


@dataclass
class _Window:
    main: torch.cuda.Stream
    side: torch.cuda.Stream
    held: list[torch.Tensor] = field(default_factory=list)  # what the side work reads, until joined
    # side work queued and not yet waited for; only then may the current stream wait for the side one:
    # in a graph capture, waiting on a stream that never forked from the capture invalidates it
    pending: bool = False


_windows: dict[int, _Window] = {}
_streams: dict[int, torch.cuda.Stream] = {}
launches = 0  # side-stream launches in this process (tests, logs)


@contextmanager
def overlap(device: torch.device | str, enabled: bool = True) -> Iterator[_Window | None]:
    """Inside: `run` queues its work on a side stream of `device` (CUDA only; elsewhere a no-op)."""
    device = torch.device(device)
    if not enabled or device.type != "cuda" or _index(device) in _windows:
        yield None
        return
    index = _index(device)
    main = torch.cuda.current_stream(index)
    window = _Window(main, stream_for(device))
    _windows[index] = window
    try:
        yield window
    finally:
        _windows.pop(index, None)
        if window.pending:  # everything queued aside is done before the window's owner reads
            window.main.wait_stream(window.side)
        window.held.clear()


def stream_for(device: torch.device | str) -> torch.cuda.Stream:
    """The device's side stream, created once (call it before a graph capture: creating a stream is not
    something to do while one is underway)."""
    index = _index(torch.device(device))
    if index not in _streams:
        _streams[index] = torch.cuda.Stream(index)
    return _streams[index]


def active(device: torch.device) -> bool:
    return device.type == "cuda" and _index(device) in _windows


def run(device: torch.device, fn: Callable[[], None], reads: tuple[torch.Tensor, ...]) -> None:
    """fn() on the window's side stream (after the work queued so far on the current one); `reads` are
    the tensors it reads, held until the current stream has waited for it. Outside a window: fn()."""
    window = _windows.get(_index(device)) if device.type == "cuda" else None
    if window is None:
        fn()
        return
    current = torch.cuda.current_stream(device)
    if window.pending:  # the previous side work is done before its inputs can be reused
        current.wait_stream(window.side)
    window.held.clear()
    window.side.wait_stream(current)
    with torch.cuda.stream(window.side):
        fn()
    window.held.extend(reads)
    window.pending = True
    global launches
    launches += 1


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()

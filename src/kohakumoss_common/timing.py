"""Median wall time of a callable on the GPU (CUDA events) or the CPU (perf_counter), after warm-up; the
card's copy bandwidth, the ceiling memory-bound kernels are compared with."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def median_ms(fn: Callable[[], object], warmup: int = 3, iters: int = 20) -> float:
    """Milliseconds per call, median of `iters` timed calls after `warmup` untimed ones."""
    cuda = torch.cuda.is_available()
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def copy_gbs(device: torch.device | str, gib: float = 2.0) -> float:
    """Device-to-device copy bandwidth in GB/s (bytes read + written), `gib` GiB each way, median of 10."""
    n = int(gib * (1 << 30))
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * n / median_ms(lambda: dst.copy_(src), 2, 10) / 1e6

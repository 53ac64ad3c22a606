"""What every Triton backend shares: which (arch, dtype) it supports, launch sizes, the SM count."""

from __future__ import annotations

import functools

import torch

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def supports(arch: str, dtype: torch.dtype) -> bool:
    """Triton runs from sm75 (bf16 from sm80) and on Intel XPU; never on the CPU (the interpreter aside)."""
    import triton  # noqa: F401 -- a missing Triton makes the backend skip itself

    if dtype not in _DTYPES:
        return False
    if arch == "xpu":
        return True
    if not (arch.startswith("sm") and arch[2:].isdigit()):
        return False
    sm = int(arch[2:])
    return sm >= 80 or (sm >= 75 and dtype != torch.bfloat16)


def row_block(d: int) -> tuple[int, int]:
    """BLOCK (a power of two >= d) and num_warps for a one-row-per-program kernel."""
    import triton

    block = triton.next_power_of_2(d)
    return block, max(1, min(16, block // 256))


@functools.lru_cache(maxsize=8)
def _sm_count(device: str) -> int:
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_properties(dev).multi_processor_count
    if dev.type == "xpu":
        return getattr(torch.xpu.get_device_properties(dev), "gpu_subslice_count", 64)
    return 4


def reduce_programs(x: torch.Tensor, rows: int) -> int:
    """How many programs a kernel that also reduces over rows should launch (a few per SM)."""
    return max(1, min(rows, 4 * _sm_count(str(x.device))))

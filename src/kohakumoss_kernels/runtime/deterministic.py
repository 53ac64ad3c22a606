"""DETERMINISTIC: the same inputs give the same bits, run after run (and so a resumed run the same bits
as an uninterrupted one, on the GPU too).

Three things decide the last bits of a GPU step: torch's own kernels (some add with atomics unless
`torch.use_deterministic_algorithms(True)`, which also makes its flash-attention backward and
`index_add_` deterministic), cuBLAS's workspace (`CUBLAS_WORKSPACE_CONFIG`, read when the first
handle is made: set before any GEMM) and this package's backends that add partial sums with atomics
in an order that depends on scheduling: `addmm_lowrank` (the LoRA weight-gradient `cols_into`),
`tilelang` (varlen attention's dQ), `compile` and `flex` (Inductor-generated kernels may add with
atomics). In deterministic mode the backend list is the arch's priority without those
(`backends_for`): the Triton row and attention kernels (partial sums added in a fixed order, see
`backends/sample_sums.py`), cuBLAS GEMMs, torch's varlen flash attention and the eager references.
"""

from __future__ import annotations

import os

import torch

from ..registry import TORCH_NATIVE, priority_for

ATOMIC_BACKENDS = ("addmm_lowrank", "tilelang", "compile", "flex")
CUBLAS_WORKSPACE = ":4096:8"  # torch's documented setting for deterministic cuBLAS


def backends_for(arch: str) -> str:
    """OpSet's backend list for `arch` without the backends that add with atomics (eager stays last)."""
    names: list[str] = []
    for name in priority_for(arch):
        for n in TORCH_NATIVE if name == "torch" else (name,):
            if n not in ATOMIC_BACKENDS and n not in names:
                names.append(n)
    return ",".join(names)


def set_deterministic(on: bool) -> None:
    """Turn torch's deterministic algorithms and a fixed cuBLAS workspace on (before any GEMM) or off."""
    if on:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(on)
    torch.backends.cudnn.deterministic = on
    torch.backends.cudnn.benchmark = False if on else torch.backends.cudnn.benchmark

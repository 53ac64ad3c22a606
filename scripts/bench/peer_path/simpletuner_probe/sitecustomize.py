"""scripts/bench/peers.py's probe in SimpleTuner's processes (this folder is on their PYTHONPATH only).

When SimpleTuner's `helpers/training/iteration_tracker.py` loads (its trainer imports it before any model
or CUDA tensor exists), this:
- caps torch's allocator at PEER_CAP_GIB GiB of device 0 (torch's per-process fraction, what
  peer_path/capped_run.py sets for KohakuMoss 0.1.0 and this project's CARD_GB sets), in the training
  process that `accelerate launch` starts (a cap set in the launcher would not reach it);
- resets torch's peak counter when its training loop starts (`IterationTracker.mark_start`) and adds
  `probe/peak_allocated_gib` (torch.cuda.max_memory_allocated) to the per-step metrics it logs
  (`IterationTracker.iteration_metrics`, written to training_metrics.jsonl under `report_to`
  "simpletuner"): the training steps' peak, as 0.1.0's `vram_peak_alloc`, without its caching pass.
Reading the allocator's counters is a host-side read: nothing is synchronised or launched. Any other
process that loads this file (its CLI, accelerate's launcher) is left as it is; a sitecustomize this one
shadows (the interpreter's own) still runs.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import runpy
import sys

TARGET = "simpletuner.helpers.training.iteration_tracker"
PEAK_KEY = "probe/peak_allocated_gib"


def instrument(module) -> None:
    """The cap, then the peak counter's reset and read, on the loaded iteration_tracker module."""
    import torch

    cap = float(os.environ.get("PEER_CAP_GIB") or 0)
    if cap > 0 and torch.cuda.is_available():
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap * 2**30 / total), 0)
    tracker = module.IterationTracker
    mark_start, iteration_metrics = tracker.mark_start, tracker.iteration_metrics

    def start(self) -> None:
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        mark_start(self)

    def metrics(self) -> dict:
        out = iteration_metrics(self)
        if torch.cuda.is_available():
            out[PEAK_KEY] = torch.cuda.max_memory_allocated() / 2**30
        return out

    tracker.mark_start, tracker.iteration_metrics = start, metrics
    print(f"peers.py probe: cap {cap} GiB, step peaks as {PEAK_KEY}", file=sys.stderr, flush=True)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds TARGET through the rest of sys.meta_path, then instruments it once it has run."""

    def find_spec(self, name, path=None, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module) -> None:
            run(module)
            instrument(module)

        spec.loader.exec_module = exec_module
        return spec


def chain_shadowed() -> str | None:
    """Run the sitecustomize this file shadows (the interpreter's own, later on sys.path), as Python would
    have; returns its path."""
    here = os.path.dirname(os.path.abspath(__file__))
    for folder in sys.path:
        path = os.path.join(folder or ".", "sitecustomize.py")
        if os.path.abspath(folder or ".") != here and os.path.isfile(path):
            runpy.run_path(path, run_name="sitecustomize_shadowed")
            return path
    return None


sys.meta_path.insert(0, _Finder())
SHADOWED = chain_shadowed()

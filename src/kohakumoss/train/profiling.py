"""PROFILE_STEPS: torch.profiler over a range of training steps, written to the run folder.

Where a step's time goes in the run a user starts: `profile/trace.json.gz` (open it in Perfetto or
chrome://tracing), `profile/kernels.txt` (operators by device time, then by host time) and a summary
line in the log: wall time per step, the GPU's busy time per step (its kernels, copies and memsets) and
the difference, the time the GPU waited for the host. The profiled steps run slower than the others
(the profiler's own host cost) and their metrics say so (`profiled: true`).
"""

from __future__ import annotations

import gzip
import time
from pathlib import Path

import torch

from kohakumoss_common.log import get_logger

log = get_logger("kohakumoss.train.profiling")


def device_kernels(events) -> list[tuple[str, float, int]]:
    """(name, device ms summed, calls) of the profiler's device-side kernels, memsets and copies. Not the
    user annotations mirrored on the GPU timeline (`Optimizer.step#AdamW.step` spans the fused AdamW's
    kernels: counting both would count the optimizer twice)."""
    return [
        (e.key, e.self_device_time_total / 1e3, e.count)
        for e in events
        if e.device_type == torch.autograd.DeviceType.CUDA
        and e.self_device_time_total > 0
        and not getattr(e, "is_user_annotation", False)
    ]


class StepProfiler:
    """`before(step)` / `after(step)` around each training step (1-based numbers); a no-op outside the range."""

    def __init__(self, steps: list[int], out_dir: Path, device: torch.device):
        self.steps = tuple(steps) if steps else None  # PROFILE_STEPS [first, last], checked by the config
        self.out_dir, self.device = out_dir, device
        self._prof = None
        self._began = 0.0

    def active(self, step: int) -> bool:
        return self.steps is not None and self.steps[0] <= step <= self.steps[1]

    def before(self, step: int) -> None:
        if self.steps is None or step != self.steps[0]:
            return
        from torch.profiler import ProfilerActivity, profile

        cuda = self.device.type == "cuda"
        self._prof = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []))
        self._prof.__enter__()
        if cuda:
            torch.cuda.synchronize(self.device)
        self._began = time.perf_counter()

    def after(self, step: int) -> None:
        if self._prof is None or step < self.steps[1]:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        wall_ms = (time.perf_counter() - self._began) * 1e3
        prof, self._prof = self._prof, None
        prof.__exit__(None, None, None)
        self.write(prof, wall_ms)

    def close(self) -> None:
        """The run ended inside the range: stop the profiler without writing (a partial range)."""
        if self._prof is not None:
            self._prof.__exit__(None, None, None)
            self._prof = None

    def write(self, prof, wall_ms: float) -> None:
        folder = self.out_dir / "profile"
        folder.mkdir(parents=True, exist_ok=True)
        count = self.steps[1] - self.steps[0] + 1
        events = prof.key_averages()
        busy = sum(ms for _, ms, _ in device_kernels(events)) / count
        wall = wall_ms / count
        summary = (
            f"profiled steps {self.steps[0]}-{self.steps[1]}: {wall:.1f} ms per step, GPU busy {busy:.1f} ms, "
            f"GPU waiting for the host {max(wall - busy, 0.0):.1f} ms"
            if self.device.type == "cuda"
            else f"profiled steps {self.steps[0]}-{self.steps[1]}: {wall:.1f} ms per step"
        )
        parts = [summary, f"(times summed over the {count} steps)"]
        if self.device.type == "cuda":
            parts += ["by device time", events.table(sort_by="self_device_time_total", row_limit=40)]
        parts += ["by host time", events.table(sort_by="self_cpu_time_total", row_limit=40)]
        (folder / "kernels.txt").write_text("\n".join(parts) + "\n")
        log.info(f"{summary}; tables in {folder / 'kernels.txt'}, writing the trace")
        # last: the trace is the slow part (seconds for two eager 5B steps), so a kill keeps the tables
        started = time.perf_counter()
        raw = folder / "trace.json"
        prof.export_chrome_trace(str(raw))
        with open(raw, "rb") as f, gzip.open(folder / "trace.json.gz", "wb") as g:
            g.write(f.read())
        raw.unlink()
        log.info(f"trace of steps {self.steps[0]}-{self.steps[1]} in {folder / 'trace.json.gz'} "
                 f"({time.perf_counter() - started:.0f} s to write)")  # fmt: skip

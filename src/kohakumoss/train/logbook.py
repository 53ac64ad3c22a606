"""metrics.jsonl (one JSON line per logged step, appended and flushed), forwarded to the run's trackers
(TensorBoard, wandb: `tracking.py`), a loss plot PNG, and the progress lines of log.txt (and of a console
without a bar)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path

from PIL import Image

from kohakumoss_common.io import atomic_path, atomic_write_text, disk_full_as_error
from kohakumoss_common.log import FILE_ONLY, get_logger
from kohakumoss_common.progress import duration, eta

from .tracking import Trackers

log = get_logger(__name__)


class ProgressLines:
    """A progress line at the first step, every `every_s` seconds and at the last: step, percentage, loss,
    tokens/s (every token of the step's sequences, all ranks': image, caption and an edit step's reference
    tokens, never the text padding), elapsed time and ETA. With a bar on the terminal (`console=False`) the lines go to the run's
    log file only (`FILE_ONLY`), so log.txt has them either way; off a terminal they are the progress.
    Lines of our own, not tqdm's: a log file needs whole lines (kohakumoss_common.progress says why)."""

    def __init__(
        self,
        log,
        total: int,
        every_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        console: bool = True,
    ):
        self.log, self.total, self.every_s, self.clock, self.console = log, total, every_s, clock, console
        self.started = self.last = None
        self.first = 0

    def update(self, step: int, loss: float, tokens_per_s: float) -> None:
        now = self.clock()
        first = self.started is None
        if first:  # timed from this first step on: it carries the build, compile and capture
            self.started, self.first = now, step
        elif step < self.total and now - self.last < self.every_s:
            return
        self.last = now
        elapsed = now - self.started
        left = None if first else eta(step, self.total, elapsed, self.first)
        tail = f", ETA {duration(left)}" if left is not None and step < self.total else ""
        line = (
            f"step {step}/{self.total} ({100 * step / max(1, self.total):.0f}%)  loss {loss:.4f}  "
            f"{tokens_per_s:,.0f} tokens/s  {duration(elapsed)} elapsed{tail}"
        )
        if self.console:
            self.log.info(line)
        else:
            self.log.info(line, extra=FILE_ONLY)


class MetricsWriter:
    """Appends to runs/<name>/metrics.jsonl; on resume, lines past the resume step are dropped first, and
    lines that are not JSON (the last one, torn by a kill or a full disk mid-write) with a warning."""

    def __init__(self, path: str | Path, resume_step: int | None = None, trackers: Trackers | None = None):
        self.path = Path(path)
        self.trackers = trackers
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is not None and self.path.exists():
            kept = [line for line in self.read(warn=True) if line.get("step", 0) <= resume_step]
            atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        elif resume_step is None and self.path.exists():
            self.path.unlink()

    def write(self, record: dict) -> None:
        with disk_full_as_error(self.path), open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, default=float) + "\n")
        if self.trackers is not None:
            self.trackers.scalars(record)

    def image(self, tag: str, image: Image.Image, step: int) -> None:
        """A picture (a sample grid) for the trackers; metrics.jsonl keeps numbers only."""
        if self.trackers is not None:
            self.trackers.image(tag, image, step)

    def close(self) -> None:
        if self.trackers is not None:
            self.trackers.close()

    def read(self, warn: bool = False) -> list[dict]:
        """Every record; a line that is not a JSON record is skipped (`warn`: named in a warning)."""
        if not self.path.exists():
            return []
        records, torn = [], []
        for n, line in enumerate(self.path.read_text(errors="replace").splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            if isinstance(record, dict):
                records.append(record)
            else:
                torn.append(n)
        if torn and warn:
            log.warning(
                f"{self.path}: line(s) {torn} are not JSON records (cut by a kill or a full disk), dropped"
            )
        return records


def _finite_points(records: list[dict], key: str) -> tuple[list[float], list[float]]:
    pts = [
        (r["step"], r[key])
        for r in records
        if isinstance(r.get(key), (int, float)) and math.isfinite(r[key]) and "step" in r
    ]
    return [p[0] for p in pts], [p[1] for p in pts]


def loss_plot(records: list[dict], path: str | Path, key: str = "loss") -> None:
    """loss.png (written atomically): `loss_figure`'s picture."""
    fig = loss_figure(records, key)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:  # disk-full handling inside
        fig.savefig(tmp, format="png")


def loss_figure(records: list[dict], key: str = "loss"):
    """The loss per step and its running mean, the validation loss where it was measured, and the LR on a
    second axis; axes labelled and ticked by matplotlib (its Agg canvas: no display, no pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    steps, values = _finite_points(records, key)
    if steps:
        ax.plot(steps, values, color=(0.67, 0.75, 0.9), linewidth=0.8, label=key)
        window, acc, smooth = max(1, len(values) // 20), [], []
        for v in values:
            acc = [*acc[-window + 1 :], v] if window > 1 else [v]
            smooth.append(sum(acc) / len(acc))
        ax.plot(steps, smooth, color=(0.08, 0.24, 0.63), linewidth=1.8, label=f"{key} (mean of {window})")
    val_steps, val = _finite_points(records, "val_loss")
    if val_steps:
        ax.plot(
            val_steps, val, "o-", color="tab:orange", markersize=4, linewidth=1.2, label="validation loss"
        )
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.grid(True, alpha=0.3)
    lr_steps, lr = _finite_points(records, "lr")
    handles, labels = ax.get_legend_handles_labels()
    if lr_steps:
        lr_ax = ax.twinx()
        lr_ax.plot(lr_steps, lr, color="tab:green", linewidth=1.0, linestyle="--", label="LR")
        lr_ax.set_ylabel("LR")
        lr_ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
        more = lr_ax.get_legend_handles_labels()
        handles, labels = handles + more[0], labels + more[1]
    if handles:
        ax.legend(handles, labels, loc="upper right", fontsize="small")
    return fig

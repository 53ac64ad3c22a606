"""metrics.jsonl (one JSON line per logged step, appended and flushed), forwarded to the run's trackers
(TensorBoard, wandb: `tracking.py`), a loss plot PNG, and the progress lines of log.txt (and of a console
without a bar)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path

from PIL import Image, ImageDraw

from kohakumoss_common.io import atomic_write_text, disk_full_as_error, save_image
from kohakumoss_common.log import FILE_ONLY, get_logger
from kohakumoss_common.progress import duration, eta

from .tracking import Trackers

log = get_logger(__name__)


class ProgressLines:
    """A progress line at the first step, every `every_s` seconds and at the last: step, percentage, loss,
    tokens/s, elapsed time and ETA. With a bar on the terminal (`console=False`) the lines go to the run's
    log file only (`FILE_ONLY`), so log.txt has them either way; off a terminal they are the progress."""

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


def loss_plot(
    records: list[dict], path: str | Path, key: str = "loss", width: int = 640, height: int = 320
) -> None:
    """A plain loss curve (raw points and a running mean) drawn with Pillow."""
    pts = [
        (r["step"], r[key])
        for r in records
        if key in r and isinstance(r[key], (int, float)) and math.isfinite(r[key])
    ]
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    pad = 40
    draw.rectangle([pad, 10, width - 10, height - pad], outline="black")
    if len(pts) >= 2:
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
        span_x, span_y = max(x1 - x0, 1), max(y1 - y0, 1e-12)

        def at(x: float, y: float) -> tuple[float, float]:
            return pad + (x - x0) / span_x * (width - pad - 10), height - pad - (y - y0) / span_y * (
                height - pad - 10
            )

        draw.line([at(x, y) for x, y in pts], fill=(170, 190, 230), width=1)
        window, smooth, acc = max(1, len(pts) // 20), [], []
        for x, y in pts:
            acc.append(y)
            acc = acc[-window:]
            smooth.append(at(x, sum(acc) / len(acc)))
        draw.line(smooth, fill=(20, 60, 160), width=2)
        draw.text((pad, height - pad + 5), f"step {x0}", fill="black")
        draw.text((width - 90, height - pad + 5), f"step {x1}", fill="black")
        draw.text((4, 12), f"{y1:.3g}", fill="black")
        draw.text((4, height - pad - 12), f"{y0:.3g}", fill="black")
    draw.text((pad + 5, 14), key, fill="black")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    save_image(img, path)

"""Progress wherever a user waits: a tqdm bar in a terminal; elsewhere (a pipe, a job log) a log line
with the count, percentage, elapsed time and ETA at the start, every `every_s` seconds and at the end;
nothing at all when there is nothing to do.

The bar is tqdm's. The lines off a terminal are not: there tqdm either draws nothing (`disable=None`)
or writes its `\r` redraws into one ever-growing line (seen piping a 3-step bar through `od -c`), and a
log file or job log needs whole lines at an interval."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from tqdm import tqdm

from .log import get_logger

EVERY_S = 10.0  # seconds between two progress lines off a terminal
log = get_logger("kohakumoss.progress")


def on_terminal(stream: Any = None) -> bool:
    """Whether `stream` (stderr, where bars and log lines go) is an interactive terminal."""
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def duration(seconds: float) -> str:
    """`42 s`, `3m05s`, `1h02m`: short enough for a progress line."""
    s = int(round(max(0.0, seconds)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def eta(done: int, total: int, elapsed: float, start: int = 0) -> float | None:
    """Seconds left at the rate so far (`start`: where this session began), None before any progress."""
    if done <= start or elapsed <= 0:
        return None
    return (total - done) * elapsed / (done - start)


def progress_line(desc: str, done: int, total: int, unit: str, elapsed: float, start: int = 0) -> str:
    """`desc: 30/120 steps (25%), 1m10s elapsed, ETA 3m30s`."""
    left = eta(done, total, elapsed, start)
    pct = 100.0 * done / total if total else 100.0
    tail = f", ETA {duration(left)}" if left is not None and done < total else ""
    return f"{desc}: {done}/{total} {unit} ({pct:.0f}%), {duration(elapsed)} elapsed{tail}"


class Progress:
    """`with Progress(total, "latents", "img") as p: ... p.update(n)`: a bar in a terminal, else log lines
    (`progress_line`); nothing when `total` is 0. `logger` receives the lines (the project's by default);
    `leave=False` clears the finished bar (one drawn under the training's own)."""

    def __init__(
        self,
        total: int,
        desc: str,
        unit: str = "it",
        initial: int = 0,
        every_s: float = EVERY_S,
        logger: logging.Logger | None = None,
        terminal: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        leave: bool = True,
    ):
        self.total, self.desc, self.unit, self.done, self.start = int(total), desc, unit, initial, initial
        self.every_s, self.log, self.clock = every_s, logger or log, clock
        self.started = self.last = clock()
        self.closed = self.total <= initial
        terminal = on_terminal() if terminal is None else terminal
        self.bar = None
        if not self.closed and terminal:
            self.bar = tqdm(
                total=self.total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True, leave=leave
            )
        elif not self.closed:
            self.log.info(progress_line(desc, initial, self.total, unit, 0.0, initial))

    def update(self, n: int = 1) -> None:
        if self.closed:
            return
        self.done = min(self.total, self.done + n)
        if self.bar is not None:
            self.bar.update(n)
        else:
            now = self.clock()
            if self.done >= self.total or now - self.last >= self.every_s:
                self.last = now
                self.log.info(
                    progress_line(self.desc, self.done, self.total, self.unit, now - self.started, self.start)
                )
        if self.done >= self.total:
            self.close()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        self.closed = True

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class StepProgress:
    """A sampler's `progress(i, n)` callback as a Progress per sampling run: one that starts at step 1
    opens a new one (requests with their own step counts sample in several runs)."""

    def __init__(self, desc: str, unit: str = "step", **kwargs: Any):
        self.desc, self.unit, self.kwargs = desc, unit, kwargs
        self.current: Progress | None = None
        self.runs = 0

    def __call__(self, i: int, n: int) -> None:
        if self.current is None or self.current.closed or i == 1:
            if self.current is not None:
                self.current.close()
            self.runs += 1
            desc = self.desc if self.runs == 1 else f"{self.desc} ({self.runs})"
            self.current = Progress(n, desc, self.unit, initial=i - 1, **self.kwargs)
        self.current.update(1)

    def close(self) -> None:
        if self.current is not None:
            self.current.close()

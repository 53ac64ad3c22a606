"""Experiment trackers beside metrics.jsonl: TensorBoard event files in the run folder, wandb when asked.

TensorBoard events are written with tensorboardX (the event format TensorBoard reads, without the
TensorBoard server's own dependencies); wandb is imported only when LOGGERS names it.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from kohakumoss.config.rules import loggers_problem
from kohakumoss_common.errors import ConfigError

TENSORBOARD_DIR = "tensorboard"  # under the run folder


def _numbers(record: dict) -> dict[str, float]:
    out = {}
    for key, v in record.items():
        if key != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out[key] = float(v)
    return out


def _tag(key: str) -> str:
    return "val/loss" if key == "val_loss" else f"train/{key}"


class Trackers:
    """The trackers LOGGERS names, opened on one run folder; `scalars` per logged step, `image` per grid."""

    def __init__(
        self,
        names: list[str],
        run_dir: str | Path,
        config: dict[str, Any] | None = None,
        resume_step: int | None = None,
    ):
        problem = loggers_problem(list(names))
        if problem:
            raise ConfigError("LOGGERS", problem)
        self.run_dir = Path(run_dir)
        self.tensorboard = None
        self.wandb = None
        if "tensorboard" in names:
            from tensorboardX import SummaryWriter

            # purge_step: TensorBoard hides the events a resumed run writes again
            purge = None if resume_step is None else resume_step + 1
            # the event file is named by the second it opens: a resume within that second would overwrite
            # the earlier file's events, so the name carries the nanoseconds too (names still sort by time)
            self.tensorboard = SummaryWriter(
                str(self.run_dir / TENSORBOARD_DIR),
                purge_step=purge,
                filename_suffix=f".{time.time_ns() % 10**9:09d}",
            )
        if "wandb" in names:
            try:
                import wandb
            except ImportError:
                raise ConfigError("LOGGERS", loggers_problem(["wandb"]) or "wandb failed to import") from None
            self.wandb = wandb.init(
                name=self.run_dir.name,
                dir=str(self.run_dir),
                config={k: v for k, v in (config or {}).items() if k.isupper()},
                resume="allow",
            )

    def scalars(self, record: dict) -> None:
        """Every finite number of a metrics line (`step` is the x axis)."""
        step, values = int(record["step"]), _numbers(record)
        if self.tensorboard is not None:
            for key, v in values.items():
                self.tensorboard.add_scalar(_tag(key), v, step)
            self.tensorboard.flush()
        if self.wandb is not None:
            self.wandb.log({_tag(key): v for key, v in values.items()}, step=step)

    def image(self, tag: str, image: Image.Image, step: int) -> None:
        if self.tensorboard is not None:
            self.tensorboard.add_image(tag, np.asarray(image.convert("RGB")), step, dataformats="HWC")
            self.tensorboard.flush()
        if self.wandb is not None:
            import wandb

            self.wandb.log({tag: wandb.Image(image)}, step=step)

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None

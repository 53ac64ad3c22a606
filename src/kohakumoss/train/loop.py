"""`train(knobs)`: knobs in, runs/<RUN_NAME>/ out. The run folder and its log.txt around a `Trainer`.

The knobs are validated once here and become the typed `TrainConfig` the Trainer (train/trainer.py) is
built from; this entry checks the run folder, opens the log file, and writes why a run stopped into it. The trainer's pieces the benchmark builds its step from
(scripts/bench/train_step.py) are importable from here too.
"""

from __future__ import annotations

import faulthandler
import functools
import logging
import signal
import sys
from collections.abc import Mapping
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from kohakumoss.config.train import TRAIN_SCHEMA, TrainConfig
from kohakumoss.distributed.launch import run as run_on_devices
from kohakumoss.distributed.rank_run import RankRun, rank_overrides
from kohakumoss.memory.allocator import (
    allocator_for_references,
    allocator_setting_line,
    dataset_has_references,
)
from kohakumoss_common.errors import ConfigError, KohakuMossError
from kohakumoss_common.knobs import check_folder_knobs
from kohakumoss_common.lock import FolderLock
from kohakumoss_common.log import add_file_log, get_logger
from kohakumoss_common.paths import folder_problem

from .resume import check_run_folder
from .trainer import (
    NonFiniteLoss,
    Trainable,
    Trainer,
    build_runner,
    build_trainable,
    step_loss_fn,
    timestep_config,
)

__all__ = [
    "NonFiniteLoss",
    "Trainable",
    "Trainer",
    "build_runner",
    "build_trainable",
    "dump_stacks_on_signal",
    "step_loss_fn",
    "timestep_config",
    "train",
    "train_on_devices",
]

log = get_logger(__name__)


def dump_stacks_on_signal() -> None:
    """`kill -USR1 <pid>` prints every thread's stack to the console: where a silent run is spending its time."""
    if not hasattr(signal, "SIGUSR1"):  # not on Windows
        return
    stream = sys.stderr
    try:
        stream.fileno()
    except (AttributeError, OSError, ValueError):  # stderr captured (pytest, a notebook): the process's own
        stream = sys.__stderr__
    if stream is not None:
        faulthandler.register(signal.SIGUSR1, file=stream, all_threads=True, chain=False)


def train(knobs: Mapping[str, Any]) -> Path:
    """Run training as the knobs say (checked against TRAIN_SCHEMA, defaults filled); returns the run folder."""
    cfg = TrainConfig.from_knobs(TRAIN_SCHEMA.validate(knobs, source="train knobs"))
    run_dir = Path(cfg.run.runs_dir) / cfg.run.run_name
    rr = RankRun(cfg)  # one process, or this rank of a DISTRIBUTED run: rank 0 owns the run folder
    dump_stacks_on_signal()
    # RUNS_DIR, CACHE_DIR: a file there is named before any work
    check_folder_knobs({"RUNS_DIR": cfg.run.runs_dir, "CACHE_DIR": cfg.data.cache_dir})
    if problem := folder_problem(run_dir):
        raise ConfigError("RUN_NAME", problem)
    if rr.is_main:
        check_run_folder(cfg.run, run_dir)
    # rank 0 holds the run folder for the run: a second trainer on this RUN_NAME is refused, naming the pid
    with FolderLock(run_dir) if rr.is_main else nullcontext():
        run_dir.mkdir(parents=True, exist_ok=True)
        handler = add_file_log(rr.own(run_dir) / "log.txt")
        if line := allocator_setting_line(dataset_has_references(cfg.data.dataset)):
            log.info(
                line
            )  # an edit run's allocator setting (train_on_devices set it, or the user) in log.txt
        try:
            return Trainer(cfg, run_dir, rr).train()
        except KohakuMossError as e:  # why the run stopped, in log.txt (the console gets it from the caller)
            handler.handle(log.makeRecord(log.name, logging.ERROR, __file__, 0, f"stopped: {e}", None, None))
            raise
        except Exception as e:  # a bug or a library's error: its traceback goes to the console
            why = f"stopped by {type(e).__name__}: {e}"
            handler.handle(log.makeRecord(log.name, logging.ERROR, __file__, 0, why, None, None))
            raise
        finally:
            logging.getLogger("kohakumoss").removeHandler(handler)
            handler.close()


def train_on_devices(knobs: Mapping[str, Any]) -> Any:
    """The train script's entry: train(knobs) in this process, or on every rank DISTRIBUTED and DEVICES ask
    for (distributed/launch.run, from the run's typed DistributedConfig and DEVICE), each rank's knobs with
    its overrides (`rank_overrides`: graphs off under FSDP2 and the pipelines, a threaded run's first
    device) and its own DEVICE; returns rank 0's run folder."""
    knobs = dict(knobs)
    knobs.update(rank_overrides(TrainConfig.from_knobs(knobs)))
    cfg = TrainConfig.from_knobs(knobs)
    # before any CUDA work here or in the workers (they inherit it): an edit step fragments the allocator
    allocator_for_references(dataset_has_references(cfg.data.dataset))
    return run_on_devices(cfg.parallel, cfg.device.device, functools.partial(train_on_device, knobs))


def train_on_device(knobs: Mapping[str, Any], device: str) -> Path:
    """train(knobs) on `device` (a worker's own, or DEVICE itself in one process); module-level, so a
    spawned worker unpickles it."""
    return train({**knobs, "DEVICE": device})

"""What one loader worker process does for one item: a latent cache hit, or the planned pixels."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from kohakumoss_common.errors import DataError

from .cache import TensorCache
from .masks import planned_mask
from .plan import PlanKnobs, PlannedItem
from .sources.base import Source
from .transform import planned_pixels


@dataclass(frozen=True)
class ItemTask:
    locator: Any
    item: PlannedItem
    latent_key: str | None  # None: no latent cache to look in
    patch_px: int = PlanKnobs.patch_px  # pixels per image token side (the mask's grid)
    reference: bool = False  # a reference image (`plan.reference_item`): read by Source.read_reference


@dataclass
class ItemResult:
    latent: torch.Tensor | None = None
    pixels: np.ndarray | None = None  # uint8 [H, W, 3]
    mask: np.ndarray | None = None  # float32 [H / 16, W / 16] when the item's dataset has a mask


_state: dict[str, Any] = {}


_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM") if hasattr(signal, n))


def _watch_parent(parent: int) -> None:
    """Exit once `parent` is gone (platforms without a parent-death signal): polled once a second."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


def die_with_parent(parent: int) -> None:
    """This process ends when `parent` ends, even by kill -9 (which runs no cleanup in the parent)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
            if os.getppid() != parent:  # the parent died before the signal was armed
                os._exit(1)
            return
    threading.Thread(target=_watch_parent, args=(parent,), name="parent-watch", daemon=True).start()


def init_worker(source: Source, latent_cache: TensorCache | None, parent: int | None = None) -> None:
    """Process initializer: own source handles and cache index; dies with the trainer; Ctrl-C is the parent's."""
    if parent is not None:
        die_with_parent(parent)
    # a terminal's Ctrl-C (or a scheduler's SIGTERM) reaches the whole process group: the parent stops
    # the pool, so workers ignore it rather than each printing a traceback or dying under a saving parent
    for signum in _STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):  # the loader's feeder thread forks workers with them blocked
        signal.pthread_sigmask(signal.SIG_UNBLOCK, set(_STOP_SIGNALS))
    _state["source"] = source
    _state["cache"] = latent_cache


def run_task(task: ItemTask, source: Source | None = None, cache: TensorCache | None = None) -> ItemResult:
    source = source or _state["source"]
    cache = cache if cache is not None else _state.get("cache")
    result = ItemResult()
    if cache is not None and task.latent_key is not None:
        result.latent = cache.get(task.latent_key)
    try:
        read = source.read_reference if task.reference else source.read
        data = read(task.locator) if result.latent is None or task.item.mask == "alpha" else None
        if result.latent is None:
            result.pixels = planned_pixels(data, task.item)
        if task.item.mask:
            result.mask = planned_mask(data, task.item, task.patch_px)
    except DataError:
        raise
    except Exception as e:  # the file changed since the scan; name it
        what = f"{task.item.key} reference {task.locator}" if task.reference else task.item.key
        raise DataError(f"{what}: cannot read or decode since the scan ({type(e).__name__}: {e})") from e
    return result

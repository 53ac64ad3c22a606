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
from .plan import PlannedItem
from .sources.base import Source
from .transform import planned_pixels


@dataclass(frozen=True)
class ItemTask:
    locator: Any
    item: PlannedItem
    latent_key: str | None  # None: no latent cache to look in


@dataclass
class ItemResult:
    latent: torch.Tensor | None = None
    pixels: np.ndarray | None = None  # uint8 [H, W, 3]


_state: dict[str, Any] = {}


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


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
    # a terminal's Ctrl-C reaches the whole process group: the parent stops the pool, so workers
    # ignore it rather than each printing a KeyboardInterrupt traceback
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _state["source"] = source
    _state["cache"] = latent_cache


def run_task(task: ItemTask, source: Source | None = None, cache: TensorCache | None = None) -> ItemResult:
    source = source or _state["source"]
    cache = cache if cache is not None else _state.get("cache")
    if cache is not None and task.latent_key is not None:
        hit = cache.get(task.latent_key)
        if hit is not None:
            return ItemResult(latent=hit)
    try:
        return ItemResult(pixels=planned_pixels(source.read(task.locator), task.item))
    except Exception as e:  # the file changed since the scan; name it
        raise DataError(
            f"{task.item.key}: cannot read or decode since the scan ({type(e).__name__}: {e})"
        ) from e

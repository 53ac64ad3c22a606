"""What one loader worker process does for one item: a latent cache hit, or the planned pixels."""

from __future__ import annotations

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


def init_worker(source: Source, latent_cache: TensorCache | None) -> None:
    """Process initializer: each worker keeps its own source handles and cache index."""
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

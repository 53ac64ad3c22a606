"""Sharded checkpoints through torch.distributed.checkpoint (DCP): each rank writes its shards, the
folder appears under its final name only when every rank has written (atomic), and a checkpoint loads
at another world size (DCP reshards FSDP2's DTensors; DDP's replicated tensors load whole).

The state is `get_state_dict`'s: parameter names without any wrapper prefix, frozen weights left out
(`ignore_frozen_params`: an adapter run saves only the adapter), optimizer states keyed by those names.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.optim import Optimizer

from kohakumoss_common.errors import CheckpointError

from .collectives import barrier
from .world import World

TMP_SUFFIX = ".dcp-tmp"
OPTIONS = StateDictOptions(ignore_frozen_params=True)


def _state(model: nn.Module, optimizers: Iterable[Optimizer]) -> dict[str, Any]:
    model_state, optim_state = get_state_dict(model, list(optimizers), options=OPTIONS)
    return {"model": model_state, "optim": optim_state}


def save_sharded(folder: str | Path, model: nn.Module, optimizers: Iterable[Optimizer], world: World) -> Path:
    """Every rank writes its shards into `folder`.dcp-tmp; rank 0 renames it to `folder` after all did."""
    folder = Path(folder)
    tmp = folder.with_name(folder.name + TMP_SUFFIX)
    if world.is_main:
        shutil.rmtree(tmp, ignore_errors=True)  # left by an interrupted save
        tmp.parent.mkdir(parents=True, exist_ok=True)
    barrier(world)
    dcp.save(_state(model, optimizers), checkpoint_id=tmp)
    barrier(world)  # every rank's shards are on disk before the folder takes its name
    if world.is_main:
        if folder.exists():
            raise CheckpointError(folder, "already exists; a checkpoint is never written over")
        tmp.rename(folder)
    barrier(world)
    return folder


def load_sharded(folder: str | Path, model: nn.Module, optimizers: Iterable[Optimizer]) -> None:
    """Load `folder` into the (wrapped) model and optimizers, whatever world size wrote it."""
    folder = Path(folder)
    if not (folder / ".metadata").is_file():
        raise CheckpointError(folder, "not a sharded checkpoint (no .metadata: unfinished or another format)")
    optimizers = list(optimizers)
    state = _state(model, optimizers)
    dcp.load(state, checkpoint_id=folder)
    set_state_dict(
        model, optimizers, model_state_dict=state["model"], optim_state_dict=state["optim"], options=OPTIONS
    )

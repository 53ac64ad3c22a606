"""Sharded checkpoints through torch.distributed.checkpoint (DCP): each rank writes its shards, the
folder appears under its final name only when every rank has written (atomic), and a checkpoint loads
at another world size (DCP reshards FSDP2's DTensors; DDP's replicated tensors load whole).

`save_sharded` / `load_sharded` own a folder; the trainer's checkpoints (kohakumoss/checkpoint/write.py, folder
`step_X/sharded/`) take `sharded_state` and `write_shards` into their own temporary folder instead.

The state is `get_state_dict`'s: parameter names without any wrapper prefix, frozen weights left out
(`ignore_frozen_params`: an adapter run saves only the adapter), optimizer states keyed by those names.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.optim import Optimizer

from kohakumoss_common.errors import CheckpointError

from .collectives import barrier
from .world import World

TMP_SUFFIX = ".dcp-tmp"
OPTIONS = StateDictOptions(ignore_frozen_params=True)
# buffers are left out of the saved state (they follow from the config, as in the one-process format),
# so loading is not strict about them; a parameter missing from the checkpoint still fails in dcp.load
LOAD_OPTIONS = StateDictOptions(ignore_frozen_params=True, strict=False)


def sharded_state(model: nn.Module, optimizers: Iterable[Optimizer]) -> dict[str, Any]:
    """{'model', 'optim'}: this rank's shards (DTensors) or whole tensors of the trainable parameters
    (no buffers: the one-process checkpoint's `trainable.safetensors` keys) and their optimizer states."""
    model_state, optim_state = get_state_dict(model, list(optimizers), options=OPTIONS)
    params = {name for name, _ in model.named_parameters()}
    return {"model": {k: v for k, v in model_state.items() if k in params}, "optim": optim_state}


def write_shards(tmp: Path | None, state: dict[str, Any], world: World) -> Path:
    """Every rank writes `state` into rank 0's temporary folder `tmp` (None on the others: it is sent
    to them), subfolder `sharded/`; returns it once every rank has written."""
    box = [str(tmp) if world.is_main else None]
    if world.size > 1:
        dist.broadcast_object_list(box, src=0)
    folder = Path(box[0]) / "sharded"
    dcp.save(state, checkpoint_id=folder)
    barrier(world)  # every rank's shards are on disk before rank 0 goes on (and renames the folder)
    return folder


def save_sharded(folder: str | Path, model: nn.Module, optimizers: Iterable[Optimizer], world: World) -> Path:
    """Every rank writes its shards into `folder`.dcp-tmp; rank 0 renames it to `folder` after all did."""
    folder = Path(folder)
    tmp = folder.with_name(folder.name + TMP_SUFFIX)
    if world.is_main:
        shutil.rmtree(tmp, ignore_errors=True)  # left by an interrupted save
        tmp.parent.mkdir(parents=True, exist_ok=True)
    barrier(world)
    dcp.save(sharded_state(model, optimizers), checkpoint_id=tmp)
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
    state = sharded_state(model, optimizers)
    dcp.load(state, checkpoint_id=folder)
    set_state_dict(
        model,
        optimizers,
        model_state_dict=state["model"],
        optim_state_dict=state["optim"],
        options=LOAD_OPTIONS,
    )

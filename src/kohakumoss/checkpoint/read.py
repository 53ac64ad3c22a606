"""Reading a checkpoint folder `step_XXXXXXXX/` (write.py writes them; its docstring lists
the files): every part loaded on the CPU, a part that cannot be read a CheckpointError naming its file."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kohakumoss_common.errors import CheckpointError
from kohakumoss_common.io import load_tensors

from .rng import load_rng

FORMAT = 1


@dataclass
class Checkpoint:
    path: Path
    step: int
    trainable: dict[str, torch.Tensor]
    optimizer: dict | None
    ema: dict | None
    rng: dict
    data_position: dict
    config: dict
    metadata: dict = field(default_factory=dict)


def load_checkpoint(path: str | Path, sharded_weights: bool = True) -> Checkpoint:
    """Read every part of a complete checkpoint folder (tensors on the CPU); a part that cannot be read
    is a CheckpointError naming its file. An FSDP2 run's checkpoint keeps its trainable weights as DCP
    shards under `sharded/`: read whole here, or left out with `sharded_weights=False` (the trainer
    loads them into its own, possibly sharded, model)."""
    path = Path(path)
    meta_file = path / "meta.json"
    if not meta_file.is_file():
        raise CheckpointError(path, "incomplete checkpoint (no meta.json)")
    meta = read_part(meta_file, lambda f: json.loads(f.read_text()))
    if meta.get("format") != FORMAT:
        raise CheckpointError(path, f"checkpoint format {meta.get('format')} is not {FORMAT}")
    optimizer = None
    if meta.get("has_optimizer"):
        optimizer = read_part(
            path / "optimizer.pt", lambda f: torch.load(f, map_location="cpu", weights_only=True)
        )
    ema = None
    if meta.get("ema") is not None:
        ema = {**meta["ema"], "shadow": read_part(path / "ema.safetensors", load_tensors)}
    return Checkpoint(
        path=path,
        step=int(meta["step"]),
        trainable=_trainable(path, bool(meta.get("sharded")), sharded_weights),
        optimizer=optimizer,
        ema=ema,
        rng=read_part(path / "rng.json", lambda f: load_rng(f.parent)),
        data_position=read_part(path / "data.json", lambda f: json.loads(f.read_text())),
        config=read_part(path / "config.json", lambda f: json.loads(f.read_text())),
        metadata=meta,
    )


def _trainable(path: Path, sharded: bool, sharded_weights: bool) -> dict[str, torch.Tensor]:
    if not sharded:
        return read_part(path / "trainable.safetensors", load_tensors)
    return (
        read_part(path / "sharded" / ".metadata", lambda f: read_sharded_weights(f.parent))
        if sharded_weights
        else {}
    )


def read_sharded_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The whole trainable weights of a DCP checkpoint folder (`sharded/`), in this process."""
    import torch.distributed.checkpoint as dcp

    metadata = dcp.FileSystemReader(folder).read_metadata()
    state = {
        key: torch.empty(tuple(m.size), dtype=m.properties.dtype)
        for key, m in metadata.state_dict_metadata.items()
        if key.startswith("model.") and hasattr(m, "size")
    }
    dcp.load(state, checkpoint_id=folder, no_dist=True)
    return {key.removeprefix("model."): t for key, t in state.items()}


def read_part(file: Path, reader: Callable[[Path], Any]) -> Any:
    """`reader(file)`, any failure a CheckpointError naming the file."""
    try:
        return reader(file)
    except CheckpointError:
        raise
    except Exception as e:  # torch, safetensors and json each raise their own types for a cut file
        first = (str(e).splitlines() or [""])[0][:200]
        raise CheckpointError(file, f"unreadable ({type(e).__name__}: {first})") from e

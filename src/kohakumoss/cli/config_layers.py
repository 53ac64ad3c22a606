"""Preset layers under configs/moss/ and how a config composes them.

A layer is a plain kogine config file: module-level UPPER_CASE knobs and, for a GPU layer, a
`_metadata` dict (not a knob: kogine never injects it) naming the card size and the planned memory
profile. A user config lists its layers with kogine's `use_config(...)` in the documented order
gpu -> algo -> data, then sets its own knobs: later layers override earlier ones and the file's own
knobs override every layer (kogine's `use_config` rule). `compose` is the same rule for code.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kohakumoss_common.errors import ConfigError

LAYER_KINDS = ("gpu", "algo", "data", "recipes")
ORDER = ("gpu", "algo", "data")  # the user's own knobs come last
GPU_SIZES = (6, 8, 12, 16, 24, 32, 48, 80)
RESOLUTIONS = ("1mp", "512")

# named cards -> memory in GB (what `--gpu NAME` accepts without a GPU present)
CARDS: dict[str, int] = {
    "rtx2060": 6,
    "rtx3050": 8,
    "rtx3060": 12,
    "rtx3070": 8,
    "rtx3080": 10,
    "rtx3080ti": 12,
    "rtx3090": 24,
    "rtx4060": 8,
    "rtx4060ti": 16,
    "rtx4070": 12,
    "rtx4070ti": 12,
    "rtx4080": 16,
    "rtx4090": 24,
    "rtx5060ti": 16,
    "rtx5070": 12,
    "rtx5070ti": 16,
    "rtx5080": 16,
    "rtx5090": 32,
    "rtxa4000": 16,
    "rtxa5000": 24,
    "rtxa6000": 48,
    "l4": 24,
    "l40s": 48,
    "a10": 24,
    "a100": 80,
    "a100-40g": 40,
    "h100": 80,
    "h200": 141,
    "t4": 16,
    "v100": 16,
    "arc-a770": 16,
    "arc-b580": 12,
}


def repo_root() -> Path:
    """The checkout holding configs/moss (this file sits in src/kohakumoss/cli/)."""
    return Path(__file__).resolve().parents[3]


def layers_dir() -> Path:
    """$KOHAKUMOSS_LAYERS, else the checkout's configs/moss, else ./configs/moss."""
    if env := os.environ.get("KOHAKUMOSS_LAYERS"):
        return Path(env)
    here = repo_root() / "configs" / "moss"
    return here if here.is_dir() else Path.cwd() / "configs" / "moss"


def layer_path(kind: str, name: str) -> Path:
    """configs/moss/<kind>/<name>.py, or a ConfigError listing what exists."""
    if kind not in LAYER_KINDS:
        raise ConfigError("layer", f"unknown layer kind {kind!r}; one of {list(LAYER_KINDS)}")
    path = layers_dir() / kind / f"{name.removesuffix('.py')}.py"
    if not path.is_file():
        raise ConfigError(kind, f"no layer {name!r} in {path.parent}; known: {list_layers(kind)}")
    return path


def list_layers(kind: str) -> list[str]:
    folder = layers_dir() / kind
    return sorted(p.stem for p in folder.glob("*.py") if not p.name.startswith("_"))


def gpu_layer_name(gb: float) -> str:
    """The largest GPU layer that fits `gb` of card memory (the smallest layer below 6 GB)."""
    fitting = [s for s in GPU_SIZES if s <= gb + 0.5]  # a "24 GB" card reports 23.6 GiB or so
    return f"vram_{(fitting[-1] if fitting else GPU_SIZES[0])}g"


def source_kinds() -> tuple[str, ...]:
    """The dataset kinds a config may name: the data package's SOURCE_KINDS (each has a data layer per
    resolution)."""
    from kohakumoss_data.sources import SOURCE_KINDS  # deferred: the data package imports torch

    return tuple(SOURCE_KINDS)


def data_layer_name(source: str, resolution: str = "1mp") -> str:
    if source not in source_kinds():
        raise ConfigError("source", f"unknown source {source!r}; one of {list(source_kinds())}")
    if resolution not in RESOLUTIONS:
        raise ConfigError("resolution", f"unknown resolution {resolution!r}; one of {list(RESOLUTIONS)}")
    return f"{source}_{resolution}"


def load_file(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(knobs, metadata) of one config file, resolved the way `kogine run --config` resolves it."""
    from kohakuengine.config import ConfigGenerator, load_config_file

    cfg = load_config_file(Path(path))
    if isinstance(cfg, ConfigGenerator):
        raise ConfigError(str(path), "is a sweep/generator config; check one config at a time")
    return dict(cfg.globals_dict), dict(cfg.metadata)


def compose(paths: Iterable[str | Path], overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Knobs of `paths` applied in order (later wins), then `overrides`: the composition rule."""
    knobs: dict[str, Any] = {}
    for p in paths:
        knobs.update(load_file(p)[0])
    knobs.update(overrides or {})
    return knobs


def use_line(layer: Path, config_dir: Path) -> str:
    """`use_config("...")` for a layer: relative when the config sits in the same checkout, else absolute."""
    layer, config_dir = layer.resolve(), config_dir.resolve()
    root = layers_dir().resolve().parent.parent
    ref = str(layer)
    if layer.parent == config_dir or (config_dir.is_relative_to(root) and layer.is_relative_to(root)):
        ref = os.path.relpath(layer, config_dir)
    return f'use_config("{Path(ref).as_posix()}")'


def data_config(sources: Iterable[str | Path], own: dict[str, Any]) -> Any:
    """The kogine Config of a data-scripts config: plan knobs from `sources` (a training config or
    layers, composed in order), the encoders' arguments the training run builds its own with
    (`train/cache_identity.py`: same text encoder settings, so the same cache keys), then `own`."""
    from kohakuengine import Config

    from kohakumoss.config.data_scripts import SHARED
    from kohakumoss.config.train import TRAIN_SCHEMA, TrainConfig
    from kohakumoss.train.cache_identity import STAND_INS, text_kwargs
    from kohakumoss.train.components import resolve_device

    sources = list(sources)
    knobs = {**TRAIN_SCHEMA.defaults(), **compose(sources)}  # the training run's values, defaults included
    out = {k: knobs[k] for k in SHARED}
    cfg = TrainConfig.from_knobs(knobs)
    out["MICRO_STEPS"] = int(cfg.optim.steps) * int(cfg.optim.grad_accum)  # the epochs the run plans
    if cfg.encoders.vae not in STAND_INS:
        out["VAE_KWARGS"] = {"path": cfg.encoders.vae, "device": str(resolve_device(cfg.device.device))}
    if (text := text_kwargs(cfg)) is not None:
        out["TEXT_KWARGS"] = text
    out.update(own)
    metadata = {"kind": "data", "sources": [str(Path(s).resolve()) for s in sources]}
    return Config(globals_dict=out, metadata=metadata)

"""What decides whose caches a run reads: one computation for the trainer, the data scripts and `check`.

A cache entry's key is `kohakumoss_data.cache_keys` of its encoder's identity and of the planned item;
an encoder's identity is a function of the files it reads and of its settings. So the text and latent
caches that scripts/data/cache_*.py fill are the ones training reads exactly when both build their
encoders from the same settings and plan the same items. `text_settings` is those settings for a
training config (the trainer builds its encoder with the same `text_encoder_config` call);
`data_text_settings` is what cache_text builds from a data config; `cache_settings` is everything that
enters the keys, for either kind of config, and `cache_mismatches` names each difference by its knob.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from kohakumoss.config.train import TRAIN_SCHEMA, TrainConfig
from kohakumoss.encoders import TextEncoderConfig
from kohakumoss_common.errors import ConfigError

from .components import dataset_has_references, resolve_device, text_encoder_config

STAND_INS = ("", "synthetic", "random")  # encoders built from no file: nothing for a data script to cache
# TextEncoderConfig fields an encoder's identity depends on (`device` and `prune_unused_layers` do not)
TEXT_IDENTITY_FIELDS = (
    "path",
    "tokenizer_path",
    "layers",
    "combine",
    "template",
    "max_length",
    "dtype",
    "preset",
    "layout",
    "model_overrides",
    "quant",
    "reference_prompt",
    "reference_max_pixels",
)
DEFAULT_VAE_FACTORY = "kohakumoss.encoders.vae:ImageVAE.load"


def text_settings(cfg: TrainConfig) -> TextEncoderConfig | None:
    """The text encoder config the training run `cfg` builds (None: TEXT_ENCODER empty or a stand-in):
    on the run's device, in its encoder dtype, cut at MAX_TEXT_TOKENS; an edit run's with its
    REFERENCES_IN_PROMPT (the vision settings then enter the identity, the references each key)."""
    if cfg.encoders.text_encoder in STAND_INS:
        return None
    device = _compute_device(cfg.device.device)
    references = dataset_has_references(cfg.data.dataset)
    return text_encoder_config(
        cfg.encoders, device, device, cfg.device.precision, int(cfg.data.max_text_tokens), references
    )


def _compute_device(knob: str) -> torch.device:
    """DEVICE as the trainer resolves it; a device this machine lacks is still read (`check` may run
    elsewhere than the run): only its type enters the encoder's dtype."""
    try:
        return resolve_device(knob)
    except ConfigError:
        return torch.device(knob)


def text_kwargs(cfg: TrainConfig) -> dict[str, Any] | None:
    """TEXT_KWARGS for cache_text that build `text_settings(cfg)`: the fields that differ from the defaults."""
    settings = text_settings(cfg)
    if settings is None:
        return None
    defaults = TextEncoderConfig(path=settings.path)
    out = {
        f.name: getattr(settings, f.name)
        for f in dataclasses.fields(settings)
        if f.name in ("path", "device") or getattr(settings, f.name) != getattr(defaults, f.name)
    }
    if "layers" in out:
        out["layers"] = list(out["layers"])  # a config file's literal
    return out


def data_text_settings(kwargs: Mapping[str, Any], max_text_tokens: int) -> TextEncoderConfig:
    """What cache_text builds from TEXT_KWARGS: cut at MAX_TEXT_TOKENS unless TEXT_KWARGS says otherwise."""
    fields = {f.name for f in dataclasses.fields(TextEncoderConfig)}
    if unknown := sorted(set(kwargs) - fields):
        raise ConfigError(
            "TEXT_KWARGS", f"unknown TextEncoderConfig fields {unknown}; known: {sorted(fields)}"
        )
    if "path" not in kwargs:
        raise ConfigError("TEXT_KWARGS", "needs 'path': the text encoder's folder or file")
    return TextEncoderConfig(**{"max_length": int(max_text_tokens), **kwargs})


def _path(value: Any) -> Any:
    return str(Path(value).expanduser().resolve()) if isinstance(value, str) and value else value


def _text_identity(settings: TextEncoderConfig) -> dict[str, Any]:
    out = {name: getattr(settings, name) for name in TEXT_IDENTITY_FIELDS}
    out["path"], out["tokenizer_path"] = _path(out["path"]), _path(out["tokenizer_path"])
    out["layers"] = list(out["layers"])
    return out


def cache_settings(knobs: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """Everything that enters the cache keys, by knob: the plan knobs (SEED, AREA, ...), CACHE_DIR, the
    text encoder's identity settings ('text', None when nothing is cached for it) and the VAE's path
    ('vae'). `knobs`: a training config's (`kind` 'train') or a data config's ('data'), defaults included."""
    from kohakumoss.config.data_scripts import DATA_SCHEMA, SHARED

    if kind not in ("train", "data"):
        raise ValueError(f"kind must be 'train' or 'data', got {kind!r}")
    schema = TRAIN_SCHEMA if kind == "train" else DATA_SCHEMA
    merged = {**schema.defaults(), **{k: v for k, v in knobs.items() if k in schema.knobs}}
    out: dict[str, Any] = {k: merged[k] for k in SHARED}
    out["CACHE_DIR"] = _path(merged["CACHE_DIR"])
    if kind == "train":
        cfg = TrainConfig.from_knobs(merged)
        out["MICRO_STEPS"] = int(cfg.optim.steps) * int(cfg.optim.grad_accum)
        settings = text_settings(cfg) if cfg.data.text_encode != "online" else None
        out["text"] = _text_identity(settings) if settings is not None else None
        vae = cfg.encoders.vae
        out["vae"] = _path(vae) if cfg.data.vae_encode != "online" and vae not in STAND_INS else None
        return out
    out["MICRO_STEPS"] = merged["MICRO_STEPS"]
    custom_text = bool(merged["TEXT_FACTORY"])
    out["text"] = (
        "TEXT_FACTORY"  # a factory of the user's own: its encoder's settings cannot be read here
        if custom_text
        else _text_identity(data_text_settings(merged["TEXT_KWARGS"], merged["MAX_TEXT_TOKENS"]))
    )
    custom_vae = merged["VAE_FACTORY"] != DEFAULT_VAE_FACTORY
    out["vae"] = "VAE_FACTORY" if custom_vae else _path(dict(merged["VAE_KWARGS"]).get("path"))
    return out


def cache_mismatches(train: Mapping[str, Any], data: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(knob, why) for each setting where the data config's caches are not the training config's:
    `train` and `data` are `cache_settings` of the two. Empty: training reads what the data scripts fill."""
    out = []
    for knob, want in train.items():
        have = data.get(knob)
        if knob == "text":
            out += _text_mismatches(want, have)
        elif knob == "vae":
            if want is not None and have not in (want, "VAE_FACTORY"):
                out.append(("VAE_KWARGS", f"path {have!r}, but training encodes with VAE {want!r}"))
        elif knob == "MICRO_STEPS":
            if have < want:  # more covers the run too: an epoch's entries do not depend on the count
                why = f"{have}: the caches cover fewer than the run's {want} micro-steps (STEPS x GRAD_ACCUM)"
                out.append((knob, why))
        elif have != want:
            out.append((knob, f"the data config has {have!r}, the training config {want!r}"))
    return out


def _text_mismatches(want: dict[str, Any] | None, have: Any) -> list[tuple[str, str]]:
    if want is None or have == "TEXT_FACTORY":
        return []
    return [
        ("TEXT_KWARGS", f"{name} {have.get(name)!r}, but training encodes with {value!r}")
        for name, value in want.items()
        if have.get(name) != value
    ]

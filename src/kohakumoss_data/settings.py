"""The knob tables as they were before `kohakumoss.data_knobs` (the one conversion now): kept only while
src/kohakumoss/train/data.py and train/resume.py import them from here; delete it once they import
kohakumoss.data_knobs (the same names). tests/data/test_data_knobs.py holds the two equal meanwhile."""

from __future__ import annotations

import ast
import importlib
from collections.abc import Callable, Mapping
from typing import Any

from kohakumoss_common.errors import ConfigError

from .buckets import kohya_buckets
from .catalog import ScanKnobs
from .dataset_options import dataset_options
from .loader import LoaderKnobs
from .plan import PlanKnobs

SCAN_KNOBS = {
    "MAX_PIXELS": "max_pixels",
    "MIN_SIDE": "min_side",
    "MISSING_CAPTION": "missing_caption",
    "SCAN_WORKERS": "workers",
}
PLAN_KNOBS = {
    "AREA": "area",
    "MULTIPLE": "multiple",
    "MIN_ASPECT": "min_aspect",
    "MAX_ASPECT": "max_aspect",
    "NO_UPSCALE": "no_upscale",
    "CROP": "crop",
    "TOKENS_PER_STEP": "tokens_per_step",
    "MAX_TEXT_TOKENS": "max_text_tokens",
    "CHARS_PER_TOKEN": "chars_per_token",
    "FLIP_PROB": "flip_prob",
    "CAPTION_DROPOUT": "caption_dropout",
    "SHUFFLE_CAPTION": "shuffle_caption",
    "KEEP_TOKENS": "keep_tokens",
    "CAPTION_SEPARATOR": "caption_separator",
    "TAG_DROPOUT": "tag_dropout",
    "EPOCHS": "epochs",
    "SHUFFLE": "shuffle",
    "DROP_LAST": "drop_last",
}
LOADER_KNOBS = {
    "WORKERS": "workers",
    "PREFETCH_STEPS": "prefetch_steps",
    "WRITE_BACK": "write_back",
    "PIN_MEMORY": "pin_memory",
}


def _pick(knobs: Mapping[str, Any], names: dict[str, str]) -> dict[str, Any]:
    return {field: knobs[name] for name, field in names.items() if name in knobs}


def scan_knobs(knobs: Mapping[str, Any]) -> ScanKnobs:
    return ScanKnobs(**_pick(knobs, SCAN_KNOBS))


def buckets_knob(value: Any, area: int) -> tuple[tuple[int, int], ...] | None:
    """BUCKETS: None, "kohya" (kohya's set for AREA) or a list of [w, h] (also as text from --set)."""
    if isinstance(value, str):
        value = value.strip().strip("'\"")
        value = ast.literal_eval(value) if value.startswith(("[", "(")) else value
    if value in (None, False, "", "None", "none"):
        return None
    if value == "kohya":
        return tuple(kohya_buckets(area))
    try:
        return tuple((int(w), int(h)) for w, h in value)
    except (TypeError, ValueError) as e:
        raise ConfigError("BUCKETS", f"must be None, 'kohya' or a list of [w, h], got {value!r}") from e


def plan_knobs(knobs: Mapping[str, Any]) -> PlanKnobs:
    picked = _pick(knobs, PLAN_KNOBS)
    picked["buckets"] = buckets_knob(knobs.get("BUCKETS"), int(picked.get("area", PlanKnobs.area)))
    if "DATASET" in knobs:  # per-dataset repeats, caption settings, reg weight and mask
        picked["datasets"] = dataset_options(knobs["DATASET"])
    return PlanKnobs(**picked).validate()


def loader_knobs(knobs: Mapping[str, Any]) -> LoaderKnobs:
    return LoaderKnobs(**_pick(knobs, LOADER_KNOBS))


def load_factory(ref: str, knob: str) -> Callable[..., Any]:
    """'package.module:function' or 'package.module:Class.method' -> that callable (how scripts get encoders)."""
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise ConfigError(knob, f"must look like 'package.module:function', got {ref!r}")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
        return obj
    except (ImportError, AttributeError) as e:
        raise ConfigError(knob, f"cannot import {ref!r} ({e})") from e

"""A script's data knobs as kohakumoss_data's typed settings: the one conversion.

kohakumoss_data knows no knob names: it takes ScanKnobs, PlanKnobs and LoaderKnobs, and its errors
name their fields (`tokens_per_step`). Here a script's typed sections (the train config's `cfg.data`, a
data script's `cfg.scan` / `cfg.plan`: a knob's field is its name lower-cased) become those settings (the
tables below), and `knob_errors` renames a data error's field to the knob a user sets. A knob's default is
its settings field's default (config/train.py reads them from there).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import math
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from kohakumoss_common.errors import ConfigError
from kohakumoss_data.buckets import kohya_buckets
from kohakumoss_data.catalog import Catalog, ScanKnobs, scan
from kohakumoss_data.dataset_options import dataset_options
from kohakumoss_data.loader import LoaderKnobs
from kohakumoss_data.plan import Plan, PlanKnobs, build_plan
from kohakumoss_data.sources import Source, make_source

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
    "CAPTION_FORMAT": "caption_format",
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
# a data error's leading field -> the knob (scan's `workers` is SCAN_WORKERS; the source is DATASET)
_ERROR_KNOBS = {
    **{f: k for k, f in LOADER_KNOBS.items()},
    **{f: k for k, f in PLAN_KNOBS.items()},
    **{f: k for k, f in SCAN_KNOBS.items() if f != "workers"},
    "buckets": "BUCKETS",
    "dataset": "DATASET",
}


def knob_name(key: str) -> str:
    """`tokens_per_step` -> TOKENS_PER_STEP, `min_aspect/max_aspect` -> MIN_ASPECT/MAX_ASPECT,
    `dataset[1].tag_dropout` -> DATASET[1].tag_dropout (a dataset entry's own keys stay)."""
    return re.sub(r"(?:^|(?<=/))[a-z_]+", lambda m: _ERROR_KNOBS.get(m.group(), m.group()), key)


@contextmanager
def knob_errors() -> Iterator[None]:
    """Re-raise a kohakumoss_data ConfigError under the knob's name."""
    try:
        yield
    except ConfigError as e:
        name = knob_name(e.knob)
        if name == e.knob:
            raise
        raise ConfigError(name, str(e)[len(e.knob) + 2 :]) from e


def _pick(section: Any, names: Mapping[str, str]) -> dict[str, Any]:
    """{settings field: value} of the knobs of `names` that `section` has (its field: the knob lower-cased)."""
    return {
        field: getattr(section, knob.lower())
        for knob, field in names.items()
        if hasattr(section, knob.lower())
    }


def scan_knobs(scan_section: Any) -> ScanKnobs:
    """The scan settings of a section holding the scan knobs (MIN_SIDE, SCAN_WORKERS, ...)."""
    return ScanKnobs(**_pick(scan_section, SCAN_KNOBS))


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


def plan_knobs(plan_section: Any, dataset: Any = None, **settings: Any) -> PlanKnobs:
    """The plan settings of a section holding the plan knobs (AREA, TOKENS_PER_STEP, BUCKETS, ...);
    `dataset`: DATASET's value (its per-dataset repeats, caption settings, reg weight and mask);
    `settings`: fields set here instead (the trainer's `epochs=1`: its EPOCHS counts whole runs)."""
    picked = {**_pick(plan_section, PLAN_KNOBS), **settings}
    picked["buckets"] = buckets_knob(getattr(plan_section, "buckets", None), int(picked["area"]))
    with knob_errors():
        if dataset is not None:
            picked["datasets"] = dataset_options(dataset)
        return PlanKnobs(**picked).validate()


def loader_knobs(loader_section: Any) -> LoaderKnobs:
    """The loader settings of a section holding the loader knobs (WORKERS, PREFETCH_STEPS)."""
    return LoaderKnobs(**_pick(loader_section, LOADER_KNOBS))


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


def open_dataset(dataset_section: Any, scan_section: Any) -> tuple[Source, Catalog]:
    """DATASET and CATALOG_DIR (`dataset_section`) and the scan knobs -> the source and its incremental
    catalog."""
    with knob_errors():
        source = make_source(dataset_section.dataset)
        catalog = scan(source, scan_knobs(scan_section), cache_dir=dataset_section.catalog_dir)
        return source, catalog


def plan_dataset(plan_section: Any, dataset: Any, catalog: Catalog) -> Plan:
    """SEED and the plan knobs of a data script's plan section (and DATASET's value) -> the plan; its
    sha256 is printed as `plan sha256 <hex>`. With MICRO_STEPS, at least the epochs a training run of that
    many micro-steps plans (counted without the template's tokens, so never fewer: an epoch's items do not
    depend on how steps are packed)."""
    with knob_errors():
        settings, seed = plan_knobs(plan_section, dataset), int(plan_section.seed)
        if micro := int(plan_section.micro_steps or 0):  # the trainer's count (train/data.plan_for_steps)
            per_epoch = len(build_plan(catalog, seed, dataclasses.replace(settings, epochs=1)).steps)
            epochs = max(settings.epochs, math.ceil(micro / per_epoch) if per_epoch else 1)
            settings = dataclasses.replace(settings, epochs=epochs)
        plan = build_plan(catalog, seed, settings)
    print(f"plan sha256 {plan.sha256}")
    return plan

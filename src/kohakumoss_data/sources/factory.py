"""Build a source from a plain dict spec (what configs write): {"kind": "kohya", "path": ..., knobs...}.

Per-dataset options (repeats, caption settings, reg, loss_weight, mask) sit in the same dict; they are
checked here and left to the plan (`dataset_options.py`)."""

from __future__ import annotations

from typing import Any

from kohakumoss_common.errors import ConfigError

from ..dataset_options import split_options
from .base import Source
from .concat import ConcatSource
from .folder import FolderSource
from .jsonl import JsonlSource
from .kohya import KohyaSource
from .parquet import ParquetSource
from .shards import ShardSource
from .webdataset_source import WebDatasetSource

SOURCE_KINDS: dict[str, type[Source]] = {
    "kohya": KohyaSource,
    "folder": FolderSource,
    "jsonl": JsonlSource,
    "parquet": ParquetSource,
    "webdataset": WebDatasetSource,
    "shards": ShardSource,
}


def make_source(spec: dict[str, Any] | list | Source, knob: str = "dataset") -> Source:
    """A Source from {"kind": ..., "path": ..., other constructor knobs}; a list makes one dataset of many."""
    if isinstance(spec, Source):
        return spec
    if isinstance(spec, (list, tuple)):
        return ConcatSource([make_source(s, f"{knob}[{i}]") for i, s in enumerate(spec)])
    if not isinstance(spec, dict) or "kind" not in spec or "path" not in spec:
        raise ConfigError(knob, f"must be a dict with 'kind' and 'path', got {spec!r}")
    kind = spec["kind"]
    if kind not in SOURCE_KINDS:
        raise ConfigError(f"{knob}.kind", f"unknown source kind {kind!r}; one of {sorted(SOURCE_KINDS)}")
    own, _ = split_options(spec, knob)  # per-dataset options are the plan's (dataset_options.py)
    kwargs = {k: v for k, v in own.items() if k != "kind"}
    try:
        return SOURCE_KINDS[kind](**kwargs)
    except TypeError as e:
        raise ConfigError(knob, f"bad knobs for a {kind} source: {e}") from e

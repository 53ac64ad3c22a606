"""How many reference images per target an edit run's step can hold, read from the data.

Every planned occurrence of an item carries all of its references (`kohakumoss_data.plan.plan_item`), so
the most any usable item of the dataset has is the most a step meets: `Catalog.most_references`. The
trainer scans the dataset before it plans memory (`train/data.scan_dataset`), so its catalog cache holds
that scan; `kohakumoss-config check` reads the cache the last scan left (none before the first scan).
The cache is read without listing or probing the data, once per version of the file.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from kohakumoss_common.errors import KohakuMossError

_SOURCES: dict[tuple[str, str | None], tuple[Any, Path]] = {}  # (DATASET, CATALOG_DIR) -> source, cache


def scanned_references(data: Any) -> int | None:
    """The most reference images a usable item of `data.dataset` has, as its cached catalog (the scan
    of `data`'s scan knobs, under `data.catalog_dir`) says; None when no scan of it is cached (or the
    dataset cannot be opened: the scan names why)."""
    from kohakumoss.data_knobs import scan_knobs

    found = _catalog_file(data.dataset, data.catalog_dir)
    if found is None:
        return None
    source, path = found
    try:
        stat = path.stat()
    except OSError:
        return None
    return _most_references(source, str(path), stat.st_mtime_ns, stat.st_size, scan_knobs(data))


def _catalog_file(dataset: Any, catalog_dir: str | None) -> tuple[Any, Path] | None:
    """The dataset's source and the path of its catalog cache (kept for the process once the source
    opens: making a source lists folders)."""
    from kohakumoss_data.catalog import default_cache_path
    from kohakumoss_data.sources import make_source

    key = (json.dumps(dataset, sort_keys=True, default=str), catalog_dir)
    if key not in _SOURCES:
        try:
            source = make_source(dataset)
        except (KohakuMossError, OSError, ValueError, TypeError):
            return None  # not kept: the dataset may appear later in this process
        _SOURCES[key] = (source, default_cache_path(source, catalog_dir))
    return _SOURCES[key]


@lru_cache(maxsize=8)
def _most_references(source: Any, path: str, mtime_ns: int, size: int, knobs: Any) -> int | None:
    from kohakumoss_data.catalog import cached_catalog

    try:
        catalog = cached_catalog(source, knobs, cache_path=path)
    except (KohakuMossError, KeyError, TypeError, ValueError):  # a cache the next scan rewrites
        return None
    return None if catalog is None else catalog.most_references

"""The catalog: one cached, incremental scan per dataset (size, captions, hash, status and reason).

The cache keeps what probing found per unit with the unit's signature; a second scan re-reads only
units whose signature changed or that are new, and reports how many it read. Knobs that do not need
the pixels (minimum size, missing-caption policy) are applied after loading, so changing them is free.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kohakumoss_common.errors import DataError
from kohakumoss_common.hashing import sha256_bytes, sha256_json
from kohakumoss_common.io import atomic_write_json
from kohakumoss_common.log import get_logger
from kohakumoss_common.paths import user_cache_dir
from kohakumoss_common.progress import Progress

from .captions import MAX_CAPTION_BYTES, TOO_LARGE, apply_missing_policy, check_policy, decode_captions
from .ordered_map import bounded_map
from .probe import (
    BAD_REFERENCE,
    CAPTION_NOT_UTF8,
    CAPTION_TOO_LARGE,
    MISSING_CAPTION,
    MISSING_REFERENCE,
    TOO_SMALL,
    Probe,
    probe_bytes,
)
from .records import OK, CatalogItem, RawItem, RawReference
from .sources.base import Source

CACHE_VERSION = 2  # 2: pixels decoded before the EXIF read (v1 let a PNG with a broken IDAT pass)
CHECKPOINT_SECONDS = 60.0
SAVE_OVERHEAD = 10.0  # the next save waits at least this many times the last save's duration
MISSING_FILE = "missing_file"
log = get_logger(__name__)


@dataclass(frozen=True)
class ScanKnobs:
    max_pixels: int = 178_956_970  # Pillow's own hard limit; anything larger is treated as a bomb
    min_side: int = 64
    missing_caption: str = "empty"  # error | empty | filename
    workers: int = 4  # threads that decode while probing (Pillow releases the GIL)


@dataclass
class ScanReport:
    units_total: int = 0
    units_read: int = 0
    units_reused: int = 0
    units_removed: int = 0
    kept: int = 0
    dropped: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        drops = ", ".join(f"{k} {v}" for k, v in sorted(self.dropped.items())) or "none"
        return (
            f"scan: {self.units_total} units, read {self.units_read}, reused {self.units_reused}, "
            f"removed {self.units_removed}; kept {self.kept} items, dropped: {drops}"
        )


@dataclass
class Catalog:
    source: dict[str, Any]
    items: list[CatalogItem]
    report: ScanReport

    @property
    def usable(self) -> list[CatalogItem]:
        return [it for it in self.items if it.status == OK]

    @property
    def most_references(self) -> int:
        """The most reference images a usable item has (0: none has any): every planned occurrence of an
        item carries all of its references (plan.plan_item)."""
        return max((len(it.references) for it in self.usable), default=0)

    def fingerprint(self) -> str:
        """Changes when any usable item's content, size or captions change."""
        return sha256_json(
            [
                [it.key, it.hash, it.width, it.height, it.captions, it.repeats, *ref_rows(it)]
                for it in self.usable
            ]
        )


def ref_rows(item: CatalogItem) -> list[list[Any]]:
    """An item's references as they enter the fingerprint (none: nothing, so older fingerprints stay)."""
    return [[r["hash"], r["width"], r["height"]] for r in item.references]


def default_cache_path(source: Source, cache_dir: str | Path | None = None) -> Path:
    """`<dataset>/.kohakumoss_catalog.json`, or one file per dataset (by spec hash) under `cache_dir`.

    A read-only dataset folder sends the catalog to the user cache folder instead.
    """
    if cache_dir is None:
        folder = source.catalog_home()
        if folder is not None and os.access(folder, os.W_OK):
            name = (
                ".kohakumoss_catalog.json"
                if source.path.is_dir()
                else f".{source.path.name}.kohakumoss_catalog.json"
            )
            return folder / name
        cache_dir = user_cache_dir() / "catalogs"
    return Path(cache_dir) / f"catalog-{spec_digest(source.spec())[:16]}.json"


def spec_digest(spec: dict[str, Any]) -> str:
    """sha256 of a source's spec; a path in bytes that are not UTF-8 hashes by its escaped JSON."""
    try:
        return sha256_json(spec)
    except UnicodeEncodeError:
        return sha256_bytes(json.dumps(spec, sort_keys=True, default=str).encode("ascii"))


def probe_raw(raw: RawItem, unit: str, max_pixels: int) -> CatalogItem:
    """Scan one raw item: decode check, hash and captions (before the post-scan knobs)."""
    if raw.fault is not None:
        probe = Probe(0, 0, "", *raw.fault)
    elif raw.probed is not None:
        probe = Probe(raw.probed["width"], raw.probed["height"], raw.probed["hash"])
    elif raw.data is None:
        probe = Probe(0, 0, "", MISSING_FILE, "image file not found")
    else:
        probe = probe_bytes(raw.data, max_pixels)
    captions, caption_status = decode_captions(raw.captions)
    references: list[dict[str, Any]] = []
    if probe.status == OK:
        probe, references = probe_references(raw.references, probe, max_pixels)
    return CatalogItem(
        key=raw.key,
        unit=unit,
        locator=raw.locator,
        width=probe.width,
        height=probe.height,
        hash=probe.hash,
        captions=captions,
        caption_status=caption_status,
        repeats=raw.repeats,
        name=raw.name,
        status=probe.status,
        reason=probe.reason,
        extra=raw.extra,
        references=references,
    )


def probe_references(
    refs: list[RawReference], probe: Probe, max_pixels: int
) -> tuple[Probe, list[dict[str, Any]]]:
    """Decode-check each reference: the item's probe turns into a named drop at the first one that is
    missing or unusable; else the references' sizes and hashes, in order."""
    out = []
    for i, ref in enumerate(refs, 1):
        if ref.fault:
            return Probe(0, 0, "", BAD_REFERENCE, f"reference {i} {ref.name}: {ref.fault}"), []
        if ref.data is None:
            return Probe(0, 0, "", MISSING_REFERENCE, f"reference {i} {ref.name} does not exist"), []
        checked = probe_bytes(ref.data, max_pixels)
        if checked.status != OK:
            reason = f"reference {i} {ref.name}: {checked.status}: {checked.reason}"
            return Probe(0, 0, "", BAD_REFERENCE, reason), []
        out.append(
            {
                "locator": ref.locator,
                "name": ref.name,
                "width": checked.width,
                "height": checked.height,
                "hash": checked.hash,
            }
        )
    return probe, out


def too_large(caption: str) -> bool:
    """A caption over MAX_CAPTION_BYTES in UTF-8 (one a catalog cached before the bound existed)."""
    return (
        4 * len(caption) > MAX_CAPTION_BYTES and len(caption.encode("utf-8", "replace")) > MAX_CAPTION_BYTES
    )


def finalize(item: CatalogItem, knobs: ScanKnobs) -> CatalogItem:
    """Apply min size and caption knobs to a probed item (pure)."""
    if item.status != OK:
        return item
    if item.caption_status == "not_utf8":
        return replace(item, status=CAPTION_NOT_UTF8, reason="caption is not valid UTF-8")
    if item.caption_status == TOO_LARGE or any(too_large(c) for c in item.captions):
        return replace(
            item,
            status=CAPTION_TOO_LARGE,
            captions=[],
            reason=f"caption over {MAX_CAPTION_BYTES // 1024} KiB (captions.MAX_CAPTION_BYTES): not a caption",
        )
    if min(item.width, item.height) < knobs.min_side:
        return replace(
            item, status=TOO_SMALL, reason=f"{item.width}x{item.height} under min_side {knobs.min_side}"
        )
    if item.caption_status == "missing" and knobs.missing_caption == "error":
        return replace(item, status=MISSING_CAPTION, reason="no caption")
    captions = apply_missing_policy(item.captions, item.caption_status, item.name, knobs.missing_caption)
    return replace(item, captions=captions)


def _load_cache(
    path: Path, spec: dict[str, Any], max_pixels: int, then: str = "rescanning"
) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        cache = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        log.warning("%s: unreadable catalog cache, %s (%s)", path, then, e)
        return {}
    if (
        cache.get("version") != CACHE_VERSION
        or cache.get("spec") != spec
        or cache.get("max_pixels") != max_pixels
    ):
        return {}
    return cache.get("units", {})


def _probe_units(source: Source, unit_ids: list[str], knobs: ScanKnobs) -> Iterator[CatalogItem]:
    """Probe every item of the changed units, decoding in a thread pool, in source order."""

    def work(raw: RawItem) -> CatalogItem:
        if raw.unit not in wanted:
            raise DataError(f"{source.path}: item {raw.key} names unit {raw.unit!r}, which was not asked for")
        return probe_raw(raw, raw.unit, knobs.max_pixels)

    wanted = set(unit_ids)
    pool = ThreadPoolExecutor(max(1, knobs.workers), thread_name_prefix="kohakumoss-scan")
    try:
        yield from bounded_map(pool, work, source.expand_units(unit_ids), 4 * max(1, knobs.workers))
    finally:
        # an error, Ctrl-C or an abandoned scan: the queued probes are cancelled, not run first (as the
        # pool's `with` did); a running one ends by itself (entries are regular files, reads are bounded)
        pool.shutdown(wait=False, cancel_futures=True)


def _write_cache(path: Path, spec: dict[str, Any], max_pixels: int, table: dict[str, Any]) -> None:
    atomic_write_json(
        path, {"version": CACHE_VERSION, "spec": spec, "max_pixels": max_pixels, "units": table}
    )


def _probe_changed(
    source: Source, changed: list[str], knobs: ScanKnobs, checkpoint: Callable[[dict[str, list]], None]
) -> dict[str, list[dict[str, Any]]]:
    """Probe the changed units; every CHECKPOINT_SECONDS the finished units are saved (a long first
    scan that is interrupted resumes where it was)."""
    fresh: dict[str, list[dict[str, Any]]] = {u: [] for u in changed}
    finished: dict[str, list[dict[str, Any]]] = {}
    current, last_save, interval = None, time.monotonic(), CHECKPOINT_SECONDS
    with Progress(len(changed), "scan", "file") as bar:  # nothing shown when no file changed
        for item in _probe_units(source, changed, knobs):
            if item.unit != current:
                if current is not None:
                    finished[current] = fresh[current]
                    bar.update(1)
                current = item.unit
                if time.monotonic() - last_save >= interval:
                    started = time.monotonic()
                    checkpoint(finished)
                    last_save = time.monotonic()
                    interval = max(
                        CHECKPOINT_SECONDS, SAVE_OVERHEAD * (last_save - started)
                    )  # saving stays under 10%
            fresh[item.unit].append(item.to_json())
        bar.update(len(changed) - bar.done)
    return fresh


def scan(
    source: Source,
    knobs: ScanKnobs | None = None,
    cache_dir: str | Path | None = None,
    cache_path: str | Path | None = None,
) -> Catalog:
    """Scan `source`, reusing the cached results of every unit whose signature is unchanged."""
    knobs = knobs or ScanKnobs()
    check_policy(knobs.missing_caption)
    spec = json.loads(json.dumps(source.spec()))
    path = Path(cache_path) if cache_path else default_cache_path(source, cache_dir)
    cached = _load_cache(path, spec, knobs.max_pixels)
    units = list(source.units())
    changed = [u.id for u in units if cached.get(u.id, {}).get("signature") != u.signature]
    signatures = {u.id: u.signature for u in units}

    def table_with(done: dict[str, list]) -> dict[str, Any]:
        kept = {
            u: {"signature": signatures[u], "items": cached[u]["items"]}
            for u in signatures
            if u not in changed_set
        }
        return kept | {u: {"signature": signatures[u], "items": items} for u, items in done.items()}

    changed_set = set(changed)
    fresh = _probe_changed(
        source, changed, knobs, lambda done: _write_cache(path, spec, knobs.max_pixels, table_with(done))
    )
    table = table_with(fresh)
    _write_cache(path, spec, knobs.max_pixels, table)
    items = [finalize(CatalogItem.from_json(rec), knobs) for u in units for rec in table[u.id]["items"]]
    report = _report(len(units), len(changed), len(set(cached) - set(signatures)), items)
    log.info("%s: %s", source.path, report.summary())
    _raise_missing_captions(items, knobs, source)
    return Catalog(spec, items, report)


def cached_catalog(
    source: Source,
    knobs: ScanKnobs | None = None,
    cache_dir: str | Path | None = None,
    cache_path: str | Path | None = None,
) -> Catalog | None:
    """The catalog the last `scan` of `source` left in its cache (the same file and key), read without
    listing or probing the data: units changed since are as that scan saw them. None when no scan of
    this source (and max_pixels) is cached."""
    knobs = knobs or ScanKnobs()
    spec = json.loads(json.dumps(source.spec()))
    path = Path(cache_path) if cache_path else default_cache_path(source, cache_dir)
    table = _load_cache(path, spec, knobs.max_pixels, then="ignored")
    if not table:
        return None
    items = [finalize(CatalogItem.from_json(rec), knobs) for unit in table.values() for rec in unit["items"]]
    return Catalog(spec, items, _report(len(table), 0, 0, items))


def _report(units: int, read: int, removed: int, items: list[CatalogItem]) -> ScanReport:
    drops = Counter(it.status for it in items if it.status != OK)
    kept = sum(1 for it in items if it.status == OK)
    return ScanReport(units, read, units - read, removed, kept, dict(sorted(drops.items())))


def _raise_missing_captions(items: list[CatalogItem], knobs: ScanKnobs, source: Source) -> None:
    if knobs.missing_caption != "error":
        return
    missing = [it.key for it in items if it.status == MISSING_CAPTION]
    if missing:
        raise DataError(
            f"{source.path}: {len(missing)} images have no caption (missing_caption 'error'), "
            f"e.g. {missing[:5]}; add captions or set missing_caption to 'empty' or 'filename'"
        )

"""Every source kind scans the same real photos into the same catalog fields."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kohakumoss_common.errors import ConfigError, DataError
from kohakumoss_data import ScanKnobs, make_source, scan
from kohakumoss_data.sources.convert import convert_to_shards

from .helpers import caption_for


def _scan(spec, tmp_path, **knobs):
    source = make_source(spec)
    return source, scan(source, ScanKnobs(workers=2, **knobs), cache_dir=tmp_path / "catalogs")


def test_kohya_repeats_captions_and_formats(kohya_dir, tmp_path):
    _, catalog = _scan({"kind": "kohya", "path": str(kohya_dir)}, tmp_path)
    by_key = {it.key: it for it in catalog.usable}
    assert len(by_key) == 7 and catalog.report.dropped == {}
    assert by_key["3_wall/img0.jpg"].repeats == 3 and by_key["1_misc/other.jpg"].repeats == 1
    assert by_key["3_wall/img1.png"].captions == [caption_for(1)]
    assert by_key["1_misc/other.jpg"].captions == ["caption from a .caption file"]
    assert {k.rsplit(".", 1)[1] for k in by_key} == {"jpg", "png", "webp"}


def test_kohya_caption_extension_knob(kohya_dir, tmp_path):
    _, catalog = _scan({"kind": "kohya", "path": str(kohya_dir), "caption_extension": ".caption"}, tmp_path)
    by_key = {it.key: it for it in catalog.usable}
    assert by_key["3_wall/img0.jpg"].captions == [""]  # .txt not read; default policy: empty caption
    assert by_key["1_misc/other.jpg"].captions == ["caption from a .caption file"]


def test_folder_jsonl_parquet_webdataset_agree(kohya_dir, jsonl_file, parquet_file, wds_dir, tmp_path):
    _, kohya = _scan({"kind": "kohya", "path": str(kohya_dir)}, tmp_path)
    sizes = {(it.width, it.height) for it in kohya.usable}
    _, jsonl = _scan({"kind": "jsonl", "path": str(jsonl_file)}, tmp_path)
    first = next(it for it in jsonl.usable if it.key.startswith("1:"))
    assert len(jsonl.usable) == 5 and first.captions == [caption_for(0), "alt caption 0"]
    assert first.extra == {"score": 0}
    _, parquet = _scan(
        {"kind": "parquet", "path": str(parquet_file), "image_column": "jpg", "caption_column": "text"},
        tmp_path,
    )
    assert [it.captions[0] for it in parquet.usable] == [caption_for(i) for i in range(5)]
    _, wds = _scan({"kind": "webdataset", "path": str(wds_dir)}, tmp_path)
    assert len(wds.usable) == 6 and wds.report.units_total == 2
    for catalog in (jsonl, parquet, wds):
        assert {(it.width, it.height) for it in catalog.usable} <= sizes


def test_parquet_missing_column_names_it(parquet_file):
    with pytest.raises(DataError, match="no column 'image' \\(knob image_column\\)"):
        make_source({"kind": "parquet", "path": str(parquet_file)})


def test_parquet_path_column(jsonl_file, tmp_path):
    pq.write_table(
        pa.table({"image": ["images/p0.jpg", "images/p1.jpg"], "caption": ["a", "b"]}),
        tmp_path / "paths.parquet",
    )
    source, catalog = _scan({"kind": "parquet", "path": str(tmp_path / "paths.parquet")}, tmp_path)
    assert [it.captions for it in catalog.usable] == [["a"], ["b"]]
    assert source.read(catalog.usable[1].locator) == (tmp_path / "images/p1.jpg").read_bytes()


def test_source_reads_match_scan_hash(parquet_file, wds_dir, tmp_path):
    from kohakumoss_common.hashing import sha256_bytes

    for spec in (
        {"kind": "parquet", "path": str(parquet_file), "image_column": "jpg", "caption_column": "text"},
        {"kind": "webdataset", "path": str(wds_dir)},
    ):
        source, catalog = _scan(spec, tmp_path)
        for item in catalog.usable:
            assert sha256_bytes(source.read(item.locator)) == item.hash


def test_shard_converter_roundtrip(kohya_dir, tmp_path):
    source, catalog = _scan({"kind": "kohya", "path": str(kohya_dir)}, tmp_path)
    paths = convert_to_shards(source, catalog, tmp_path / "shards", max_area=200 * 150, items_per_shard=3)
    assert len(paths) == 3
    shards, shard_catalog = _scan({"kind": "shards", "path": str(tmp_path / "shards")}, tmp_path)
    assert len(shard_catalog.usable) == 7
    item = next(it for it in shard_catalog.usable if it.key.endswith("3_wall/img0.jpg"))
    assert item.repeats == 3 and item.captions == [caption_for(0)] and item.width * item.height <= 200 * 150
    assert shards.read(item.locator).size == (item.width, item.height)


def test_bad_spec_is_a_config_error():
    with pytest.raises(ConfigError, match=r"^dataset\.kind: "):
        make_source({"kind": "zip", "path": "x"})


def test_list_of_datasets_is_one_catalog(kohya_dir, wds_dir, tmp_path):
    source, catalog = _scan(
        [{"kind": "kohya", "path": str(kohya_dir)}, {"kind": "webdataset", "path": str(wds_dir)}], tmp_path
    )
    keys = [it.key for it in catalog.usable]
    assert len(keys) == 13 and keys[0] == "0/1_misc/other.jpg" and keys[-1].startswith("1/shard-0001.tar:")
    assert source.read(catalog.usable[-1].locator)[:2] == b"\xff\xd8"  # a JPEG from the tar
    again = scan(
        make_source(
            [{"kind": "kohya", "path": str(kohya_dir)}, {"kind": "webdataset", "path": str(wds_dir)}]
        ),
        ScanKnobs(workers=2),
        cache_dir=tmp_path / "catalogs",
    )
    assert again.report.units_read == 0

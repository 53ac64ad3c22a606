"""The catalog: bad items recorded with reasons, incremental rescans, the missing-caption knob."""

from __future__ import annotations

import pytest

from kohakumoss_common.errors import DataError
from kohakumoss_data import ScanKnobs, make_source, scan

from .helpers import write_photo


def test_bad_items_are_counted_not_fatal(folder_dir, tmp_path):
    root, expected = folder_dir
    catalog = scan(make_source({"kind": "folder", "path": str(root)}), ScanKnobs(workers=2))
    status = {it.key.rsplit("/", 1)[-1]: it.status for it in catalog.items}
    for name, want in expected.items():
        assert status[name] == want, name
    dropped = {k: v for k, v in catalog.report.dropped.items()}
    assert dropped == {
        "caption_not_utf8": 1,
        "too_small": 1,
        "truncated": 1,
        "unsupported_format": 1,
        "zero_byte": 1,
    }
    assert catalog.report.kept == 4 + 5
    rotated = next(it for it in catalog.items if it.key.endswith("rotated.jpg"))
    assert (rotated.width, rotated.height) == (180, 300)  # photos[4] is 300x180, EXIF-rotated
    assert (root / ".kohakumoss_catalog.json").is_file()


def test_second_scan_reads_only_new_files(kohya_copy, photos):
    source = make_source({"kind": "kohya", "path": str(kohya_copy)})
    first = scan(source, ScanKnobs(workers=2))
    assert first.report.units_read == 7
    again = scan(make_source({"kind": "kohya", "path": str(kohya_copy)}), ScanKnobs(workers=2))
    assert again.report.units_read == 0 and again.report.units_reused == 7
    write_photo(kohya_copy / "3_wall", "new1", photos[7], "one more")
    write_photo(kohya_copy / "1_misc", "new2", photos[6], "and another")
    third = scan(make_source({"kind": "kohya", "path": str(kohya_copy)}), ScanKnobs(workers=2))
    assert (third.report.units_read, third.report.units_reused, third.report.kept) == (2, 7, 9)
    (kohya_copy / "3_wall" / "img0.txt").write_text("edited caption")
    fourth = scan(make_source({"kind": "kohya", "path": str(kohya_copy)}), ScanKnobs(workers=2))
    assert fourth.report.units_read == 1
    assert next(it for it in fourth.items if it.key == "3_wall/img0.jpg").captions == ["edited caption"]


def test_missing_caption_policies(photos, tmp_path):
    root = tmp_path / "d"
    write_photo(root, "blue_sky_photo", photos[0], None)
    write_photo(root, "captioned", photos[1], "has one")
    source = make_source({"kind": "folder", "path": str(root)})
    cache = tmp_path / "cache"
    empty = scan(source, ScanKnobs(missing_caption="empty"), cache_dir=cache)
    assert sorted(it.captions[0] for it in empty.usable) == ["", "has one"]
    named = scan(source, ScanKnobs(missing_caption="filename"), cache_dir=cache)
    assert named.report.units_read == 0  # policy applies after the cached probe
    assert sorted(it.captions[0] for it in named.usable) == ["blue sky photo", "has one"]
    with pytest.raises(DataError, match="blue_sky_photo.jpg.*missing_caption"):
        scan(source, ScanKnobs(missing_caption="error"), cache_dir=cache)


def test_min_side_and_bomb_knobs(kohya_dir, tmp_path):
    source = make_source({"kind": "kohya", "path": str(kohya_dir)})
    small = scan(source, ScanKnobs(min_side=250), cache_dir=tmp_path)
    assert small.report.dropped.get("too_small") == 6  # every short side but 256x256 is under 250
    bomb = scan(source, ScanKnobs(max_pixels=70_000), cache_dir=tmp_path)
    assert bomb.report.units_read == 7 and bomb.report.dropped.get("decompression_bomb") == 4


def test_interrupted_first_scan_resumes(kohya_copy, monkeypatch):
    from kohakumoss_data import catalog as catalog_module

    real_probe, calls = catalog_module.probe_raw, []

    def failing_probe(raw, unit, max_pixels):
        calls.append(unit)
        if len(calls) == 5:
            raise KeyboardInterrupt  # the user stops a long first scan
        return real_probe(raw, unit, max_pixels)

    monkeypatch.setattr(catalog_module, "CHECKPOINT_SECONDS", 0.0)
    monkeypatch.setattr(catalog_module, "SAVE_OVERHEAD", 0.0)  # save at every finished unit
    monkeypatch.setattr(catalog_module, "probe_raw", failing_probe)
    with pytest.raises(KeyboardInterrupt):
        scan(make_source({"kind": "kohya", "path": str(kohya_copy)}), ScanKnobs(workers=1))
    monkeypatch.setattr(catalog_module, "probe_raw", real_probe)
    resumed = scan(make_source({"kind": "kohya", "path": str(kohya_copy)}), ScanKnobs(workers=1))
    assert resumed.report.units_read == 4 and resumed.report.kept == 7  # units 1-3 were saved

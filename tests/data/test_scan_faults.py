"""Per-file faults found while scanning are recorded drops with reasons, never crashes."""

from __future__ import annotations

import json
import struct
import tarfile
from pathlib import Path

import pytest

from kohakumoss_data import ScanKnobs, make_source, scan
from kohakumoss_data.report import dropped_rows, write_dropped

from .helpers import caption_for, encoded, write_photo


def corrupt_idat(data: bytes) -> bytes:
    """Flip 16 bytes in the middle of the first IDAT chunk; the header still parses."""
    out = bytearray(data)
    at = out.find(b"IDAT")
    length = struct.unpack(">I", out[at - 4 : at])[0]
    middle = at + 4 + length // 2
    for k in range(middle, middle + 16):
        out[k] ^= 0xFF
    return bytes(out)


def test_png_with_corrupt_idat_is_dropped(photos, tmp_path):
    root = tmp_path / "ds"
    write_photo(root, "good", photos[0], caption_for(0), "PNG")
    (root / "bad.png").write_bytes(corrupt_idat(encoded(photos[1], "PNG")))
    (root / "bad.txt").write_text("a caption", encoding="utf-8")
    catalog = scan(make_source({"kind": "folder", "path": str(root)}), ScanKnobs(workers=1))
    status = {it.key: (it.status, it.reason) for it in catalog.items}
    assert status["good.png"] == ("ok", "")
    assert status["bad.png"][0] == "corrupt"
    assert status["bad.png"][1].startswith(("OSError", "SyntaxError", "ValueError", "zlib"))
    assert [it.key for it in catalog.usable] == ["good.png"]


def test_dropped_files_listed_with_reasons(photos, tmp_path):
    root = tmp_path / "ds"
    write_photo(root, "good", photos[0], caption_for(0))
    (root / "bad.png").write_bytes(corrupt_idat(encoded(photos[1], "PNG")))
    (root / "empty.jpg").write_bytes(b"")
    catalog = scan(make_source({"kind": "folder", "path": str(root)}), ScanKnobs(workers=1))
    rows = dropped_rows(catalog)
    assert [(r["path"], r["status"]) for r in rows] == [("bad.png", "corrupt"), ("empty.jpg", "zero_byte")]
    assert all(r["reason"] for r in rows)
    out = tmp_path / "run" / "dropped.jsonl"
    out.parent.mkdir()
    write_dropped(out, catalog)
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert lines == rows


def test_symlink_faults_are_drops_and_dirs_followed_once(photos, tmp_path):
    root = tmp_path / "ds"
    write_photo(root, "top", photos[0], caption_for(0))
    write_photo(root / "sub", "inner", photos[1], caption_for(1))
    (root / "dangling.jpg").symlink_to(tmp_path / "nowhere.jpg")
    (root / "a.png").symlink_to(root / "b.png")
    (root / "b.png").symlink_to(root / "a.png")
    (root / "sub" / "loop").symlink_to(root, target_is_directory=True)
    (root / "sub" / "loop2").symlink_to(root / "sub", target_is_directory=True)
    (root / "zalias").symlink_to(root / "sub", target_is_directory=True)
    catalog = scan(make_source({"kind": "folder", "path": str(root)}), ScanKnobs(workers=1))
    assert sorted(it.key for it in catalog.usable) == ["sub/inner.jpg", "top.jpg"]
    status = {it.key: it.status for it in catalog.items if it.status != "ok"}
    assert status == {
        "a.png": "symlink_loop",
        "b.png": "symlink_loop",
        "dangling.jpg": "broken_symlink",
        "sub/loop": "dir_already_scanned",
        "sub/loop2": "dir_already_scanned",
        "zalias": "dir_already_scanned",
    }
    assert catalog.report.dropped == {"broken_symlink": 1, "dir_already_scanned": 3, "symlink_loop": 2}
    rows = {r["path"]: r["reason"] for r in dropped_rows(catalog)}
    assert "nowhere.jpg" in rows["dangling.jpg"]
    again = scan(make_source({"kind": "folder", "path": str(root)}), ScanKnobs(workers=1))
    assert again.report.units_read == 0 and again.report.dropped == catalog.report.dropped


def test_kohya_symlink_loop_is_a_drop(photos, tmp_path):
    root = tmp_path / "kohya"
    write_photo(root / "2_cat", "cat", photos[0], caption_for(0))
    (root / "2_cat" / "gone.jpg").symlink_to(tmp_path / "gone.jpg")
    source = make_source({"kind": "kohya", "path": str(root), "recursive": True})
    (root / "2_cat" / "back").symlink_to(root / "2_cat", target_is_directory=True)
    catalog = scan(source, ScanKnobs(workers=1))
    assert [(it.key, it.repeats) for it in catalog.usable] == [("2_cat/cat.jpg", 2)]
    assert catalog.report.dropped == {"broken_symlink": 1, "dir_already_scanned": 1}


@pytest.mark.parametrize("where", ["data", "header"])
def test_cut_tar_keeps_members_before_the_cut(wds_dir, where):
    shard = wds_dir / "shard-0001.tar"
    with tarfile.open(shard) as tf:
        member = tf.getmember("sample004.jpg")
    cut = member.offset_data + member.size // 2 if where == "data" else member.offset + 100
    shard.write_bytes(shard.read_bytes()[:cut])
    source = make_source({"kind": "webdataset", "path": str(wds_dir)})
    catalog = scan(source, ScanKnobs(workers=1))
    kept = [it.key for it in catalog.usable]
    assert kept == [f"shard-0000.tar:sample00{i}" for i in range(3)] + ["shard-0001.tar:sample003"]
    dropped = [(it.key, it.status) for it in catalog.items if it.status != "ok"]
    name = "sample004" if where == "data" else "after sample003"  # a cut header has no name
    assert dropped == [(f"shard-0001.tar:{name}", "truncated_tar")]
    assert name in dropped_rows(catalog)[0]["reason"]
    last = next(it for it in catalog.usable if it.key.endswith("sample003"))
    assert source.read(last.locator)[:2] == b"\xff\xd8"  # a JPEG, read by offset from the cut tar


def test_catalog_from_before_the_decode_fix_is_rescanned(photos, tmp_path):
    root = tmp_path / "ds"
    root.mkdir()
    (root / "bad.png").write_bytes(corrupt_idat(encoded(photos[1], "PNG")))
    source = make_source({"kind": "folder", "path": str(root)})
    scan(source, ScanKnobs(workers=1))
    cache = root / ".kohakumoss_catalog.json"
    old = json.loads(cache.read_text(encoding="utf-8"))
    old["version"] = 1  # what an older scan wrote: the broken PNG recorded as ok
    old["units"]["bad.png"]["items"][0].update(status="ok", reason="")
    cache.write_text(json.dumps(old), encoding="utf-8")
    again = scan(source, ScanKnobs(workers=1))
    assert again.report.units_read == 1
    assert [it.status for it in again.items] == ["corrupt"]


def test_jsonl_image_that_cannot_be_read_is_a_drop(jsonl_file, monkeypatch):
    real = Path.read_bytes

    def failing(path: Path) -> bytes:
        if path.name.startswith("p1."):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(Path, "read_bytes", failing)
    catalog = scan(make_source({"kind": "jsonl", "path": str(jsonl_file)}), ScanKnobs(workers=1))
    assert catalog.report.dropped == {"unreadable_file": 1}
    bad = next(it for it in catalog.items if it.status != "ok")
    assert "Permission denied" in bad.reason and bad.locator == "images/p1.jpg"

"""The scan survives any one bad entry: each is a named drop in the report (or, for a caption key no record
has, one refusal listing the keys found), never a crash, a hang or unbounded memory."""

from __future__ import annotations

import gzip
import io
import json
import os
import tarfile
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from kohakumoss_common.errors import DataError
from kohakumoss_data import ScanKnobs, make_source, scan
from kohakumoss_data.captions import MAX_CAPTION_BYTES
from kohakumoss_data.report import dropped_lines, write_dropped
from kohakumoss_data.sources.shards import ShardWriter

HANG_S = 30.0  # a scan that blocks (a FIFO opened for reading) fails the test instead of hanging it


def png(seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (80, 96, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def tar_bytes(members: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def good_folder(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "good.png").write_bytes(png())
    (root / "good.txt").write_text("a good caption")
    return root


def scan_bounded(spec: dict, tmp_path: Path):
    """scan() in a thread: a hang is a failure within HANG_S, not a stuck test run."""
    out: dict = {}

    def run() -> None:
        try:
            out["catalog"] = scan(
                make_source(spec), ScanKnobs(workers=2, min_side=32), cache_dir=tmp_path / "c"
            )
        except BaseException as e:
            out["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_S)
    assert not thread.is_alive(), "the scan hung"
    if "error" in out:
        raise out["error"]
    return out["catalog"]


def drops(catalog) -> dict[str, tuple[str, str]]:
    return {it.key: (it.status, it.reason) for it in catalog.items if it.status != "ok"}


def test_fifo_and_device_are_skipped_by_type_before_opening(tmp_path):
    root = good_folder(tmp_path / "ds")
    os.mkfifo(root / "pipe.png")  # opened for reading, it blocks until a writer comes: forever
    (root / "zero.jpg").symlink_to("/dev/zero")  # read whole, it never ends
    (root / "cap.png").write_bytes(png(1))
    os.mkfifo(root / "cap.txt")  # a FIFO sidecar is no caption, not a hang
    catalog = scan_bounded({"kind": "folder", "path": str(root)}, tmp_path)
    got = drops(catalog)
    assert got["pipe.png"][0] == "not_a_file" and "FIFO" in got["pipe.png"][1]
    assert got["zero.jpg"][0] == "not_a_file" and "character device" in got["zero.jpg"][1]
    assert sorted(it.key for it in catalog.usable) == ["cap.png", "good.png"]
    assert catalog.report.dropped == {"not_a_file": 2}


def test_names_that_are_not_utf8_are_named_drops(tmp_path):
    root = good_folder(tmp_path / "ds")
    base = os.fsencode(root)
    with open(base + b"/caf\xe9.png", "wb") as f:
        f.write(png(1))
    os.mkdir(base + b"/d\xff")
    with open(base + b"/d\xff/inner.png", "wb") as f:
        f.write(png(2))
    catalog = scan_bounded({"kind": "folder", "path": str(root)}, tmp_path)
    got = drops(catalog)
    assert got == {
        "caf\\xe9.png": ("name_not_utf8", "name 'caf\\xe9.png' is not valid UTF-8: rename it to train it"),
        "d\\xff": ("name_not_utf8", "name 'd\\xff' is not valid UTF-8: rename it to train it"),
    }
    assert [it.key for it in catalog.usable] == ["good.png"]
    dropped = tmp_path / "dropped.jsonl"  # the report's files take the names as they are printed
    write_dropped(dropped, catalog)
    assert {json.loads(line)["path"] for line in dropped.read_text().splitlines()} == set(got)
    assert "\n".join(dropped_lines(catalog)).encode("utf-8")


def test_a_kohya_repeats_folder_named_in_bytes_that_are_not_utf8_is_a_drop(tmp_path):
    root = tmp_path / "ds"
    good_folder(root / "2_good")
    os.mkdir(os.fsencode(root) + b"/3_b\xe4d")
    with open(os.fsencode(root) + b"/3_b\xe4d/x.png", "wb") as f:
        f.write(png(1))
    catalog = scan_bounded({"kind": "kohya", "path": str(root)}, tmp_path)
    assert drops(catalog) == {
        "3_b\\xe4d": ("name_not_utf8", "name '3_b\\xe4d' is not valid UTF-8: rename it to train it")
    }
    assert [it.key for it in catalog.usable] == ["2_good/good.png"]


def test_an_unreadable_subfolder_is_a_named_drop(tmp_path, monkeypatch):
    root = good_folder(tmp_path / "ds")
    good_folder(root / "locked")
    good_folder(root / "open")
    real_scandir = os.scandir

    def scandir(path="."):  # tests run as root, which chmod 000 does not stop: refuse one folder here
        if Path(path).name == "locked":
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    catalog = scan_bounded({"kind": "folder", "path": str(root)}, tmp_path)
    assert drops(catalog) == {
        "locked": (
            "unreadable_folder",
            "folder cannot be listed (PermissionError: Permission denied): its images are skipped",
        )
    }
    assert sorted(it.key for it in catalog.usable) == ["good.png", "open/good.png"]


def test_a_huge_caption_is_dropped_without_being_read_whole(tmp_path, monkeypatch):
    root = good_folder(tmp_path / "ds")
    (root / "big.png").write_bytes(png(1))
    (root / "big.txt").write_bytes(b"word " * (MAX_CAPTION_BYTES // 2))  # 2.5x the bound
    (root / "edge.png").write_bytes(png(2))
    (root / "edge.txt").write_bytes(b"x" * MAX_CAPTION_BYTES)  # at the bound: still a caption
    reads: list[int] = []
    real_open = open

    class Counted:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def read(self, n=-1):
            data = self.f.read(n)
            reads.append(len(data))
            return data

    def counting_open(path, mode="r", *args, **kwargs):
        f = real_open(path, mode, *args, **kwargs)
        return Counted(f) if str(path).endswith("big.txt") else f

    monkeypatch.setattr("builtins.open", counting_open)
    catalog = scan_bounded({"kind": "folder", "path": str(root)}, tmp_path)
    monkeypatch.undo()
    assert drops(catalog) == {
        "big.png": ("caption_too_large", "caption over 64 KiB (captions.MAX_CAPTION_BYTES): not a caption")
    }
    assert sum(reads) == MAX_CAPTION_BYTES + 1  # read to one byte past the bound, no further
    assert [it.captions for it in catalog.items if it.key == "edge.png"] == [["x" * MAX_CAPTION_BYTES]]


def test_a_huge_jsonl_caption_is_dropped(tmp_path):
    root = tmp_path / "j"
    root.mkdir()
    (root / "a.png").write_bytes(png())
    (root / "b.png").write_bytes(png(1))
    lines = [{"image": "a.png", "caption": "fine"}, {"image": "b.png", "caption": "w " * MAX_CAPTION_BYTES}]
    (root / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    catalog = scan_bounded({"kind": "jsonl", "path": str(root / "m.jsonl")}, tmp_path)
    assert {k: s for k, (s, _) in drops(catalog).items()} == {"2:b.png": "caption_too_large"}
    assert all(not it.captions for it in catalog.items if it.status != "ok")  # not kept in the catalog


def test_compressed_and_broken_webdataset_shards_are_named_in_the_scan(tmp_path):
    root = tmp_path / "wds"
    root.mkdir()
    plain = tar_bytes([("s1.png", png()), ("s1.txt", b"one")])
    (root / "a.tar").write_bytes(plain)
    (root / "b.tar.gz").write_bytes(gzip.compress(tar_bytes([("s2.png", png(1)), ("s2.txt", b"two")])))
    (root / "c.tar").write_bytes(b"not a tar at all " * 100)
    (root / "d.tar").write_bytes(gzip.compress(plain))  # compressed under a plain name
    catalog = scan_bounded({"kind": "webdataset", "path": str(root)}, tmp_path)
    got = drops(catalog)
    assert got["b.tar.gz"][0] == "compressed_tar" and got["b.tar.gz"][1].startswith("gzip-compressed tar")
    assert got["d.tar"][0] == "compressed_tar"
    assert got["c.tar:<header>"][0] == "truncated_tar"
    assert [it.key for it in catalog.usable] == ["a.tar:s1"]
    # a single compressed shard: named in the scan, so the run stops there (no usable item), not at a read
    alone = scan_bounded({"kind": "webdataset", "path": str(root / "b.tar.gz")}, tmp_path)
    assert [(it.key, it.status) for it in alone.items] == [("b.tar.gz", "compressed_tar")]


def test_a_webdataset_member_named_in_bytes_that_are_not_utf8_is_a_drop(tmp_path):
    root = tmp_path / "wds"
    root.mkdir()
    bad = b"b\xe9d".decode("utf-8", "surrogateescape")  # tarfile's reading of such a name
    (root / "a.tar").write_bytes(
        tar_bytes([("s1.png", png()), ("s1.txt", b"one"), (f"{bad}.png", png(1)), (f"{bad}.txt", b"two")])
    )
    catalog = scan_bounded({"kind": "webdataset", "path": str(root)}, tmp_path)
    assert {k: s for k, (s, _) in drops(catalog).items()} == {"a.tar:b\\xe9d": "name_not_utf8"}
    assert [it.key for it in catalog.usable] == ["a.tar:s1"]


def test_broken_parquet_and_shard_files_are_named_drops(tmp_path):
    root = tmp_path / "pq"
    root.mkdir()
    pq.write_table(pa.table({"image": [png()], "caption": ["one"]}), root / "a.parquet")
    (root / "b.parquet").write_bytes(b"PAR1 cut short PAR1")
    whole = (root / "a.parquet").read_bytes()
    (root / "c.parquet").write_bytes(whole[:8] + b"\0" * 64 + whole[-64:])  # a footer over garbled pages
    catalog = scan_bounded({"kind": "parquet", "path": str(root)}, tmp_path)
    got = drops(catalog)
    assert set(got) == {"b.parquet", "c.parquet"}
    assert all(
        s == "broken_parquet" and r.startswith("parquet file cannot be read (") for s, r in got.values()
    )
    assert [it.key for it in catalog.usable] == ["a.parquet:0"]

    shards = tmp_path / "shards"
    writer = ShardWriter(shards, items_per_shard=1)
    writer.add("k", Image.open(io.BytesIO(png())), ["one"])
    writer.close()
    (shards / "shard-00001.safetensors").write_bytes(b"\x10" + b"\0" * 7 + b"{garbled header")
    catalog = scan_bounded({"kind": "shards", "path": str(shards)}, tmp_path)
    assert {k: s for k, (s, _) in drops(catalog).items()} == {"shard-00001.safetensors": "broken_shard"}
    assert len(catalog.usable) == 1


def test_a_caption_key_no_record_has_is_refused_for_every_kind(tmp_path):
    """jsonl, parquet and webdataset alike: the key, and the keys that were found, named."""
    j = tmp_path / "j"
    j.mkdir()
    (j / "a.png").write_bytes(png())
    (j / "m.jsonl").write_text(json.dumps({"image": "a.png", "text": "hi"}) + "\n")
    with pytest.raises(
        DataError, match=r"m.jsonl: no line has the caption key 'caption'.*\['image', 'text'\]"
    ):
        scan_bounded({"kind": "jsonl", "path": str(j / "m.jsonl")}, tmp_path)
    uncaptioned = scan_bounded({"kind": "jsonl", "path": str(j / "m.jsonl"), "caption_key": ""}, tmp_path)
    assert [it.captions for it in uncaptioned.usable] == [[""]]  # on purpose: missing_caption 'empty'

    p = tmp_path / "p.parquet"
    pq.write_table(pa.table({"image": [png()], "text": ["hi"]}), p)
    with pytest.raises(
        DataError, match=r"no column 'caption' \(knob caption_column\); columns are \['image'"
    ):
        scan_bounded({"kind": "parquet", "path": str(p)}, tmp_path)

    w = tmp_path / "w"
    w.mkdir()
    (w / "a.tar").write_bytes(tar_bytes([("s1.png", png()), ("s1.caption", b"hi")]))
    with pytest.raises(DataError, match=r"a.tar: no sample has a '.txt' caption.*\['caption', 'png'\]"):
        scan_bounded({"kind": "webdataset", "path": str(w)}, tmp_path)
    ok = scan_bounded({"kind": "webdataset", "path": str(w), "caption_ext": "caption"}, tmp_path)
    assert [it.captions for it in ok.usable] == [["hi"]]


def test_an_image_key_no_record_has_is_refused_listing_the_keys_found(tmp_path):
    w = tmp_path / "w"
    w.mkdir()
    (w / "a.tar").write_bytes(tar_bytes([("s1.image", png()), ("s1.txt", b"hi")]))
    with pytest.raises(DataError, match=r"a.tar: no sample has an image ending in .*\['image', 'txt'\]"):
        scan_bounded({"kind": "webdataset", "path": str(w)}, tmp_path)
    ok = scan_bounded({"kind": "webdataset", "path": str(w), "image_exts": ["image"]}, tmp_path)
    assert [it.captions for it in ok.usable] == [["hi"]]

    j = tmp_path / "j"
    j.mkdir()
    (j / "m.jsonl").write_text(json.dumps({"file": "a.png", "caption": "hi"}) + "\n")
    with pytest.raises(
        DataError,
        match=r"m.jsonl:1: no 'image' field \(knob image_key\); the line's keys are \['caption', 'file'\]",
    ):
        scan_bounded({"kind": "jsonl", "path": str(j / "m.jsonl")}, tmp_path)


def test_a_scan_that_fails_midway_cancels_its_queued_probes(tmp_path, monkeypatch):
    """An error (or Ctrl-C) in the scan returns at once: queued probes are cancelled, not waited for
    (the pool's `with` ran every queued decode first, and one that blocked held the error forever)."""
    import kohakumoss_data.catalog as catalog_module

    root = tmp_path / "ds"
    root.mkdir()
    for i in range(6):
        (root / f"{i}.png").write_bytes(png(i))
    source = make_source({"kind": "folder", "path": str(root)})
    release, probed = threading.Event(), []
    real_probe = catalog_module.probe_raw

    def held_probe(raw, unit, max_pixels):
        probed.append(raw.key)
        release.wait(60)  # a decode that does not return (a read on a hung mount)
        return real_probe(raw, unit, max_pixels)

    def failing_expand(unit_ids):
        for unit_id in unit_ids[:5]:
            yield from source.expand(unit_id)
        raise DataError("the source failed midway")

    monkeypatch.setattr(catalog_module, "probe_raw", held_probe)
    monkeypatch.setattr(source, "expand_units", failing_expand)
    out: dict = {}

    def run() -> None:
        try:
            scan(source, ScanKnobs(workers=2), cache_dir=tmp_path / "c")
        except DataError as e:
            out["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_S)
    returned = not thread.is_alive()
    release.set()
    assert returned, "the failed scan waited on its queued probes"
    assert "failed midway" in str(out["error"])
    assert len(probed) <= 2  # the two running probes; the three queued were cancelled


def test_a_caption_extension_no_image_has_is_refused_when_captions_sit_under_another(tmp_path):
    root = tmp_path / "ds"
    root.mkdir()
    for i in range(2):
        (root / f"{i}.png").write_bytes(png(i))
        (root / f"{i}.tags").write_text("tag, other tag")
    with pytest.raises(DataError, match=r"caption files beside them end in \['.tags'\]"):
        scan_bounded({"kind": "folder", "path": str(root)}, tmp_path)
    ok = scan_bounded({"kind": "folder", "path": str(root), "caption_extension": ".tags"}, tmp_path)
    assert [it.captions for it in ok.usable] == [["tag, other tag"]] * 2
    bare = tmp_path / "bare"  # images with no caption file at all: an uncaptioned dataset, not refused
    bare.mkdir()
    (bare / "a.png").write_bytes(png())
    (bare / "a.npz").write_bytes(b"kohya's cached latents")
    assert [it.captions for it in scan_bounded({"kind": "folder", "path": str(bare)}, tmp_path).usable] == [
        [""]
    ]


def test_a_huge_caption_in_a_catalog_cached_before_the_bound_is_dropped_too(tmp_path, monkeypatch):
    import kohakumoss_data.captions as captions_module
    import kohakumoss_data.catalog as catalog_module
    import kohakumoss_data.sources.files as files_module

    root = good_folder(tmp_path / "ds")
    (root / "big.png").write_bytes(png(1))
    (root / "big.txt").write_text("word " * (MAX_CAPTION_BYTES // 4))  # 1.25x the bound
    unbounded = 1 << 30
    for module in (captions_module, catalog_module, files_module):  # a scan from before the bound
        monkeypatch.setattr(module, "MAX_CAPTION_BYTES", unbounded)
    assert len(scan_bounded({"kind": "folder", "path": str(root)}, tmp_path).usable) == 2
    monkeypatch.undo()
    catalog = scan_bounded({"kind": "folder", "path": str(root)}, tmp_path)
    assert catalog.report.units_read == 0  # every unit reused from the cache, and still bounded
    assert {k: s for k, (s, _) in drops(catalog).items()} == {"big.png": "caption_too_large"}


def test_a_dataset_folder_named_in_bytes_that_are_not_utf8_scans(tmp_path):
    root = Path(os.fsdecode(os.fsencode(tmp_path) + b"/d\xe9s"))
    good_folder(root)
    catalog = scan_bounded({"kind": "folder", "path": str(root)}, tmp_path)  # its catalog under cache_dir
    assert [it.key for it in catalog.usable] == ["good.png"]
    assert catalog.fingerprint()


def test_a_fifo_in_a_manifest_or_put_in_place_after_the_scan_is_never_opened(tmp_path):
    root = tmp_path / "j"
    root.mkdir()
    (root / "a.png").write_bytes(png())
    os.mkfifo(root / "b.png")
    lines = [{"image": "a.png", "caption": "one"}, {"image": "b.png", "caption": "two"}]
    (root / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    catalog = scan_bounded({"kind": "jsonl", "path": str(root / "m.jsonl")}, tmp_path)
    assert {k: s for k, (s, _) in drops(catalog).items()} == {"2:b.png": "not_a_file"}

    folder = good_folder(tmp_path / "ds")
    source = make_source({"kind": "folder", "path": str(folder)})
    (folder / "good.png").unlink()
    os.mkfifo(folder / "good.png")  # the loader's read of a scanned image that is now a FIFO
    out: dict = {}

    def read() -> None:
        try:
            source.read("good.png")
        except DataError as e:
            out["error"] = str(e)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(HANG_S)
    assert not thread.is_alive(), "the read opened the FIFO and blocked"
    assert out["error"].endswith("good.png: not a regular file (a FIFO): skipped without opening it")

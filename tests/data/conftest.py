"""Datasets for the data tests, built from downscaled Debian wallpapers (package gnome-backgrounds)."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from .helpers import (
    APT_HINT,
    SIZES,
    WALLPAPERS,
    caption_for,
    encoded,
    make_broken,
    wallpaper_files,
    write_photo,
)


@pytest.fixture(scope="session")
def photos() -> list[Image.Image]:
    """Eight real wallpapers, decoded once, shrunk and cropped to varied aspect ratios."""
    files = [f for f in wallpaper_files() if Image.open(f).width >= 1024]
    if len(files) < len(SIZES):
        pytest.skip(f"needs real photos under {WALLPAPERS}; {APT_HINT}")
    out = []
    for file, (w, h) in zip(files, SIZES):
        image = Image.open(file).convert("RGB")
        image.thumbnail((max(w, h), max(w, h)), Image.Resampling.LANCZOS)
        left, top = (image.width - w) // 2, (image.height - h) // 2
        out.append(image.crop((left, top, left + w, top + h)))
    return out


@pytest.fixture(scope="session")
def kohya_dir(photos, tmp_path_factory) -> Path:
    """`3_wall` (repeats 3, JPEG/PNG/WEBP with .txt captions) and `1_misc` (a .caption sidecar)."""
    root = tmp_path_factory.mktemp("kohya")
    fmts = ["JPEG", "PNG", "WEBP"]
    for i, image in enumerate(photos[:6]):
        write_photo(root / "3_wall", f"img{i}", image, caption_for(i), fmts[i % 3])
    write_photo(root / "1_misc", "other", photos[6], None)
    (root / "1_misc" / "other.caption").write_text("caption from a .caption file", encoding="utf-8")
    (root / "notes").mkdir()  # not <repeats>_<name>: ignored
    return root


@pytest.fixture
def folder_dir(photos, tmp_path) -> tuple[Path, dict[str, str]]:
    """A plain recursive folder: good photos in two levels plus every broken file."""
    root = tmp_path / "folder"
    for i, image in enumerate(photos[:4]):
        write_photo(root / ("sub" if i % 2 else ""), f"good{i}", image, caption_for(i))
    expected = make_broken(root / "broken", photos[4])
    return root, expected


@pytest.fixture
def jsonl_file(photos, tmp_path) -> Path:
    images = tmp_path / "images"
    lines = []
    for i, image in enumerate(photos[:5]):
        write_photo(images, f"p{i}", image, None)
        caption = [caption_for(i), f"alt caption {i}"] if i == 0 else caption_for(i)
        lines.append({"image": f"images/p{i}.jpg", "caption": caption, "score": i})
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


@pytest.fixture
def parquet_file(photos, tmp_path) -> Path:
    table = pa.table(
        {
            "jpg": [encoded(p, "JPEG") for p in photos[:5]],
            "text": [caption_for(i) for i in range(5)],
        }
    )
    path = tmp_path / "data.parquet"
    pq.write_table(table, path, row_group_size=2)
    return path


@pytest.fixture
def wds_dir(photos, tmp_path) -> Path:
    root = tmp_path / "wds"
    root.mkdir()
    for shard in range(2):
        with tarfile.open(root / f"shard-{shard:04d}.tar", "w") as tf:
            for i in range(3):
                n = shard * 3 + i
                for ext, data in (("jpg", encoded(photos[n], "JPEG")), ("txt", caption_for(n).encode())):
                    info = tarfile.TarInfo(f"sample{n:03d}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
    return root


@pytest.fixture
def kohya_copy(kohya_dir, tmp_path) -> Path:
    """A private copy (tests that add files or write catalogs must not touch the shared one)."""
    dst = tmp_path / "kohya"
    shutil.copytree(kohya_dir, dst)
    return dst

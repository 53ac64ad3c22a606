"""Broken cache shards: cut short, garbled header, flipped bytes. Named, set aside, encoded again."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from kohakumoss_data import (
    Loader,
    LoaderKnobs,
    PlanKnobs,
    ScanKnobs,
    build_plan,
    make_source,
    open_caches,
    scan,
)
from kohakumoss_data.cache import TensorCache

from .fakes import FakeTextEncoder, FakeVAE

IDENTITY = {"kind": "latent", "vae": "test"}


@pytest.fixture
def log_lines(caplog):
    root = logging.getLogger("kohakumoss")  # the project's logger does not propagate to the root one
    root.addHandler(caplog.handler)
    yield caplog
    root.removeHandler(caplog.handler)


def filled(root: Path, n: int = 6) -> tuple[dict[str, torch.Tensor], Path]:
    cache = TensorCache(root, IDENTITY, shard_items=100)
    entries = {f"k{i}": torch.randn(4, 3, 5).to(torch.bfloat16) for i in range(n)}
    for key, t in entries.items():
        cache.put(key, t)
    return entries, cache.flush()


def cut(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 7])


def garble_header(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[10:20] = b"\xff" * 10
    path.write_bytes(bytes(data))


def flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x5A  # inside the last entry's bytes: sizes and header still agree
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("fault", "said"),
    [(cut, "cut short"), (garble_header, "header"), (flip_last_byte, "differs from its checksum")],
)
def test_a_broken_shard_is_named_and_set_aside(tmp_path, log_lines, fault, said):
    entries, shard = filled(tmp_path)
    fault(shard)
    cache = TensorCache(tmp_path, IDENTITY)
    got = {k: cache.get(k) for k in entries}  # never a raw error
    assert all(v is None for v in got.values()) or fault is flip_last_byte
    assert not shard.exists() and shard.with_name(shard.name + ".broken").exists()
    assert f"{shard}: broken cache shard" in log_lines.text and said in log_lines.text
    assert len(TensorCache(tmp_path, IDENTITY)) == 0  # a fresh index no longer lists its entries


def test_an_intact_shard_reads_back_exactly(tmp_path):
    entries, _ = filled(tmp_path)
    cache = TensorCache(tmp_path, IDENTITY)
    assert all(torch.equal(cache.get(k), t) for k, t in entries.items())


def test_the_loader_encodes_the_entries_of_a_broken_shard_again(kohya_dir, tmp_path, log_lines):
    source = make_source({"kind": "kohya", "path": str(kohya_dir)})
    catalog = scan(source, ScanKnobs(workers=1), cache_dir=tmp_path / "catalogs")
    plan = build_plan(catalog, 3, PlanKnobs(area=128 * 128, tokens_per_step=200, epochs=1))
    vae, text = FakeVAE(), FakeTextEncoder()

    def run(workers: int) -> list:
        latents, texts = open_caches(str(tmp_path / "cache"), vae, text)
        return list(Loader(plan, catalog, source, vae, text, latents, texts, LoaderKnobs(workers=workers)))

    first = run(0)
    encoded, captions = vae.images_encoded, text.captions_encoded
    for shard in (tmp_path / "cache").rglob("*.safetensors"):
        flip_last_byte(shard)  # both the latent and the text shard
    again = run(2)
    assert vae.images_encoded > encoded and text.captions_encoded > captions
    for a, b in zip(first, again):
        assert all(torch.equal(x, y) for x, y in zip(a.latents, b.latents))
        assert torch.equal(a.text_hidden, b.text_hidden)
    assert "broken cache shard" in log_lines.text
    assert len(list((tmp_path / "cache").rglob("*.broken"))) == 2

"""Edit training's reference images: found per source kind, named when missing or unreadable, planned at
the target's area (a pure plan), cached like targets and carried by the batch per sample."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from kohakumoss_common.errors import DataError
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
from kohakumoss_data.cache_keys import item_latent_keys
from kohakumoss_data.offline import fill_latent_cache
from kohakumoss_data.probe import BAD_REFERENCE, MISSING_REFERENCE

from .fakes import FakeVAE

KNOBS = PlanKnobs(area=64 * 64, tokens_per_step=100, flip_prob=0.5, epochs=2)


def png(size: tuple[int, int], seed: int) -> bytes:
    """A small PNG of noise: `size` is (width, height); each seed its own content."""
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def scanned(spec: dict, tmp_path: Path):
    source = make_source(spec)
    return source, scan(source, ScanKnobs(workers=1, min_side=32), cache_dir=tmp_path / "catalogs")


def refs_of(catalog) -> dict[str, list[str]]:
    return {it.key: [Path(r["name"]).name for r in it.references] for it in catalog.usable}


def drops(catalog) -> dict[str, tuple[str, str]]:
    return {it.key: (it.status, it.reason) for it in catalog.items if it.status != "ok"}


@pytest.fixture
def kohya_refs(tmp_path) -> tuple[Path, Path]:
    """`2_edit/` targets a, a_1, b, c, d (with captions) and `refs/2_edit/` their references."""
    root, refs = tmp_path / "kohya", tmp_path / "refs"
    for i, stem in enumerate(["a", "a_1", "b", "c", "d"]):
        write(root / "2_edit" / f"{stem}.png", png((96, 64), i))
        (root / "2_edit" / f"{stem}.txt").write_text(f"make it {stem}")
    sub = refs / "2_edit"
    write(sub / "a_10.png", png((64, 64), 10))
    write(sub / "a.jpg", png((80, 64), 11))  # a PNG named .jpg decodes all the same
    write(sub / "a_2.png", png((64, 96), 12))
    write(sub / "a_1.png", png((64, 64), 13))  # a_1 is a target of its own: its reference, not a's third
    write(sub / "b_1.webp", png((64, 64), 14))
    (sub / "d.png").write_text("not an image")
    return root, refs


def test_kohya_references_match_by_stem_in_order(kohya_refs, tmp_path):
    root, refs = kohya_refs
    _, catalog = scanned({"kind": "kohya", "path": str(root), "references": str(refs)}, tmp_path)
    assert refs_of(catalog) == {
        "2_edit/a.png": ["a.jpg", "a_2.png", "a_10.png"],  # the stem, then _n by n (2 before 10)
        "2_edit/a_1.png": ["a_1.png"],
        "2_edit/b.png": ["b_1.webp"],
    }
    status, reason = drops(catalog)["2_edit/c.png"]
    assert status == MISSING_REFERENCE and f"{refs / '2_edit' / 'c'}.<ext>" in reason
    status, reason = drops(catalog)["2_edit/d.png"]
    assert status == BAD_REFERENCE and str(refs / "2_edit" / "d.png") in reason
    assert catalog.report.dropped == {BAD_REFERENCE: 1, MISSING_REFERENCE: 1}


def test_the_cached_catalog_is_the_last_scans_without_probing(kohya_refs, tmp_path, monkeypatch):
    """`cached_catalog` reads what the last scan left (what the memory estimate counts references from:
    the most any usable item has, 3 here, dropped items aside); None before any scan."""
    from kohakumoss_data import catalog as catalog_module

    root, refs = kohya_refs
    spec = {"kind": "kohya", "path": str(root), "references": str(refs)}
    knobs = ScanKnobs(workers=1, min_side=32)
    assert catalog_module.cached_catalog(make_source(spec), knobs, cache_dir=tmp_path / "catalogs") is None
    _, catalog = scanned(spec, tmp_path)
    monkeypatch.setattr(catalog_module, "probe_raw", lambda *a: pytest.fail("probed a file"))
    cached = catalog_module.cached_catalog(make_source(spec), knobs, cache_dir=tmp_path / "catalogs")
    assert [(it.key, it.status, it.references) for it in cached.items] == [
        (it.key, it.status, it.references) for it in catalog.items
    ]
    assert cached.most_references == catalog.most_references == 3


def test_folder_references_mirror_sub_folders_and_rescan_on_change(tmp_path):
    root, refs = tmp_path / "ds", tmp_path / "refs"
    write(root / "x.png", png((64, 64), 0))
    write(root / "sub" / "y.png", png((64, 64), 1))
    write(refs / "x.png", png((64, 64), 2))
    write(refs / "sub" / "y_1.png", png((64, 64), 3))
    spec = {"kind": "folder", "path": str(root), "references": str(refs)}
    _, catalog = scanned(spec, tmp_path)
    assert refs_of(catalog) == {"x.png": ["x.png"], "sub/y.png": ["y_1.png"]}
    before = catalog.fingerprint()
    write(refs / "sub" / "y_1.png", png((64, 64), 4))  # new content, same name
    os.utime(refs / "sub" / "y_1.png", ns=(1, 1))
    _, again = scanned(spec, tmp_path)
    assert again.report.units_read == 1 and again.fingerprint() != before


def test_a_references_folder_missing_or_inside_the_dataset_is_refused(tmp_path):
    write(tmp_path / "ds" / "x.png", png((64, 64), 0))
    with pytest.raises(DataError, match="references folder .*nowhere does not exist"):
        make_source({"kind": "folder", "path": str(tmp_path / "ds"), "references": str(tmp_path / "nowhere")})
    write(tmp_path / "ds" / "refs" / "x.png", png((64, 64), 1))
    with pytest.raises(DataError, match="is inside the dataset, so its images would be trained as targets"):
        make_source(
            {"kind": "folder", "path": str(tmp_path / "ds"), "references": str(tmp_path / "ds" / "refs")}
        )


def test_jsonl_references_field_one_path_or_a_list(tmp_path):
    for i, name in enumerate(["t0", "t1", "t2", "t3", "r0", "r1", "r2"]):
        write(tmp_path / "img" / f"{name}.png", png((64, 64), i))
    lines = [
        {"image": "img/t0.png", "caption": "one", "refs": "img/r0.png"},
        {"image": "img/t1.png", "caption": "two", "refs": ["img/r2.png", "img/r1.png"]},
        {"image": "img/t2.png", "caption": "none"},
        {"image": "img/t3.png", "caption": "gone", "refs": ["img/r1.png", "img/gone.png"]},
    ]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(x) + "\n" for x in lines))
    _, catalog = scanned({"kind": "jsonl", "path": str(manifest), "references": "refs"}, tmp_path)
    assert refs_of(catalog) == {"1:img/t0.png": ["r0.png"], "2:img/t1.png": ["r2.png", "r1.png"]}
    assert drops(catalog)["3:img/t2.png"] == (
        MISSING_REFERENCE,
        f"{manifest}:3: no 'refs' field (option references)",
    )
    status, reason = drops(catalog)["4:img/t3.png"]
    assert status == MISSING_REFERENCE and "reference 2" in reason and "gone.png" in reason
    assert "refs" not in catalog.usable[0].extra  # the field is the references', not an extra


def test_parquet_references_column_of_image_structs(tmp_path):
    write(tmp_path / "r.png", png((64, 64), 9))
    table = pa.table(
        {
            "image": [png((64, 64), i) for i in range(3)],
            "caption": ["a", "b", "c"],
            "refs": [  # Hugging Face's image structs: bytes, or a path under image_root
                [{"bytes": png((64, 80), 5), "path": None}],
                [{"bytes": None, "path": "r.png"}, {"bytes": png((64, 64), 6), "path": None}],
                [],
            ],
        }
    )
    pq.write_table(table, tmp_path / "d.parquet")
    spec = {"kind": "parquet", "path": str(tmp_path / "d.parquet"), "references": "refs"}
    source, catalog = scanned(spec, tmp_path)
    assert [len(it.references) for it in catalog.usable] == [1, 2]
    assert drops(catalog)["d.parquet:2"][0] == MISSING_REFERENCE
    second = catalog.usable[1].references
    assert source.read_reference(second[0]["locator"]) == (tmp_path / "r.png").read_bytes()
    assert source.read_reference(second[1]["locator"]) == png((64, 64), 6)
    with pytest.raises(DataError, match="no column 'nope' \\(knob references\\)"):
        make_source({**spec, "references": "nope"})


def test_webdataset_references_name_members_of_the_sample(tmp_path):
    members = []
    for i, refs in enumerate([["ref1.png"], ["ref1.png", "ref2.png"], ["missing.png"], None]):
        members += [(f"s{i}.png", png((64, 64), i)), (f"s{i}.txt", b"caption")]
        if refs is not None:
            members.append((f"s{i}.json", json.dumps({"refs": refs}).encode()))
        members += [(f"s{i}.ref1.png", png((64, 64), 10 + i)), (f"s{i}.ref2.png", png((64, 64), 20 + i))]
    tar = tmp_path / "wds" / "shard.tar"
    tar.parent.mkdir()
    with tarfile.open(tar, "w") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    source, catalog = scanned({"kind": "webdataset", "path": str(tar.parent), "references": "refs"}, tmp_path)
    assert refs_of(catalog) == {
        "shard.tar:s0": ["s0.ref1.png"],
        "shard.tar:s1": ["s1.ref1.png", "s1.ref2.png"],
    }
    assert drops(catalog)["shard.tar:s2"][0] == MISSING_REFERENCE
    assert "s2.missing.png does not exist" in drops(catalog)["shard.tar:s2"][1]
    assert drops(catalog)["shard.tar:s3"] == (
        MISSING_REFERENCE,
        f"{tar}: s3.json: no 'refs' field (option references)",
    )
    assert source.read_reference(catalog.usable[1].references[1]["locator"]) == png((64, 64), 21)


def test_the_plan_is_pure_and_sizes_references_at_the_target_area(kohya_refs, tmp_path):
    root, refs = kohya_refs
    spec = {"kind": "kohya", "path": str(root), "references": str(refs)}
    _, catalog = scanned(spec, tmp_path)
    plan = build_plan(catalog, 7, KNOBS)
    _, again = scanned(spec, tmp_path / "other")  # a fresh scan of the same files: the same bytes
    assert build_plan(again, 7, KNOBS).to_bytes() == plan.to_bytes()
    items = [it for step in plan.steps for it in step]
    by_key = {it.key: it for it in items}
    a = by_key["2_edit/a.png"]
    assert a.target == (64, 48)  # 96x64 px in a 64x64 budget
    # each reference at about 64x48 px of area, its own aspect, sides rounded to 16 px
    assert [r.target for r in a.references] == [(64, 48), (48, 64), (48, 48)]
    assert all(r.target[0] % 16 == 0 and r.target[1] % 16 == 0 for r in a.references)
    assert a.tokens == a.image_tokens + a.text_tokens + sum(r.tokens for r in a.references)
    assert a.reference_tokens == 12 + 12 + 9
    # a reference's content is part of the plan: a changed file changes the catalog and the plan
    write(refs / "2_edit" / "b_1.webp", png((64, 64), 99))
    _, changed = scanned(spec, tmp_path)
    assert build_plan(changed, 7, KNOBS).sha256 != plan.sha256


def test_reference_latents_round_trip_through_the_cache(kohya_refs, tmp_path):
    root, refs = kohya_refs
    source, catalog = scanned({"kind": "kohya", "path": str(root), "references": str(refs)}, tmp_path)
    plan = build_plan(catalog, 3, KNOBS)
    vae = FakeVAE()
    cache, _ = open_caches(str(tmp_path / "cache"), vae, None)
    report = fill_latent_cache(plan, catalog, source, vae, cache, workers=0, progress=False)
    wanted = {k for step in plan.steps for it in step for k in item_latent_keys(it, vae.identity)}
    assert report.total == len(wanted) and all(k in cache for k in wanted)

    def batches(encoder, latent_cache):
        loader = Loader(
            plan, catalog, source, encoder, latent_cache=latent_cache, knobs=LoaderKnobs(workers=0)
        )
        return list(loader)

    fresh = FakeVAE()
    online = batches(fresh, None)
    cached_vae = FakeVAE()
    reloaded, _ = open_caches(str(tmp_path / "cache"), cached_vae, None)
    cached = batches(cached_vae, reloaded)
    assert cached_vae.images_encoded == 0  # every target and reference came from the cache
    for a, b in zip(online, cached):
        assert b.references is not None and b.reference_pixels is None
        for i in range(len(b.keys)):
            planned = plan.steps[b.step][i]
            assert b.reference_sizes[i] == [r.target for r in planned.references]
            assert len(b.references[i]) == len(planned.references) > 0
            for lat, (w, h) in zip(b.references[i], b.reference_sizes[i]):
                assert lat.shape == (32, h // 8, w // 8)
            assert all(torch.equal(x, y) for x, y in zip(a.references[i], b.references[i]))
    assert sum(len(r) for b in cached for r in b.references) > len(cached)  # a has three


def test_without_an_image_encoder_the_batch_carries_reference_pixels(kohya_refs, tmp_path):
    root, refs = kohya_refs
    source, catalog = scanned({"kind": "kohya", "path": str(root), "references": str(refs)}, tmp_path)
    plan = build_plan(catalog, 3, dataclasses.replace(KNOBS, flip_prob=1.0, epochs=1))
    batch = next(iter(Loader(plan, catalog, source, knobs=LoaderKnobs(workers=0))))
    first = plan.steps[0][0]
    pixels = batch.reference_pixels[0][0]
    assert batch.references is None and pixels.dtype == torch.uint8
    assert pixels.shape == (3, first.references[0].target[1], first.references[0].target[0])
    # flipped with its target: the reference's planned pixels, mirrored
    ref = next(it for it in catalog.usable if it.key == first.key).references[0]
    image = Image.open(io.BytesIO(source.read_reference(ref["locator"]))).convert("RGB")
    plain = np.asarray(image.resize(first.references[0].resize, Image.Resampling.LANCZOS, reducing_gap=3.0))
    x, y = first.references[0].crop
    w, h = first.references[0].target
    want = plain[y : y + h, x : x + w][:, ::-1]
    assert np.array_equal(pixels.permute(1, 2, 0).numpy(), want)


def test_a_plan_without_references_is_unchanged(kohya_refs, tmp_path):
    """A dataset with no references plans and batches as before: no field, no tokens, None in the batch."""
    source, catalog = scanned({"kind": "kohya", "path": str(kohya_refs[0])}, tmp_path)
    assert len(catalog.usable) == 5 and "references" not in catalog.source
    plan = build_plan(catalog, 1, dataclasses.replace(KNOBS, area=128 * 128, tokens_per_step=300, epochs=1))
    assert all(
        it.references == () and it.tokens == it.image_tokens + it.text_tokens for s in plan.steps for it in s
    )
    # the bytes (and resume digests) of such a plan are those of a plan made before references existed
    assert b'"references"' not in plan.to_bytes() and b'"caption_format"' not in plan.to_bytes()
    wrapped = build_plan(catalog, 1, dataclasses.replace(KNOBS, caption_format="auto-json"))
    assert b'"caption_format":"auto-json"' in wrapped.to_bytes()
    batch = next(iter(Loader(plan, catalog, source, knobs=LoaderKnobs(workers=0))))
    assert batch.references is None and batch.reference_pixels is None and batch.reference_sizes is None
    assert batch.reference_tokens == [0] * len(batch.keys)


def test_cache_latents_script_caches_the_references(kohya_refs, tmp_path, capsys):
    from .test_scripts import ScriptFailed, kogine

    root, refs = kohya_refs
    config = tmp_path / "data_cfg.py"
    config.write_text(
        f"DATASET = {{'kind': 'kohya', 'path': {str(root)!r}, 'references': {str(refs)!r}}}\n"
        f"CATALOG_DIR = {str(tmp_path / 'catalogs')!r}\nMIN_SIDE = 32\n"
        "AREA = 64 * 64\nTOKENS_PER_STEP = 100\nFLIP_PROB = 0.5\nSEED = 5\nEPOCHS = 2\n"
        f"CACHE_DIR = {str(tmp_path / 'cache')!r}\nWORKERS = 0\n"
        "VAE_FACTORY = 'tests.data.fakes:make_vae'\nVAE_KWARGS = {}\n"
    )
    source, catalog = scanned({"kind": "kohya", "path": str(root), "references": str(refs)}, tmp_path / "own")
    plan = build_plan(
        catalog, 5, dataclasses.replace(KNOBS, area=64 * 64, tokens_per_step=100, flip_prob=0.5)
    )
    keys = {k for step in plan.steps for it in step for k in item_latent_keys(it, "fake-vae-1")}
    out = kogine(capsys, "cache_latents.py", config)
    assert f"latents: {len(keys)} planned, 0 already cached, {len(keys)} encoded" in out
    again = kogine(capsys, "cache_latents.py", config)
    assert f"latents: {len(keys)} planned, {len(keys)} already cached, 0 encoded" in again
    with pytest.raises(ScriptFailed, match="reference images .*which shards do not hold"):
        kogine(capsys, "convert_shards.py", config, f"OUT_DIR={tmp_path / 'shards'}")

"""Loader workers and caches: worker-count independence, exact resume, cache hits and identity misses."""

from __future__ import annotations

import pytest
import torch

from kohakumoss_data import (
    Loader,
    LoaderKnobs,
    PlanKnobs,
    ScanKnobs,
    build_plan,
    latent_key,
    make_source,
    open_caches,
    scan,
)

from .fakes import FakeTextEncoder, FakeVAE

KNOBS = PlanKnobs(area=128 * 128, tokens_per_step=200, crop="random", flip_prob=0.5, epochs=1)


@pytest.fixture
def dataset(kohya_dir, tmp_path):
    source = make_source({"kind": "kohya", "path": str(kohya_dir)})
    catalog = scan(source, ScanKnobs(workers=2), cache_dir=tmp_path / "catalogs")
    return source, catalog, build_plan(catalog, 3, KNOBS)


def _run(dataset, workers, start=0, vae=None, text=None, cache_dir=None, write_back=True):
    source, catalog, plan = dataset
    latents, texts = open_caches(cache_dir, vae, text)
    loader = Loader(
        plan,
        catalog,
        source,
        vae,
        text,
        latents,
        texts,
        LoaderKnobs(workers=workers, prefetch_steps=2, write_back=write_back),
        start_step=start,
    )
    return list(loader)


def _same(a, b):
    assert [x.step for x in a] == [y.step for y in b]
    for x, y in zip(a, b):
        assert x.keys == y.keys and x.sizes == y.sizes and x.captions == y.captions
        for name in ("pixels", "latents"):
            xs, ys = getattr(x, name), getattr(y, name)
            assert (xs is None) == (ys is None)
            for p, q in zip(xs or [], ys or []):
                assert torch.equal(p, q)
        if x.text_hidden is not None:
            assert torch.equal(x.text_hidden, y.text_hidden) and torch.equal(x.text_lengths, y.text_lengths)


def test_pixels_match_plan_and_are_independent_of_workers(dataset):
    _, _, plan = dataset
    one, three = _run(dataset, 1), _run(dataset, 3)
    assert len(one) == len(plan.steps) > 3
    _same(one, three)
    _same(one, _run(dataset, 0))
    for batch in one:
        for pixels, (w, h) in zip(batch.pixels, batch.sizes):
            assert pixels.dtype == torch.uint8 and tuple(pixels.shape) == (3, h, w)


def test_resume_at_step_k_equals_uninterrupted(dataset):
    full = _run(dataset, 2)
    k = len(full) // 2
    _same(full[k:], _run(dataset, 2, start=k))


def test_encoders_caches_and_identity(dataset, tmp_path):
    cache = tmp_path / "cache"
    vae, text = FakeVAE(), FakeTextEncoder()
    first = _run(dataset, 2, vae=vae, text=text, cache_dir=cache)
    n_items = sum(len(b.keys) for b in first)
    unique = len({latent_key(it, vae.identity) for step in dataset[2].steps for it in step})
    assert vae.images_encoded == unique < n_items  # repeats with the same crop and flip hit the write-back
    assert text.captions_encoded == len({c for b in first for c in b.captions})
    assert all(
        tuple(lat.shape) == (32, h // 8, w // 8) for b in first for lat, (w, h) in zip(b.latents, b.sizes)
    )
    assert all(b.text_hidden.shape[0] == int(b.text_lengths.sum()) for b in first)

    vae2, text2 = FakeVAE(), FakeTextEncoder()
    second = _run(dataset, 3, vae=vae2, text=text2, cache_dir=cache)
    assert vae2.images_encoded == 0 and text2.captions_encoded == 0  # everything came from the cache
    assert sum(b.hits["latent"] for b in second) == n_items
    _same(first, second)

    other_vae = FakeVAE(identity="fake-vae-2")
    _run(dataset, 1, vae=other_vae, text=FakeTextEncoder(), cache_dir=cache)
    assert other_vae.images_encoded == unique  # another VAE never reads this cache

    templated = FakeTextEncoder(template="photo: {}")
    _run(dataset, 1, vae=FakeVAE(), text=templated, cache_dir=cache)
    assert templated.captions_encoded > 0  # a new template misses the text cache


def test_no_write_back_leaves_cache_empty(dataset, tmp_path):
    _run(dataset, 1, vae=FakeVAE(), text=FakeTextEncoder(), cache_dir=tmp_path / "c", write_back=False)
    vae = FakeVAE()
    _run(dataset, 1, vae=vae, cache_dir=tmp_path / "c")
    assert vae.images_encoded > 0


def test_plan_from_another_catalog_is_refused(dataset, tmp_path, photos):
    from kohakumoss_common.errors import DataError

    from .helpers import write_photo

    source, catalog, plan = dataset
    other_root = tmp_path / "other"
    write_photo(other_root, "x", photos[0], "x")
    other = scan(make_source({"kind": "folder", "path": str(other_root)}))
    with pytest.raises(DataError, match="another catalog"):
        Loader(plan, other, source)


def test_spawned_workers_give_the_same_batches(dataset):
    """Windows and macOS start workers by spawn: the source and caches must pickle."""
    source, catalog, plan = dataset
    spawn = Loader(plan, catalog, source, knobs=LoaderKnobs(workers=1, start_method="spawn"))
    _same(_run(dataset, 0)[:2], list(spawn)[:2])


def test_stopping_early_and_a_vanished_file(dataset, kohya_copy, tmp_path):
    from kohakumoss_common.errors import DataError

    source, catalog, plan = dataset
    for batch in Loader(plan, catalog, source, knobs=LoaderKnobs(workers=2)):
        assert batch.step == 0
        break  # the feeder thread and the workers stop without hanging
    copy = make_source({"kind": "kohya", "path": str(kohya_copy)})
    copy_catalog = scan(copy, cache_dir=tmp_path / "c2")
    copy_plan = build_plan(copy_catalog, 3, KNOBS)
    (kohya_copy / copy_plan.steps[1][0].key).write_bytes(b"gone")
    with pytest.raises(DataError, match=copy_plan.steps[1][0].key):
        list(Loader(copy_plan, copy_catalog, copy, knobs=LoaderKnobs(workers=1)))

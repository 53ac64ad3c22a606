"""The planner: sizes, buckets, token budgets, and byte-identical plans from (catalog, seed, knobs)."""

from __future__ import annotations

import math

import pytest

from kohakumoss_common.errors import ConfigError
from kohakumoss_data import PlanKnobs, ScanKnobs, build_plan, make_source, scan
from kohakumoss_data.buckets import kohya_buckets, nearest_bucket
from kohakumoss_data.packing import pack_steps
from kohakumoss_data.resolution import cover_size, target_size


@pytest.mark.parametrize(
    "size", [(4000, 3000), (1000, 1000), (640, 480), (3000, 500), (500, 3000), (777, 555)]
)
@pytest.mark.parametrize("no_upscale", [False, True])
def test_target_size_rules(size, no_upscale):
    w, h = size
    tw, th = target_size(
        w, h, area=1024 * 1024, multiple=16, min_aspect=0.25, max_aspect=4.0, no_upscale=no_upscale
    )
    assert tw % 16 == 0 and th % 16 == 0 and tw * th <= 1024 * 1024
    assert 0.25 - 0.05 <= tw / th <= 4.0 + 0.2
    if no_upscale:
        assert max(tw / w, th / h) <= 1.0
    elif 0.25 <= w / h <= 4:
        assert tw * th > 0.9 * 1024 * 1024 and abs(math.log((tw / th) / (w / h))) < 0.05
    rw, rh = cover_size(w, h, (tw, th))
    assert rw >= tw and rh >= th


def test_buckets():
    buckets = kohya_buckets(1024 * 1024)
    assert (1024, 1024) in buckets and all(w * h <= 1024 * 1024 and w % 64 == 0 for w, h in buckets)
    assert nearest_bucket(1600, 900, buckets)[0] > nearest_bucket(1600, 900, buckets)[1]
    assert nearest_bucket(300, 300, [(512, 512), (256, 256)], no_upscale=True) == (256, 256)
    assert nearest_bucket(100, 100, [(512, 512)], no_upscale=True) is None


def test_pack_steps_fills_budget():
    assert pack_steps([3, 3, 3, 5, 1], 6) == [[0, 1], [2], [3, 4]]
    with pytest.raises(ConfigError, match="tokens_per_step"):
        pack_steps([7], 6)


@pytest.fixture
def catalog(kohya_dir, tmp_path):
    return scan(
        make_source({"kind": "kohya", "path": str(kohya_dir)}), ScanKnobs(workers=2), cache_dir=tmp_path
    )


KNOBS = PlanKnobs(area=192 * 192, tokens_per_step=600, crop="random", flip_prob=0.5, epochs=2)


def test_plan_is_deterministic_and_seeded(catalog):
    a, b = build_plan(catalog, 7, KNOBS), build_plan(catalog, 7, KNOBS)
    assert a.to_bytes() == b.to_bytes() and a.sha256 == b.sha256
    assert build_plan(catalog, 8, KNOBS).sha256 != a.sha256
    assert len(a.sha256) == 64


def test_plan_counts_repeats_epochs_and_tokens(catalog):
    plan = build_plan(catalog, 0, KNOBS)
    occurrences = sum(len(s) for s in plan.steps)
    assert occurrences == 2 * (6 * 3 + 1) and len(plan.epoch_steps) == 2
    assert max(plan.step_tokens()) <= KNOBS.tokens_per_step
    for step in plan.steps:
        for it in step:
            assert it.image_tokens == (it.target[0] // 16) * (it.target[1] // 16)
            assert it.target[0] * it.target[1] <= KNOBS.area
            assert (
                0 <= it.crop[0] <= it.resize[0] - it.target[0]
                and 0 <= it.crop[1] <= it.resize[1] - it.target[1]
            )
    flips = [it.flip for s in plan.steps for it in s]
    assert any(flips) and not all(flips)


def test_plan_with_buckets_and_center_crop(catalog):
    knobs = PlanKnobs(area=192 * 192, tokens_per_step=600, buckets=((192, 192), (256, 144), (144, 256)))
    plan = build_plan(catalog, 0, knobs)
    targets = {it.target for s in plan.steps for it in s}
    assert targets <= {(192, 192), (256, 144), (144, 256)} and len(targets) == 3
    for it in (it for s in plan.steps for it in s):
        assert it.crop == ((it.resize[0] - it.target[0]) // 2, (it.resize[1] - it.target[1]) // 2)


def test_bad_settings_name_their_field(catalog):
    with pytest.raises(ConfigError, match="^crop: "):
        build_plan(catalog, 0, PlanKnobs(crop="middle"))
    with pytest.raises(ConfigError, match="^tokens_per_step: "):
        build_plan(catalog, 0, PlanKnobs(area=192 * 192, tokens_per_step=10))


def test_caption_augmentations_are_seeded():
    import random

    from kohakumoss_data.caption_aug import augment_caption, shuffle_tags

    text = "1girl, solo, red hair, smile, outdoors"
    a = shuffle_tags(text, random.Random(1), keep_tokens=2)
    assert a == shuffle_tags(text, random.Random(1), keep_tokens=2)
    assert a.startswith("1girl, solo, ") and sorted(a.split(", ")) == sorted(text.split(", "))
    drops = [augment_caption(text, random.Random(i), dropout=0.5) for i in range(200)]
    assert 60 < drops.count("") < 140


def test_plan_caption_knobs(catalog):
    knobs = PlanKnobs(
        area=192 * 192, tokens_per_step=600, caption_dropout=0.3, shuffle_caption=True, keep_tokens=1
    )
    plan = build_plan(catalog, 0, knobs)
    captions = [it.caption for s in plan.steps for it in s]
    assert "" in captions and build_plan(catalog, 0, knobs).sha256 == plan.sha256
    assert all(
        c == "" or c.startswith("a wallpaper photo number") or c.startswith("caption from") for c in captions
    )

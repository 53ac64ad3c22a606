"""Options peers share: several datasets with their own repeats and caption settings, regularization
images with their own loss weight, tag dropout with kept leading tags, loss masks (alpha or mask files)."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
import torch
from PIL import Image

from kohakumoss.config.data_scripts import DataScriptsConfig
from kohakumoss.data_knobs import plan_knobs
from kohakumoss_common.errors import ConfigError, DataError
from kohakumoss_data import Loader, LoaderKnobs, ScanKnobs, make_source, scan
from kohakumoss_data.caption_aug import augment_caption, drop_tags
from kohakumoss_data.plan import build_plan

from .helpers import write_photo

KNOBS = {"AREA": 64 * 64, "TOKENS_PER_STEP": 300, "EPOCHS": 1, "SEED": 2}


def planned(dataset, tmp_path, **knobs):
    source = make_source(dataset)
    catalog = scan(source, ScanKnobs(workers=1), cache_dir=tmp_path / "catalogs")
    plan = build_plan(catalog, 2, plan_knobs(DataScriptsConfig.from_knobs({**KNOBS, **knobs}).plan, dataset))
    return source, catalog, plan, [it for step in plan.steps for it in step]


def tags(caption: str) -> list[str]:
    return [t.strip() for t in caption.split(",") if t.strip()]


def test_tag_dropout_keeps_the_leading_tags_and_drops_the_rest_at_its_rate():
    caption = "sks person, " + ", ".join(f"tag{i}" for i in range(200))
    out = drop_tags(caption, random.Random(0), 0.3, keep_tokens=1)
    assert tags(out)[0] == "sks person" and 110 < len(tags(out)) - 1 < 170  # about 140 of 200 kept
    assert drop_tags(caption, random.Random(0), 0.0, 1) == caption
    assert tags(drop_tags(caption, random.Random(0), 1.0, 1)) == ["sks person"]
    # without tag dropout the generator is not drawn from: plans made before the option stay the same
    a, b = random.Random(5), random.Random(5)
    augment_caption(caption, a, 0.1, True, 1)
    augment_caption(caption, b, 0.1, True, 1, ",", 0.0)
    assert a.random() == b.random()


def test_tag_dropout_knob_in_a_plan(kohya_dir, tmp_path):
    dataset = {"kind": "kohya", "path": str(kohya_dir)}
    _, _, _, plain = planned(dataset, tmp_path)
    _, _, _, dropped = planned(dataset, tmp_path, TAG_DROPOUT=1.0, KEEP_TOKENS=1)
    assert [it.key for it in plain] == [it.key for it in dropped]
    assert any(len(tags(it.caption)) > 1 for it in plain)
    assert all(tags(b.caption) == tags(a.caption)[:1] for a, b in zip(plain, dropped))
    with pytest.raises(ConfigError, match="^TAG_DROPOUT: "):
        planned(dataset, tmp_path, TAG_DROPOUT=1.5)


def test_several_datasets_with_their_own_repeats_and_caption_settings(kohya_dir, folder_dir, tmp_path):
    folder, _ = folder_dir
    dataset = [
        {"kind": "kohya", "path": str(kohya_dir)},
        {"kind": "folder", "path": str(folder), "repeats": 3, "caption_dropout": 1.0},
    ]
    _, catalog, _, items = planned(dataset, tmp_path)
    counts = Counter(it.key for it in items)
    by_key = {it.key: it for it in catalog.usable}
    for key, n in counts.items():
        assert n == by_key[key].repeats * (3 if key.startswith("1/") else 1)
    assert {it.caption for it in items if it.key.startswith("1/")} == {""}  # that dataset's dropout
    assert all(it.caption for it in items if it.key.startswith("0/"))  # the run's (none)
    with pytest.raises(ConfigError, match=r"dataset\[1\]\.loss_weight: must be >= 0"):
        planned([dataset[0], {**dataset[1], "loss_weight": -1.0}], tmp_path)
    with pytest.raises(ConfigError, match=r"dataset\[1\]\.repeats"):
        make_source([dataset[0], {**dataset[1], "repeats": 0}])


def test_regularization_images_balance_the_epoch_and_carry_their_weight(kohya_dir, folder_dir, tmp_path):
    folder, _ = folder_dir
    dataset = [
        {"kind": "kohya", "path": str(kohya_dir)},
        {"kind": "folder", "path": str(folder), "reg": True, "loss_weight": 0.25},
    ]
    _, catalog, plan, items = planned(dataset, tmp_path, EPOCHS=2)
    train = [it for it in items if it.key.startswith("0/")]
    prior = [it for it in items if it.key.startswith("1/")]
    assert {it.loss_weight for it in train} == {1.0} and {it.loss_weight for it in prior} == {0.25}
    for epoch in (0, 1):  # as many reg occurrences as training ones, each epoch (4 reg images cycled)
        assert sum(it.epoch == epoch for it in prior) == sum(it.epoch == epoch for it in train) == 19
    # a cycled reg image is a fresh occurrence: its own crop and caption draw, not a copy
    assert len({(it.key, it.epoch, it.crop, it.caption) for it in prior}) > len({it.key for it in prior})


def alpha_photo(folder, photo: Image.Image, stem: str):
    """An RGBA PNG whose left half is transparent."""
    rgba = photo.convert("RGBA")
    alpha = np.full((rgba.height, rgba.width), 255, np.uint8)
    alpha[:, : rgba.width // 2] = 0
    rgba.putalpha(Image.fromarray(alpha))
    folder.mkdir(parents=True, exist_ok=True)
    rgba.save(folder / f"{stem}.png")
    (folder / f"{stem}.txt").write_text("a cut-out")


def test_alpha_masks_reach_the_batch_on_the_token_grid(photos, tmp_path):
    root = tmp_path / "cutouts"
    for i in range(3):
        alpha_photo(root, photos[i].resize((128, 96)), f"c{i}")
    dataset = {"kind": "folder", "path": str(root), "mask": "alpha"}
    source, catalog, plan, items = planned(dataset, tmp_path, FLIP_PROB=0.5, AREA=128 * 96)
    assert {it.mask for it in items} == {"alpha"} and any(it.flip for it in items)
    batches = list(Loader(plan, catalog, source, knobs=LoaderKnobs(workers=1)))
    for batch in batches:
        for mask, (w, h), key in zip(batch.masks, batch.sizes, batch.keys):
            item = next(it for it in items if it.key == key)
            assert tuple(mask.shape) == (h // 16, w // 16)
            half = mask.shape[1] // 2
            clear, solid = (mask[:, half:], mask[:, :half]) if item.flip else (mask[:, :half], mask[:, half:])
            assert float(clear.max()) == 0.0 and float(solid.min()) == 1.0
        weights = batch.token_weights()
        assert weights.shape[0] == batch.image_tokens and torch.equal(
            weights, torch.cat([m.reshape(-1) for m in batch.masks])
        )


def test_mask_files_and_a_missing_one(photos, tmp_path):
    root, masks = tmp_path / "imgs", tmp_path / "masks"
    for i in range(2):
        write_photo(root / "sub", f"p{i}", photos[i].resize((64, 64)), "x", "JPEG")
    masks.joinpath("sub").mkdir(parents=True)
    Image.new("L", (32, 32), 0).save(masks / "sub" / "p0.png")  # another size: stretched over the image
    top = Image.new("L", (64, 64), 0)
    top.paste(255, (0, 0, 64, 32))
    top.save(masks / "sub" / "p1.png")
    dataset = {"kind": "folder", "path": str(root), "mask": str(masks), "loss_weight": 2.0}
    source, catalog, plan, _ = planned(dataset, tmp_path)
    [batch] = list(Loader(plan, catalog, source, knobs=LoaderKnobs(workers=0)))
    got = dict(zip(batch.keys, batch.masks))
    assert float(got["sub/p0.jpg"].max()) == 0.0
    assert got["sub/p1.jpg"][:2].min() == 1.0 and got["sub/p1.jpg"][2:].max() == 0.0
    assert batch.loss_weights == [2.0, 2.0]
    assert torch.equal(batch.token_weights(), 2.0 * torch.cat([got[k].reshape(-1) for k in batch.keys]))
    (masks / "sub" / "p1.png").unlink()
    with pytest.raises(DataError, match=r"1 mask file\(s\) missing: .*sub/p1\.png"):
        Loader(plan, catalog, source)
    # filling the latent cache needs no mask: it neither reads nor refuses them
    from kohakumoss_data.cache import TensorCache
    from kohakumoss_data.offline import fill_latent_cache

    from .fakes import FakeVAE

    cache = TensorCache(tmp_path / "cache", {"kind": "latent", "vae": "fake"})
    report = fill_latent_cache(plan, catalog, source, FakeVAE(), cache, workers=0, progress=False)
    assert report.encoded == 2


def test_plain_batches_carry_no_weights(kohya_dir, tmp_path):
    source, catalog, plan, _ = planned({"kind": "kohya", "path": str(kohya_dir)}, tmp_path)
    batch = next(iter(Loader(plan, catalog, source, knobs=LoaderKnobs(workers=0))))
    assert batch.masks is None and batch.loss_weights is None and batch.token_weights() is None

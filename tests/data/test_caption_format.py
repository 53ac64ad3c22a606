"""CAPTION_FORMAT: plain, auto-json (SimpleTuner's moss_image_auto_json layout) and json (MOSS's layout
schema, errors naming the item and the JSON key); the prompt token cap named per caption; the cache
settings that change with references and caption formats."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import pytest

from kohakumoss_common.errors import ConfigError, DataError
from kohakumoss_data import PlanKnobs, ScanKnobs, build_plan, make_source, scan
from kohakumoss_data.caption_format import format_caption, wrap_plain

from .test_references import png, write

LAYOUT = {
    "summary": {"canvas": "single", "caption": "a red cup on a desk", "palette": ["#ff0000"]},
    "items": [{"label": "object", "caption": "a red cup", "bbox": [-40, -30, 40, 30], "tags": ["cup"]}],
    "bbox_coord_space": "abs_centralized",
    "bbox_format": "yxyx",
}
KNOBS = PlanKnobs(area=64 * 64, tokens_per_step=10_000, epochs=1, shuffle=False)


def dataset(tmp_path: Path, captions: dict[str, str]):
    """A folder of 64x64 PNGs, `stem.png` with `stem.txt` holding its caption."""
    root = tmp_path / "ds"
    for i, (stem, caption) in enumerate(captions.items()):
        write(root / f"{stem}.png", png((64, 64), i))
        (root / f"{stem}.txt").write_text(caption, encoding="utf-8")
    source = make_source({"kind": "folder", "path": str(root)})
    return root, scan(source, ScanKnobs(workers=1, min_side=32), cache_dir=tmp_path / "catalogs")


def planned(catalog, **knobs) -> dict[str, str]:
    plan = build_plan(catalog, 0, dataclasses.replace(KNOBS, **knobs))
    return {it.key: it.caption for step in plan.steps for it in step}


def test_auto_json_wraps_plain_captions_as_simpletuner_does():
    # the converter's output (moss-image-edit-facts.md 3.2): compact, non-ASCII kept, no items
    assert wrap_plain('a "café" sign') == (
        '{"summary":{"canvas":"single","caption":"a \\"café\\" sign"},"items":[],'
        '"bbox_coord_space":"abs_centralized","bbox_format":"yxyx"}'
    )
    assert format_caption("", "auto-json") == ""  # the dropout caption stays empty, not JSON
    assert format_caption("a cat", "plain") == "a cat"


def test_auto_json_in_the_plan(tmp_path):
    pretty = json.dumps(LAYOUT, indent=2)
    _, catalog = dataset(tmp_path, {"plain": "red, cup, desk", "layout": pretty})
    captions = planned(catalog, caption_format="auto-json", shuffle_caption=True)
    assert json.loads(captions["plain.png"])["summary"]["caption"] in {
        ", ".join(p)
        for p in [("red", "cup", "desk"), ("red", "desk", "cup"), ("cup", "red", "desk")]
        + [("cup", "desk", "red"), ("desk", "red", "cup"), ("desk", "cup", "red")]
    }  # tags shuffled first, then wrapped
    # a JSON caption is validated and written compactly; its tags are not shuffled
    assert captions["layout.png"] == json.dumps(LAYOUT, separators=(",", ":"), ensure_ascii=False)
    assert planned(catalog)["layout.png"] == pretty.strip()  # plain: the caption as written
    dropped = planned(catalog, caption_format="auto-json", caption_dropout=1.0)
    assert set(dropped.values()) == {""}


def test_json_keeps_valid_layouts_as_written(tmp_path):
    text = json.dumps(LAYOUT)
    _, catalog = dataset(tmp_path, {"one": text})
    assert planned(catalog, caption_format="json") == {"one.png": text}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["items"][0].update(bbox=[10, 0, 5, 20]), r"key items\[0\]\.bbox: .*has no area"),
        (lambda d: d["items"][0].update(colour="red"), r"key items\[0\]\.colour: Extra inputs"),
        (lambda d: d["items"][0].update(label="text"), r"key items\[0\]\.text: .*needs its 'text'"),
        (lambda d: d["summary"].update(canvas="poster"), r"key summary\.canvas: Input should be"),
        (lambda d: d.pop("bbox_format"), r"key bbox_format: Field required"),
        (lambda d: d["items"][0].update(bbox=[1.5, 0, 5, 20]), r"key items\[0\]\.bbox\[0\]: "),
    ],
)
def test_json_errors_name_the_item_and_the_key(tmp_path, change, message):
    layout = json.loads(json.dumps(LAYOUT))
    change(layout)
    root, catalog = dataset(tmp_path, {"good": json.dumps(LAYOUT), "bad": json.dumps(layout)})
    with pytest.raises(DataError, match=f"^{root}: bad.png: caption is not MOSS layout JSON: {message}"):
        planned(catalog, caption_format="json")
    with pytest.raises(DataError, match=message):  # auto-json validates JSON captions too
        planned(catalog, caption_format="auto-json")
    assert planned(catalog)["bad.png"] == json.dumps(layout)  # plain: never parsed


def test_json_refuses_plain_text_and_broken_json(tmp_path):
    root, catalog = dataset(tmp_path, {"words": "just words"})
    with pytest.raises(
        DataError, match=f"^{root}: words.png: caption is plain text, but caption_format 'json'"
    ):
        planned(catalog, caption_format="json")
    root, catalog = dataset(tmp_path / "b", {"cut": '{"summary": {"canvas": "single"'})
    with pytest.raises(DataError, match=f"^{root}: cut.png: caption is not JSON"):
        planned(catalog, caption_format="auto-json")


def test_caption_format_is_a_checked_plan_knob():
    from kohakumoss.config.train import RESUME_FIXED, TrainConfig
    from kohakumoss.data_knobs import plan_knobs

    data = TrainConfig.from_knobs({"CAPTION_FORMAT": "auto-json"}).data
    assert plan_knobs(data).caption_format == "auto-json"
    assert "CAPTION_FORMAT" in RESUME_FIXED  # another format trains other text: never changed on resume
    with pytest.raises(ConfigError, match="^CAPTION_FORMAT: must be one of"):
        plan_knobs(dataclasses.replace(data, caption_format="yaml"))


def test_cache_settings_change_with_references_and_caption_format(tmp_path):
    from kohakumoss.train.cache_identity import cache_mismatches, cache_settings

    base = {"DATASET": {"kind": "kohya", "path": "data/train", "references": "data/refs"}}
    train = cache_settings({**base, "TEXT_ENCODER": "", "VAE": ""}, "train")
    same = cache_settings({**base, "MICRO_STEPS": 10**6}, "data")
    assert [k for k, _ in cache_mismatches(train, same)] == []
    other_refs = {
        "DATASET": {**base["DATASET"], "references": "data/refs2"},
        "CAPTION_FORMAT": "auto-json",
        "MICRO_STEPS": 10**6,
    }
    names = [k for k, _ in cache_mismatches(train, cache_settings(other_refs, "data"))]
    assert names == ["DATASET", "CAPTION_FORMAT"]


def tokenizer_prompts(tmp_path: Path, max_length: int):
    from kohakumoss.encoders import TextEncoderConfig
    from kohakumoss.encoders.text import load_prompt_tokenizer
    from kohakumoss.encoders.tiny import write_word_tokenizer

    folder = write_word_tokenizer(tmp_path / "tok", ["a red cup on a desk"])
    config = TextEncoderConfig(
        path=str(tmp_path),
        tokenizer_path=str(folder),
        template="photo of {caption} here",
        max_length=max_length,
    )
    return load_prompt_tokenizer(config)


def test_captions_over_the_token_cap_are_named(tmp_path, caplog):
    from kohakumoss.encoders.text_cap import cut_captions, report_cut_captions

    prompts = tokenizer_prompts(tmp_path, max_length=8)
    pairs = [
        ("ds: short.png", "a cup"),
        ("ds: long.png", "a red cup on a desk a red cup"),
        ("ds: long.png", "a"),
    ]
    cuts = cut_captions(prompts, pairs, cap=8)
    assert [(c.where, c.tokens) for c in cuts] == [("ds: long.png", 12)]  # 3 template + 9 caption words
    assert len(prompts("a red cup on a desk a red cup")) == 8  # what the encoder keeps: the first 8
    with caplog.at_level(logging.WARNING):
        report_cut_captions(cuts, "MAX_TEXT_TOKENS")
    assert (
        "ds: long.png: caption is 12 tokens with the prompt template, over MAX_TEXT_TOKENS 8" in caplog.text
    )
    assert "its last 4 tokens" in caplog.text and "short.png" not in caplog.text
    with pytest.raises(DataError, match="CAPTION_FORMAT 'auto-json': 1 caption.*ds: long.png: caption is 12"):
        report_cut_captions(cuts, "MAX_TEXT_TOKENS", "auto-json")
    report_cut_captions([], "MAX_TEXT_TOKENS", "json")  # nothing cut: nothing said


def test_the_trainer_names_cut_captions_from_its_plan(tmp_path, caplog):
    from kohakumoss.config.train import TrainConfig
    from kohakumoss.train.data import check_caption_cuts

    root, catalog = dataset(tmp_path, {"short": "a cup", "long": "a red cup on a desk a red cup on a desk"})
    plan = build_plan(catalog, 0, KNOBS)

    class Encoder:  # what the trainer reads of a loaded text encoder
        prompts = tokenizer_prompts(tmp_path, max_length=4096)

    cfg = TrainConfig.from_knobs({"MAX_TEXT_TOKENS": 10})
    with caplog.at_level(logging.WARNING):
        check_caption_cuts(Encoder(), [(plan, catalog)], cfg)
    assert f"{root}: long.png: caption is 15 tokens" in caplog.text and "short.png" not in caplog.text
    json_cfg = TrainConfig.from_knobs({"MAX_TEXT_TOKENS": 10, "CAPTION_FORMAT": "json"})
    with pytest.raises(DataError, match=f"{root}: long.png"):
        check_caption_cuts(Encoder(), [(plan, catalog)], json_cfg)

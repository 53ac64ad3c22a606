"""REFERENCES_IN_PROMPT in a training config: an edit run's text-encoder settings (and so its cache
identity) carry it, a text-to-image run's do not, and a checkpoint without a vision tower is refused by
the knob's name before anything loads."""

from __future__ import annotations

from kohakumoss.config.train import TrainConfig
from kohakumoss.encoders.tiny import write_tiny_text_encoder
from kohakumoss.train.cache_identity import cache_settings, text_settings
from kohakumoss.train.components import component_problems, dataset_has_references

EDIT = [{"kind": "kohya", "path": "data/train", "references": "data/refs"}]


def config(tmp_path, vision: bool, **knobs) -> TrainConfig:
    te = write_tiny_text_encoder(tmp_path / "te", ["a cat"], vision=vision)
    base = {"TEXT_ENCODER": te.path, "TOKENIZER": te.tokenizer_path, "MODEL_PRESET": "tiny", "DEVICE": "cpu"}
    return TrainConfig.from_knobs({**base, **knobs})


def test_edit_runs_put_references_in_the_prompt_by_default(tmp_path):
    assert dataset_has_references(EDIT) and not dataset_has_references({"kind": "kohya", "path": "x"})
    edit = config(tmp_path, True, DATASET=EDIT)
    assert text_settings(edit).reference_prompt == "picture"
    assert cache_settings(edit.knobs(), "train")["text"]["reference_prompt"] == "picture"
    comfy = config(tmp_path, True, DATASET=EDIT, REFERENCES_IN_PROMPT="none")
    assert text_settings(comfy).reference_prompt == "none"
    t2i = config(tmp_path, True)
    assert text_settings(t2i).reference_prompt == "none"  # no references: the text-to-image encoder
    assert not [p for p in component_problems(edit) if p[0] == "REFERENCES_IN_PROMPT"]


def test_no_vision_tower_refused_by_the_knob(tmp_path):
    edit = config(tmp_path, False, DATASET=EDIT)
    problems = dict(component_problems(edit))
    assert "no vision tower" in problems["REFERENCES_IN_PROMPT"]
    assert str(tmp_path / "te" / "model") in problems["REFERENCES_IN_PROMPT"]
    comfy = config(tmp_path, False, DATASET=EDIT, REFERENCES_IN_PROMPT="none")
    assert "REFERENCES_IN_PROMPT" not in dict(component_problems(comfy))

"""The sample script's PNGs and the trainer's sample PNGs carry one metadata form (`png_meta`): the same
`kohakumoss` JSON for the same request (references and whether the prompt showed them included) and the
A1111 `parameters` line; each adds only its own facts."""

from __future__ import annotations

import json

from kohakumoss.config.sample import SampleScriptConfig
from kohakumoss.config.train import TrainConfig
from kohakumoss.diffusion.generate import GenerationRequest
from kohakumoss.diffusion.sample_run import png_info
from kohakumoss.train.samples import sample_png_info

SCRIPT_ONLY = {"uncond_skip_layers", "slg_window", "max_text_tokens", "weights", "adapters"}
TRAINER_ONLY = {"sampler", "row"}


class Shows:  # an encoder that puts the references in its prompt (REFERENCES_IN_PROMPT='picture')
    references_in_prompt = True


def chunks(info) -> dict[str, str]:
    """The tEXt chunks of a PngInfo: {key: text}."""
    return dict(tuple(part.decode() for part in data.split(b"\0", 1)) for _, data, _ in info.chunks)


def both(request: GenerationRequest, encoder) -> tuple[dict, dict]:
    script = SampleScriptConfig.from_knobs({"STEPS": 7, "CFG": 2.5, "SHIFT": 3.0, "MODEL_PRESET": "tiny"})
    trainer = TrainConfig.from_knobs({"SAMPLE_STEPS": 7, "SAMPLE_CFG": 2.5, "SAMPLE_SHIFT": 3.0}).samples
    wrapped = type("CacheOnly", (), {"encoder": encoder})()  # the trainer's wrapper of a cached encoder
    return chunks(png_info(request, script, [], encoder)), chunks(
        sample_png_info(request, trainer, "base", wrapped)
    )


def test_the_script_and_the_trainer_write_the_same_metadata():
    edit = GenerationRequest("make it night", 3, 64, 48, "blurry", references=("in/cat.png", "in/cat_1.png"))
    script, trainer = both(edit, Shows())
    a, b = json.loads(script["kohakumoss"]), json.loads(trainer["kohakumoss"])
    assert a.keys() - SCRIPT_ONLY == b.keys() - TRAINER_ONLY
    assert {k: a[k] for k in a.keys() - SCRIPT_ONLY} == {k: b[k] for k in b.keys() - TRAINER_ONLY}
    assert b["references"] == ["in/cat.png", "in/cat_1.png"] and b["references_in_prompt"] == "picture"
    assert (b["steps"], b["cfg"], b["shift"], b["row"]) == (7, 2.5, 3.0, "base")
    assert script["prompt"] == trainer["prompt"] == "make it night"
    assert script["parameters"] == trainer["parameters"]
    assert "Negative prompt: blurry" in trainer["parameters"] and "References: 2" in trainer["parameters"]
    # an encoder that shows no references ('none', or no vision tower): the DiT alone saw them
    script, trainer = both(edit, None)
    assert json.loads(script["kohakumoss"])["references_in_prompt"] == "none"
    assert json.loads(trainer["kohakumoss"])["references_in_prompt"] == "none"


def test_a_text_to_image_sample_names_no_references():
    script, trainer = both(GenerationRequest("a cat", 1, 32, 32), Shows())
    for text in (script, trainer):
        settings = json.loads(text["kohakumoss"])
        assert "references" not in settings and "references_in_prompt" not in settings
        assert "References" not in text["parameters"]

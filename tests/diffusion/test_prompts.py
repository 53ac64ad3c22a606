"""Prompt files in the kohya line format: flags parsed, errors name the file, line and flag."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kohakumoss.config.sample import SAMPLE_SCHEMA, SampleScriptConfig
from kohakumoss.config.train import TrainConfig
from kohakumoss.diffusion import SamplerConfig
from kohakumoss.diffusion.generate import GenerationRequest, generate
from kohakumoss.diffusion.prompts import PromptLine, parse_prompt_line, read_prompt_file
from kohakumoss.diffusion.sample_run import read_prompts, requests_for
from kohakumoss.encoders.tiny import load_tiny_text_encoder, tiny_vae
from kohakumoss.model import get_preset
from kohakumoss.train.samples import sample_captions, sample_requests
from kohakumoss_common.errors import ConfigError

from ..model.helpers import random_model


def test_every_flag_in_any_order():
    line = parse_prompt_line("a cat, on a mat --s 30 --n ugly, blurry --w 1024 --h 768 --d 42 --l 3.5")
    assert line == PromptLine("a cat, on a mat", "ugly, blurry", 1024, 768, 42, 3.5, 30)
    assert parse_prompt_line("  plain words, no flags ") == PromptLine("plain words, no flags")
    assert parse_prompt_line("a -- b --w 64").prompt == "a -- b"  # a lone '--' is text
    assert parse_prompt_line("x --d 7").with_defaults(seed=1, width=64) == PromptLine("x", width=64, seed=7)


def test_file_skips_comments_and_blank_lines(tmp_path):
    path = tmp_path / "p.txt"
    path.write_text("# a comment\n\nfirst --w 64\n   # indented comment\nsecond\n")
    assert read_prompt_file(path) == [PromptLine("first", width=64), PromptLine("second")]


@pytest.mark.parametrize(
    "line, words",
    [
        ("cat --x 3", ["--x", "unknown flag"]),
        ("cat --w 100", ["--w 100", "multiple of 16"]),
        ("cat --d seven", ["--d", "'seven'"]),
        ("cat --s", ["--s needs a value"]),
        ("cat --s 0", ["--s 0"]),
        ("--w 64", ["no prompt"]),
    ],
)
def test_bad_lines_name_file_line_and_flag(tmp_path, line, words):
    path = tmp_path / "p.txt"
    path.write_text(f"# header\nfine prompt\n{line}\n")
    with pytest.raises(ConfigError) as e:
        read_prompt_file(path, "SAMPLE_PROMPTS_FILE")
    msg = str(e.value)
    assert msg.startswith(f"SAMPLE_PROMPTS_FILE: {path}:3: ") and all(w in msg for w in words), msg


def test_schema_refuses_a_bad_prompt_file_before_work(tmp_path):
    path = tmp_path / "p.txt"
    path.write_text("ok\ncat --q 1\n")
    knobs = {**SAMPLE_SCHEMA.defaults(), "PROMPT_FILE": str(path)}
    with pytest.raises(Exception, match=r"p.txt:2: unknown flag --q"):
        SAMPLE_SCHEMA.validate(knobs)


def test_sample_script_requests_take_the_lines_settings(tmp_path):
    path = tmp_path / "p.txt"
    path.write_text("plain line\nflagged --n bad --w 32 --h 48 --d 100 --l 1.5 --s 7\n")
    k = {"PROMPT": "knob prompt --h 16", "PROMPT_FILE": str(path), "SEEDS": [], "SEED": 5, "COUNT": 2,
         "WIDTH": 64, "HEIGHT": 80, "NEGATIVE": "neg"}  # fmt: skip
    cfg = SampleScriptConfig.from_knobs(k)
    reqs = requests_for(cfg, read_prompts(cfg))
    assert [r.prompt for r in reqs] == ["knob prompt"] * 2 + ["plain line"] * 2 + ["flagged"] * 2
    assert reqs[0] == GenerationRequest("knob prompt", 5, 64, 16, "neg")
    assert reqs[2] == GenerationRequest("plain line", 5, 64, 80, "neg")
    assert reqs[3].seed == 6
    assert reqs[4] == GenerationRequest("flagged", 100, 32, 48, "bad", 7, 1.5)
    assert reqs[5].seed == 101


def test_trainer_sample_requests_take_the_lines_settings(tmp_path):
    path = tmp_path / "p.txt"
    path.write_text("# grid\nfrom file --w 48 --s 3\n")
    k = {"SAMPLE_PROMPTS": ["knob --d 9"], "SAMPLE_PROMPTS_FILE": str(path), "SAMPLE_SEEDS": [],
         "SAMPLE_NEGATIVE": "", "SAMPLE_WIDTH": 32, "SAMPLE_HEIGHT": 32}  # fmt: skip
    samples = TrainConfig.from_knobs(k).samples
    # the grid's captions: the whole prompt, then what drew it (a line's flags over the knobs)
    assert sample_captions(samples) == [
        "knob\nseed 9, cfg 3, 20 steps, 32x32",
        "from file\nseed 1, cfg 3, 3 steps, 48x32",
    ]
    assert sample_requests(samples) == [
        GenerationRequest("knob", 9, 32, 32, ""),
        GenerationRequest("from file", 1, 48, 32, "", 3, None),
    ]


def test_generate_samples_each_request_with_its_own_steps_and_cfg(tmp_path):
    """A batch of mixed settings draws each picture as that request alone with those settings would."""
    cfg = get_preset("tiny")
    prompts = ["a red cat on a mat", "the quick brown fox"]
    te, vae, model = load_tiny_text_encoder(tmp_path, prompts), tiny_vae(), random_model(cfg)
    base = SamplerConfig(steps=2, cfg_scale=3.0, uncond_skip_layers=(1,))
    pixels = lambda im: torch.from_numpy(np.asarray(im, dtype=np.int16))  # noqa: E731
    mixed = [
        GenerationRequest(prompts[0], 1, 32, 32),
        GenerationRequest(prompts[1], 2, 32, 32, steps=4, cfg=1.0),
        GenerationRequest(prompts[0], 3, 32, 32, cfg=5.0),
    ]
    got = generate(model, te, vae, mixed, base, cfg.in_channels)
    for req, im in zip(mixed, got):
        plain = GenerationRequest(req.prompt, req.seed, 32, 32)
        alone = generate(model, te, vae, [plain], req.sampler(base), cfg.in_channels)[0]
        assert (pixels(alone) - pixels(im)).abs().max() <= 2
    default = generate(model, te, vae, [GenerationRequest(prompts[1], 2, 32, 32)], base, cfg.in_channels)[0]
    assert (pixels(default) - pixels(got[1])).abs().max() > 2  # the line's settings changed the picture


def test_sample_script_refuses_a_bad_prompt_before_loading(capsys):
    import runpy
    from pathlib import Path

    from kohakumoss_common.knobs import run_checked

    ns = runpy.run_path(str(Path(__file__).resolve().parents[2] / "scripts/sample/sample.py"), run_name="t")
    knobs = {**ns, "PROMPT": "a cat --ar 16:9", "MODEL_PRESET": "tiny", "UNCOND_SKIP_LAYERS": [1]}
    assert run_checked(SAMPLE_SCHEMA, knobs, ns["run"], "sample.py") == 2
    assert "PROMPT: PROMPT: unknown flag --ar" in capsys.readouterr().err


def test_train_schema_checks_sample_prompts_and_their_file(tmp_path):
    from kohakumoss.config.train import TRAIN_SCHEMA

    base = TRAIN_SCHEMA.defaults()
    with pytest.raises(Exception, match=r"SAMPLE_PROMPTS\[1\]: unknown flag --q"):
        TRAIN_SCHEMA.validate({**base, "SAMPLE_PROMPTS": ["fine --w 64", "cat --q 1"]})
    path = tmp_path / "p.txt"
    path.write_text("# only a comment\n")
    with pytest.raises(Exception, match=r"SAMPLE_PROMPTS_FILE: .*has no prompts"):
        TRAIN_SCHEMA.validate({**base, "SAMPLE_PROMPTS_FILE": str(path)})
    path.write_text("fine --w 64 --n soft, blurry\n")
    assert TRAIN_SCHEMA.validate({**base, "SAMPLE_PROMPTS_FILE": str(path)})["SAMPLE_PROMPTS_FILE"] == str(
        path
    )

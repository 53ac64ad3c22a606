"""Edit sampling end to end on tiny models: `--ri` prompt lines and REFERENCE_IMAGES, references sized
at the target's area and VAE-encoded as training encodes them, shown to the text encoder's vision tower
for both CFG branches (REFERENCES_IN_PROMPT='picture'), refused by name without a vision tower."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from kohakumoss.config.sample import SAMPLE_SCHEMA, SampleScriptConfig
from kohakumoss.config.train import TrainConfig
from kohakumoss.diffusion import SamplerConfig
from kohakumoss.diffusion.generate import GenerationRequest, generate
from kohakumoss.diffusion.prompts import PromptLine, parse_prompt_line, read_prompt_file
from kohakumoss.diffusion.references import reference_pixels
from kohakumoss.diffusion.sample_run import read_prompts, requests_for
from kohakumoss.encoders.tiny import load_tiny_text_encoder, tiny_vae, write_tiny_text_encoder, write_tiny_vae
from kohakumoss.model import get_preset
from kohakumoss.train.samples import sample_requests
from kohakumoss_common.errors import ConfigError
from kohakumoss_common.knobs import run_checked

from ..model.helpers import random_model

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["make the cat blue", "a red cat"]


def picture(path: Path, size: tuple[int, int], seed: int) -> Path:
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(path)
    return path


def test_ri_flags_repeat_in_order_and_missing_files_are_named(tmp_path):
    a, b = picture(tmp_path / "a.png", (40, 30), 0), picture(tmp_path / "b.png", (30, 40), 1)
    line = parse_prompt_line(f"make it blue --ri {a} --w 64 --ri {b}")
    assert line == PromptLine("make it blue", width=64, references=(str(a), str(b)))
    path = tmp_path / "p.txt"
    path.write_text(f"ok --ri {a}\nbad --ri {tmp_path / 'nope.png'}\n")
    with pytest.raises(ConfigError, match=r"SAMPLE_PROMPTS_FILE: .*p.txt:2: --ri reference image .*nope.png"):
        read_prompt_file(path, "SAMPLE_PROMPTS_FILE")
    # REFERENCE_IMAGES for lines without their own --ri; the trainer's sample lines take --ri too
    path.write_text(f"own --ri {b}\nplain\n")
    k = {"PROMPT": "", "PROMPT_FILE": str(path), "SEEDS": [], "SEED": 0, "COUNT": 1, "WIDTH": 64,
         "HEIGHT": 64, "NEGATIVE": "", "REFERENCE_IMAGES": [str(a)]}  # fmt: skip
    cfg = SampleScriptConfig.from_knobs(k)
    assert [r.references for r in requests_for(cfg, read_prompts(cfg))] == [(str(b),), (str(a),)]
    samples = TrainConfig.from_knobs({"SAMPLE_PROMPTS": [f"edit --ri {a}", "t2i"]}).samples
    assert [r.references for r in sample_requests(samples)] == [(str(a),), ()]


def test_references_sized_at_the_target_area_at_their_own_aspect():
    image = Image.new("RGB", (300, 100), (10, 20, 30))
    pixels = reference_pixels(image, (64, 64))
    h, w = pixels.shape[1:]
    assert w % 16 == 0 and h % 16 == 0 and w * h <= 64 * 64 and w > 2 * h  # wide stays wide
    assert pixels.dtype == torch.uint8 and pixels[:, 0, 0].tolist() == [10, 20, 30]


def test_generate_shows_the_references_to_both_branches(tmp_path):
    cfg = get_preset("tiny")
    te = load_tiny_text_encoder(tmp_path / "te", PROMPTS, vision=True)
    vae, model = tiny_vae(), random_model(cfg)
    ref = picture(tmp_path / "r.png", (48, 40), 3)
    seen = []
    encode = te.encode
    te.encode = lambda captions, references=None: (
        seen.append((list(captions), references)) or encode(captions, references)
    )
    sc = SamplerConfig(steps=2, cfg_scale=3.0, uncond_skip_layers=(1,))
    pixels = lambda im: torch.from_numpy(np.asarray(im, dtype=np.int16))  # noqa: E731
    edit = generate(
        model,
        te,
        vae,
        [GenerationRequest(PROMPTS[0], 1, 32, 32, "", references=(str(ref),))],
        sc,
        cfg.in_channels,
    )
    assert [c for c, _ in seen] == [[PROMPTS[0]], [""]]  # the prompt, then the negative: both with it
    assert all(r is not None and r[0][0].size == (48, 40) for _, r in seen)
    plain = generate(model, te, vae, [GenerationRequest(PROMPTS[0], 1, 32, 32)], sc, cfg.in_channels)
    assert (pixels(edit[0]) - pixels(plain[0])).abs().max() > 2
    with pytest.raises(ConfigError, match="REFERENCE_IMAGES.*VAE"):
        from kohakumoss.diffusion.generate import generate_latents

        generate_latents(
            model, te, [GenerationRequest("x", 1, 32, 32, references=(str(ref),))], sc, cfg.in_channels
        )


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("edit_world")
    text = write_tiny_text_encoder(root / "text", PROMPTS, vision=True)
    bare = write_tiny_text_encoder(root / "bare", PROMPTS)
    return {
        "TEXT_ENCODER": text.path,
        "TOKENIZER": text.tokenizer_path,
        "VAE": str(write_tiny_vae(root / "vae")),
        "bare": bare.path,
        "bare_tokenizer": bare.tokenizer_path,
        "ref": str(picture(root / "ref.png", (64, 48), 5)),
    }


def test_sample_script_with_reference_images(world, tmp_path, capsys):
    ns = runpy.run_path(str(ROOT / "scripts/sample/sample.py"), run_name="t")
    knobs = {**ns, **{k: v for k, v in world.items() if k in SAMPLE_SCHEMA.knobs}, "MODEL_PRESET": "tiny",
             "DEVICE": "cpu", "PRECISION": "fp32", "STEPS": 2, "UNCOND_SKIP_LAYERS": [1], "WIDTH": 32,
             "HEIGHT": 32, "PROMPT": PROMPTS[0], "GRID": False}  # fmt: skip
    edit = {**knobs, "REFERENCE_IMAGES": [world["ref"]], "OUT_DIR": str(tmp_path / "edit")}
    assert run_checked(SAMPLE_SCHEMA, edit, ns["run"], "sample.py") == 0
    png = tmp_path / "edit" / "0000_seed0.png"
    info = json.loads(Image.open(png).text["kohakumoss"])
    assert info["references"] == [world["ref"]] and info["references_in_prompt"] == "picture"
    fresh = {**edit, "REFERENCE_KV_CACHE": False, "OUT_DIR": str(tmp_path / "fresh")}  # every step recomputes
    assert run_checked(SAMPLE_SCHEMA, fresh, ns["run"], "sample.py") == 0
    pixels = lambda p: torch.from_numpy(np.asarray(Image.open(p), dtype=np.int16))  # noqa: E731
    assert (pixels(png) - pixels(tmp_path / "fresh" / png.name)).abs().max() <= 1
    bare = {
        **edit,
        "TEXT_ENCODER": world["bare"],
        "TOKENIZER": world["bare_tokenizer"],
        "OUT_DIR": str(tmp_path / "bare"),
    }
    assert run_checked(SAMPLE_SCHEMA, bare, ns["run"], "sample.py") == 2
    err = capsys.readouterr().err
    assert "REFERENCES_IN_PROMPT" in err and "no vision tower" in err and world["bare"] in err
    assert run_checked(SAMPLE_SCHEMA, {**edit, "VAE": ""}, ns["run"], "sample.py") == 2
    assert "REFERENCE_IMAGES: reference images are VAE-encoded: set VAE" in capsys.readouterr().err
    comfy = {**bare, "REFERENCES_IN_PROMPT": "none"}  # the ComfyUI Moss-Image-Edit format needs none
    assert run_checked(SAMPLE_SCHEMA, comfy, ns["run"], "sample.py") == 0
    assert (tmp_path / "bare" / "0000_seed0.png").exists()

"""kohakumoss-config: preset layers and their composition order, new / --from / wizard, check's bad cases.

Weights are a tiny DiT written by save_backbone (ComfyUI and HF folder shapes) plus one-tensor stand-ins
for the text encoder and VAE (check reads headers only); the dataset is two small kohya-style images.
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from kohakuengine.config import load_config_file
from PIL import Image
from safetensors.torch import save_file

from kohakumoss.cli import config_gpu
from kohakumoss.cli.config_gpu import resolve_gpu
from kohakumoss.cli.config_layers import (
    GPU_SIZES,
    RESOLUTIONS,
    compose,
    layer_path,
    layers_dir,
    list_layers,
    load_file,
    source_kinds,
)
from kohakumoss.cli.config_tool import main
from kohakumoss.config.data_scripts import DATA_SCHEMA
from kohakumoss.config.sample import SAMPLE_SCHEMA
from kohakumoss.config.train import TRAIN_SCHEMA, TrainConfig
from kohakumoss.memory import estimate_peak
from kohakumoss.model.backbone import MossBackbone
from kohakumoss.model.io import save_backbone
from kohakumoss.model.presets import get_preset
from kohakumoss_common.errors import ConfigError

from ..adapters.helpers import algo_names

RECIPES = ("lora_24g_bf16", "lokr_16g", "lora_8g", "lora_6g", "full_24g_host_masters")


def _encoders(text_dir: Path, vae_dir: Path, text_name: str, vae_name: str) -> None:
    text_dir.mkdir(parents=True, exist_ok=True)
    vae_dir.mkdir(parents=True, exist_ok=True)
    save_file({"model.embed_tokens.weight": torch.zeros(4, 4)}, str(text_dir / text_name))
    save_file({"encoder.conv_in.weight": torch.zeros(4, 4)}, str(vae_dir / vae_name))


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("config_tool")
    model = MossBackbone(get_preset("tiny"))
    comfy = root / "ComfyUI" / "models"
    save_backbone(model, comfy / "diffusion_models", layout="comfy")
    _encoders(comfy / "text_encoders", comfy / "vae", "qwen_tiny.safetensors", "flux2-vae.safetensors")
    (comfy / "text_encoders" / "qwen3.5_tokenizer").mkdir()
    (comfy / "text_encoders" / "qwen3.5_tokenizer" / "tokenizer_config.json").write_text("{}")
    hf = root / "MOSS-Image-Base"
    save_backbone(model, hf / "transformer", layout="hf")
    _encoders(hf / "text_encoder", hf / "vae", "model.safetensors", "diffusion_pytorch_model.safetensors")
    (hf / "tokenizer").mkdir()
    junk = root / "junk" / "models"
    (junk / "diffusion_models").mkdir(parents=True)
    save_file({"foo.bar": torch.zeros(2)}, str(junk / "diffusion_models" / "mystery.safetensors"))
    _encoders(junk / "text_encoders", junk / "vae", "t.safetensors", "v.safetensors")
    data = root / "dataset" / "10_cat"
    data.mkdir(parents=True)
    for i in range(2):
        Image.new("RGB", (64, 48), (40 * i, 90, 160)).save(data / f"{i}.png")
        (data / f"{i}.txt").write_text("a blue cat")
    return {"root": root, "comfy": comfy, "hf": hf, "junk": junk, "data": data.parent}


@pytest.fixture(autouse=True)
def no_gpu(monkeypatch):
    monkeypatch.setattr(config_gpu, "detect_gpu", lambda: None)


def _knobs(path: Path) -> dict:
    cfg = load_config_file(path)  # exactly what `kogine run --config` does
    return dict(cfg.globals_dict)


# --- layers --------------------------------------------------------------------------------------


def test_every_layer_exists_and_validates():
    assert list_layers("gpu") == sorted(f"vram_{g}g" for g in GPU_SIZES)
    assert set(list_layers("algo")) == {*algo_names(), "full"}  # a preset per algorithm of the registry
    assert set(list_layers("data")) == {f"{s}_{r}" for s in source_kinds() for r in RESOLUTIONS}
    assert set(RECIPES) <= set(list_layers("recipes"))
    for kind in ("gpu", "algo", "data", "recipes"):
        for name in list_layers(kind):
            knobs, meta = load_file(layer_path(kind, name))
            assert knobs, name
            assert TRAIN_SCHEMA.problems(knobs) == [], (kind, name)
            if kind == "algo":
                assert knobs["ALGO"] == name
            if kind == "gpu":
                assert meta["card_gb"] == int(name[5:-1]) and meta["memory_profile"]
                assert {"PRECISION", "TOKENS_PER_STEP", "RANK", "GRAD_ACCUM"} <= set(knobs)


def test_gpu_layers_name_a_profile_that_fits():
    """Each GPU layer's _metadata names the profile that fits an adapter (moss-image-5b) on its card;
    the next larger named profile does not (so the name is the fastest named one that fits)."""
    from kohakumoss.memory import PROFILES, estimate_plan

    order = list(PROFILES)
    for gb in GPU_SIZES:
        layers = [
            layer_path("gpu", f"vram_{gb}g"),
            layer_path("algo", "lora"),
            layer_path("data", "kohya_1mp"),
        ]
        knobs = {**TRAIN_SCHEMA.defaults(), **compose(layers)}
        assert knobs["MEMORY_PROFILE"] == "auto"
        name = load_file(layers[0])[1]["memory_profile"]
        peak = estimate_plan(PROFILES[name], TrainConfig.from_knobs(knobs), get_preset("moss-image-5b")).total
        assert peak < gb * 0.95 * (1 << 30), (gb, name, peak / (1 << 30))
        if name != "speed":
            faster = PROFILES[order[order.index(name) - 1]]
            assert estimate_plan(
                faster, TrainConfig.from_knobs(knobs), get_preset("moss-image-5b")
            ).total > gb * 0.95 * (1 << 30)


def test_composition_order_gpu_algo_data_user(tmp_path):
    layers = layers_dir()

    def config(order: list[str], own: str = "") -> Path:
        p = tmp_path / f"c{len(list(tmp_path.iterdir()))}.py"
        uses = "\n".join(f'use_config("{layers / o}.py")' for o in order)
        p.write_text(f"from kohakuengine import use_config\n{uses}\n{own}\n")
        return p

    gpu, algo, data = "gpu/vram_8g", "algo/oft", "data/kohya_512"
    k = _knobs(config([gpu, algo, data]))
    assert k["RANK"] == 32 and k["GRAD_ACCUM"] == 4 and k["ALGO"] == "oft"  # algo overrides gpu's RANK 16
    assert k["AREA"] == 512 * 512 and k["DATASET"]["kind"] == "kohya"
    assert _knobs(config([algo, gpu, data]))["RANK"] == 16  # later wins, whatever the kinds
    own = _knobs(config([gpu, algo, data], "RANK = 8\nAREA = 4096\n"))
    assert own["RANK"] == 8 and own["AREA"] == 4096  # the user's own knobs win over every layer
    # compose() applies the same rule as kogine
    paths = [layers / f"{n}.py" for n in (gpu, algo, data)]
    assert compose(paths, {"RANK": 8}) == {**k, "RANK": 8}
    # recipes are compositions too
    r = _knobs(layer_path("recipes", "lokr_16g"))
    assert (
        r["ALGO"] == "lokr" and r["ALGO_ARGS"] == {"factor": 16} and r["RANK"] == 32 and r["AREA"] == 1 << 20
    )


def test_gpu_choice():
    assert resolve_gpu("auto").layer == "vram_6g" and "no GPU found" in resolve_gpu("auto").message
    assert resolve_gpu("10").layer == "vram_8g"
    assert resolve_gpu("23.6").layer == "vram_24g"  # a 24 GB card reports a little less
    assert resolve_gpu("200").layer == "vram_80g"
    assert resolve_gpu("3").layer == "vram_6g"
    assert resolve_gpu("NVIDIA GeForce RTX 4090").layer == "vram_24g"
    assert resolve_gpu("vram_48g").card_gb == 48
    with pytest.raises(ConfigError, match="did you mean rtx4090"):
        resolve_gpu("rtx4909")


def test_gpu_auto_reads_the_card(monkeypatch):
    monkeypatch.setattr(config_gpu, "detect_gpu", lambda: ("NVIDIA GeForce RTX 4080", 15.6))
    choice = resolve_gpu("auto")
    assert choice.layer == "vram_16g" and "RTX 4080" in choice.description and not choice.message


# --- new -----------------------------------------------------------------------------------------


def test_new_train_comfy_folder(world, tmp_path, capsys):
    out = tmp_path / "user"
    argv = [
        "new",
        "train",
        "--weights",
        str(world["comfy"]),
        "--data",
        str(world["data"]),
        "--name",
        "my-lora",
    ]
    assert main([*argv, "--gpu", "rtx4090", "--algo", "lokr", "--out-dir", str(out)]) == 0
    said = capsys.readouterr().out
    assert "layer gpu/vram_24g" in said and "comfy layout" in said and "kohya source" in said
    k = _knobs(out / "my-lora.py")
    valid = TRAIN_SCHEMA.validate(k)
    assert valid["WEIGHTS"].endswith("diffusion_models/moss_image.safetensors")
    assert valid["TEXT_ENCODER"].endswith("qwen_tiny.safetensors") and valid["VAE"].endswith(
        "flux2-vae.safetensors"
    )
    assert valid["DATASET"] == {"kind": "kohya", "path": str(world["data"].resolve())}
    assert valid["ALGO"] == "lokr" and valid["RANK"] == 32 and valid["TOKENS_PER_STEP"] == 8704
    assert valid["RUN_NAME"] == "my-lora"
    assert valid["SAMPLE_PROMPTS"] == ["a blue cat"]  # the dataset's captions (distinct): a first run samples
    d = DATA_SCHEMA.validate(_knobs(out / "my-lora_data.py"))
    for name in ("DATASET", "AREA", "TOKENS_PER_STEP", "SEED", "CACHE_DIR", "MAX_TEXT_TOKENS"):
        assert d[name] == valid[name], name  # the caches the data scripts fill are the ones training reads
    assert d["VAE_KWARGS"]["path"] == valid["VAE"] and d["TEXT_KWARGS"]["path"] == valid["TEXT_ENCODER"]
    # the caching runs on this machine (no GPU here): its device and dtype, not a hard-coded cuda / bf16
    assert d["VAE_KWARGS"]["device"] == "cpu" and d["TEXT_KWARGS"]["dtype"] == "float32"
    assert d["TEXT_KWARGS"]["max_length"] == valid["MAX_TEXT_TOKENS"]  # the trainer cuts captions there
    assert d["TEXT_KWARGS"]["tokenizer_path"] == valid["TOKENIZER"]
    assert valid["TOKENIZER"].endswith("text_encoders/qwen3.5_tokenizer")
    assert main(["check", str(out / "my-lora.py")]) == 0
    assert main(["check", str(out / "my-lora_data.py")]) == 0
    # a second run does not overwrite without --force
    assert main([*argv, "--out-dir", str(out)]) == 1
    assert "exists" in capsys.readouterr().err


def test_new_train_edit_dataset_writes_references_and_sample_references(world, tmp_path, capsys):
    """--references: DATASET's `references` in both files; the sample prompts carry their item's
    references as --ri (an item without one is dropped by the scan, so it is no sample prompt)."""
    refs = tmp_path / "refs"
    (refs / "10_cat").mkdir(parents=True)
    Image.new("RGB", (48, 48), (200, 90, 10)).save(refs / "10_cat" / "0.png")  # 1.png has none
    out = tmp_path / "user"
    argv = ["new", "train", "--weights", str(world["hf"]), "--data", str(world["data"]), "--name", "ed"]
    assert main([*argv, "--references", str(refs), "--out-dir", str(out)]) == 0
    assert f"references {refs.resolve()}" in capsys.readouterr().out
    valid = TRAIN_SCHEMA.validate(_knobs(out / "ed.py"))
    assert valid["DATASET"] == {
        "kind": "kohya",
        "path": str(world["data"].resolve()),
        "references": str(refs.resolve()),
    }
    assert valid["SAMPLE_PROMPTS"] == [f"a blue cat --ri {refs.resolve() / '10_cat' / '0.png'}"]
    assert DATA_SCHEMA.validate(_knobs(out / "ed_data.py"))["DATASET"] == valid["DATASET"]
    missing = ["--references", str(tmp_path / "nope"), "--out-dir", str(tmp_path / "u2")]
    assert main([*argv, *missing]) != 0
    said = capsys.readouterr()
    assert "DATASET" in said.err and "references folder" in said.err and "does not exist" in said.err


def test_new_train_hf_folder_and_no_gpu(world, tmp_path, capsys):
    out = tmp_path / "user"
    argv = ["new", "train", "--weights", str(world["hf"]), "--data", str(world["data"]), "--name", "hf"]
    assert main([*argv, "--resolution", "512", "--out-dir", str(out)]) == 0
    assert "no GPU found: using the smallest layer (vram_6g)" in capsys.readouterr().out
    k = TRAIN_SCHEMA.validate(_knobs(out / "hf.py"))
    assert k["WEIGHTS"].endswith("transformer") and k["TOKENIZER"].endswith("tokenizer")
    assert k["AREA"] == 512 * 512 and k["GRAD_ACCUM"] == 4 and k["TEXT_ENCODE"] == "cache"


def test_new_refuses_unrecognised_weights_and_missing_data(world, tmp_path, capsys):
    out = tmp_path / "user"
    argv = ["new", "train", "--weights", str(world["junk"]), "--data", str(tmp_path / "nope"), "--name", "x"]
    assert main([*argv, "--out-dir", str(out)]) == 1
    err = capsys.readouterr().err
    assert "WEIGHTS: no DiT checkpoint in a recognised layout" in err and "match no known layout" in err
    assert "DATASET:" in err and "does not exist" in err
    assert not out.exists()
    (world["root"] / "novae" / "diffusion_models").mkdir(parents=True)
    save_backbone(
        MossBackbone(get_preset("tiny")), world["root"] / "novae" / "diffusion_models", layout="comfy"
    )
    argv = [
        "new",
        "train",
        "--weights",
        str(world["root"] / "novae"),
        "--data",
        str(world["data"]),
        "--name",
        "y",
    ]
    assert main([*argv, "--out-dir", str(out)]) == 1
    err = capsys.readouterr().err
    assert "TEXT_ENCODER: no text encoder" in err and "VAE: no VAE" in err


def test_new_train_finds_a_tokenizer_in_text_encoders_or_says_how_to_get_one(world, tmp_path, capsys):
    """The Comfy-Org files hold no tokenizer: one anywhere under text_encoders/ is found without a knob;
    with none, `new train` stops with the command that fetches the released one."""
    models = tmp_path / "ComfyUI" / "models"
    save_backbone(MossBackbone(get_preset("tiny")), models / "diffusion_models", layout="comfy")
    _encoders(models / "text_encoders", models / "vae", "qwen.safetensors", "flux2-vae.safetensors")
    argv = ["new", "train", "--weights", str(models), "--data", str(world["data"]), "--name", "t"]
    argv += ["--out-dir", str(tmp_path / "user")]
    assert main(argv) == 1
    err = capsys.readouterr().err
    target = (models / "text_encoders" / "qwen3.5_tokenizer").resolve().as_posix()
    command = f"hf download OpenMOSS-Team/MOSS-Image-Base --include 'tokenizer/*' --local-dir {target}"
    assert "TOKENIZER: no tokenizer folder under" in err and command in err
    assert not (tmp_path / "user").exists()
    # where that command puts it: text_encoders/qwen3.5_tokenizer/tokenizer/ (hf keeps the repo's folder)
    fetched = models / "text_encoders" / "qwen3.5_tokenizer" / "tokenizer"
    fetched.mkdir(parents=True)
    (fetched / "tokenizer.json").write_text("{}")
    (models / "text_encoders" / "empty_tokenizer").mkdir()  # a folder named so, holding no tokenizer
    assert main(argv) == 0
    k = _knobs(tmp_path / "user" / "t.py")
    assert Path(k["TOKENIZER"]) == fetched.resolve()


def test_check_refuses_a_data_config_whose_caches_training_would_not_read(world, tmp_path, capsys):
    out = tmp_path / "user"
    argv = ["new", "train", "--weights", str(world["comfy"]), "--data", str(world["data"]), "--name", "c"]
    assert main([*argv, "--out-dir", str(out)]) == 0
    data = out / "c_data.py"
    text, kwargs = data.read_text(), DATA_SCHEMA.validate(_knobs(data))["TEXT_KWARGS"]
    # a hand edit of the data config, and the knob the issue found: the encoder's default 4096 tokens
    data.write_text(text.replace("_own = {", "_own = {\n    'TEXT_KWARGS': {},"))
    capsys.readouterr()
    code, said = main(["check", str(data)]), capsys.readouterr().out
    assert code == 1 and "  TEXT_KWARGS: needs 'path'" in said
    no_cut = {k: v for k, v in kwargs.items() if k != "max_length"}
    data.write_text(
        text.replace("_own = {", f"_own = {{\n    'TEXT_KWARGS': {{**{no_cut!r}, 'max_length': 4096}},")
    )
    for checked in (data, out / "c.py"):
        capsys.readouterr()
        assert main(["check", str(checked)]) == 1
        said = capsys.readouterr().out
        assert "TEXT_KWARGS: max_length 4096, but training encodes with 256" in said, said
        assert "would not read" in said
    data.write_text(text.replace("_own = {", "_own = {\n    'AREA': 512 * 512,"))
    assert main(["check", str(out / "c.py")]) == 1
    assert "AREA: the data config has 262144, the training config 1048576" in capsys.readouterr().out
    # the trainer plans the epochs its STEPS x GRAD_ACCUM span: the caches must cover as many
    assert DATA_SCHEMA.validate(_knobs(data))["MICRO_STEPS"] == 1000 * 4  # the vram_6g layer's GRAD_ACCUM
    data.write_text(text.replace("_own = {", "_own = {\n    'MICRO_STEPS': 1,"))
    assert main(["check", str(out / "c.py")]) == 1
    assert "MICRO_STEPS: 1: the caches cover fewer than the run's 4000 micro-steps" in capsys.readouterr().out
    data.write_text(text)
    assert main(["check", str(out / "c.py")]) == 0


def test_new_data_for_a_training_config_follows_its_own_knobs(world, tmp_path, capsys):
    """train.sh's run config (a base plus --set knobs): the data config read from it caches for its plan."""
    out = tmp_path / "user"
    argv = ["new", "train", "--weights", str(world["comfy"]), "--data", str(world["data"]), "--name", "b"]
    assert main([*argv, "--out-dir", str(out)]) == 0
    run = out / "b_run.py"
    run.write_text(
        'from kohakuengine import use_config\n\nuse_config("b.py")\n\n'
        "_metadata = {'kind': 'train'}\nAREA = 512 * 512\nMAX_TEXT_TOKENS = 128\n"
    )
    assert main(["new", "data", "--train", str(run), "--name", "b_run", "--out-dir", str(out)]) == 0
    d = DATA_SCHEMA.validate(_knobs(out / "b_run_data.py"))
    assert d["AREA"] == 512 * 512 and d["TEXT_KWARGS"]["max_length"] == 128
    assert main(["check", str(run)]) == 0
    assert main(["new", "data", "--train", str(out / "b_data.py"), "--name", "z", "--out-dir", str(out)]) == 1
    assert "not a training config" in capsys.readouterr().err


def test_new_sample_and_data(world, tmp_path):
    out = tmp_path / "user"
    argv = ["new", "sample", "--weights", str(world["comfy"]), "--adapter", "a.safetensors", "--name", "s"]
    assert main([*argv, "--gpu", "12", "--out-dir", str(out)]) == 0
    s = SAMPLE_SCHEMA.validate(_knobs(out / "s.py"))
    assert (
        s["ADAPTERS"] == ["a.safetensors"]
        and s["PRECISION"] == "bf16"
        and s["WEIGHTS"].endswith(".safetensors")
    )
    argv = [
        "new",
        "data",
        "--data",
        str(world["data"]),
        "--source",
        "folder",
        "--name",
        "d",
        "--out-dir",
        str(out),
    ]
    assert main(argv) == 0
    d = DATA_SCHEMA.validate(_knobs(out / "d_data.py"))
    assert d["DATASET"]["kind"] == "folder" and d["AREA"] == 1 << 20


def test_new_from_recipe_lists_every_knob(world, tmp_path):
    target = tmp_path / "my_run.py"
    assert main(["new", "--from", "lokr_16g", str(target), "--weights", str(world["comfy"])]) == 0
    text = target.read_text()
    for name, knob in TRAIN_SCHEMA.knobs.items():
        line = next(ln for ln in text.splitlines() if ln.startswith(f"{name} = "))
        assert line.endswith(knob.help), line
    assert "use_config(" in text and "lokr_16g.py" in text
    k = TRAIN_SCHEMA.validate(_knobs(target))
    recipe = _knobs(layer_path("recipes", "lokr_16g"))
    assert all(k[n] == v for n, v in recipe.items())
    assert k["WEIGHTS"].endswith("moss_image.safetensors") and set(k) == set(TRAIN_SCHEMA.knobs)
    assert main(["new", "--from", "no_such_recipe", str(tmp_path / "z.py")]) == 2


def test_wizard_with_piped_answers(world, tmp_path, monkeypatch, capsys):
    answers = ["", "16", "lokr", str(world["data"]), "", "512", str(world["comfy"]), "wiz"]
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(answers) + "\n"))
    assert main(["wizard", "--out-dir", str(tmp_path)]) == 0
    said = capsys.readouterr().out
    assert (
        "what to write (train/sample/data) [train]" in said and "dataset kind" in said and "[kohya]" in said
    )
    k = TRAIN_SCHEMA.validate(_knobs(tmp_path / "wiz.py"))
    assert k["ALGO"] == "lokr" and k["RANK"] == 32 and k["AREA"] == 512 * 512 and k["GRAD_ACCUM"] == 2
    assert (tmp_path / "wiz_data.py").is_file()


def test_wizard_rejects_bad_answer_then_accepts(world, tmp_path, monkeypatch, capsys):
    answers = ["sample", "8", str(world["comfy"]), "", "samp"]
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(["trian", *answers]) + "\n"))
    assert main(["wizard", "--out-dir", str(tmp_path)]) == 0
    assert "please answer one of ['train', 'sample', 'data']" in capsys.readouterr().out
    assert SAMPLE_SCHEMA.validate(_knobs(tmp_path / "samp.py"))["ADAPTERS"] == []


# --- check ---------------------------------------------------------------------------------------


@pytest.fixture
def good(world, tmp_path) -> Path:
    out = tmp_path / "user"
    argv = ["new", "train", "--weights", str(world["comfy"]), "--data", str(world["data"]), "--name", "ok"]
    assert main([*argv, "--gpu", "24", "--out-dir", str(out)]) == 0
    return out / "ok.py"


def _check(path: Path, body: str, capsys, *extra: str) -> tuple[int, str]:
    bad = path.with_name("bad.py")
    bad.write_text(path.read_text() + body)
    capsys.readouterr()
    code = main(["check", str(bad), *extra])
    return code, capsys.readouterr().out


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("RANKK = 4\n", "RANKK: unknown knob (did you mean RANK?)"),
        ("RANK = 'sixteen'\n", "RANK: expected int, got str 'sixteen'"),
        ("CAPTION_DROPOUT = 1.5\n", "CAPTION_DROPOUT: 1.5 is above the maximum 1.0"),
        ("LR_SCHEDULE = 'cosin'\n", "LR_SCHEDULE: 'cosin' is not one of"),
        ("VAE = '/no/such/vae.safetensors'\n", "VAE: path '/no/such/vae.safetensors' does not exist"),
        (
            "DATASET = {'kind': 'kohya', 'path': '/no/such/data'}\n",
            "DATASET: path '/no/such/data' does not exist",
        ),
        ("import x_no_such_module\n", "<file>: cannot load"),
        ("BASE_PRECISION = 'fp4'\n", "BASE_PRECISION: 'fp4' is not one of"),
        ("ALGO = 'full'\nBASE_PRECISION = 'fp8'\n", "BASE_PRECISION: 'fp8' stores a frozen base"),
        (
            "ALGO = 'dora'\nBASE_PRECISION = 'fp8_weight'\n",
            "BASE_PRECISION: 'fp8_weight' with ALGO='dora' (DoRA)",
        ),
        ("ALGO = 'oft'\nBASE_PRECISION = 'fp8'\n", "the adapter reads the frozen weight"),
    ],
)
def test_check_names_each_problem(good, capsys, body, expected):
    code, out = _check(good, body, capsys)
    assert code == 1 and expected in out, out


def test_check_unrecognised_weights(good, world, capsys):
    junk = world["junk"] / "diffusion_models" / "mystery.safetensors"
    code, out = _check(good, f"WEIGHTS = {str(junk)!r}\n", capsys)
    assert code == 1 and "WEIGHTS: unrecognised DiT checkpoint" in out and "match no known layout" in out


def test_check_memory_above_the_card(good, capsys):
    """`new` chose a profile for the tiny DiT; priced for moss-image-5b, 'speed' is far above 24 GiB."""
    assert _knobs(good)["MEMORY_PROFILE"] == "speed"
    body = "WEIGHTS = ''\nMODEL_PRESET = 'moss-image-5b'\nTEXT_ENCODE = 'cache'\nVAE_ENCODE = 'cache'\n"
    code, out = _check(good, body, capsys)
    assert code == 1 and "memory: estimated peak" in out and "above the card's 24 GiB" in out, out
    assert "MEMORY_PROFILE 'speed'" in out and "MEMORY_PROFILE='auto' picks c" in out
    assert "plan: profile 'speed'" in out and "saved activations" in out
    code, out = _check(good, body, capsys, "--gpu", "h200")
    assert code == 0 and "saved activations" in out and out.strip().endswith("ok")
    # 'auto' chooses an entry that fits; so does a named profile that fits
    code, out = _check(good, body + "MEMORY_PROFILE = 'auto'\n", capsys)
    assert code == 0 and "plan: auto: catalog entry c" in out and "the fastest that fits 24 GiB" in out, out
    code, out = _check(good, body + "MEMORY_PROFILE = 'speed'\n", capsys, "--gpu", "8")
    assert code == 1 and "above the card's 8 GiB" in out
    code, out = _check(good, body + "MEMORY_PROFILE = 'auto'\n", capsys, "--gpu", "8")
    assert code == 0 and "fits 8 GiB" in out, out
    code, out = _check(good, body + "MEMORY_PROFILE = 'low_vram'\n", capsys, "--gpu", "8")
    assert code == 0, out


def test_check_names_bad_memory_knobs(good, capsys):
    code, out = _check(good, "MEMORY_PROFILE = 'fast'\n", capsys)
    assert code == 1 and "MEMORY_PROFILE: 'fast' is not one of ['auto', 'speed'" in out
    code, out = _check(good, "CHECKPOINTING = 'ful'\nSTREAM_SLOTS = 1\n", capsys)
    assert code == 1 and "CHECKPOINTING: 'ful' is not one of" in out and "(did you mean 'full'?)" in out
    assert "STREAM_SLOTS: 1 is below the minimum 2" in out
    # a combination the plan refuses is named by its knob too
    code, out = _check(good, "MEMORY_PROFILE = 'speed'\nGRAD_OFFLOAD = True\n", capsys)
    assert code == 1 and "GRAD_OFFLOAD: offloaded grads are summed on the host" in out, out


def test_check_says_whether_the_step_is_graphed(good, capsys):
    code, out = _check(good, "MEMORY_PROFILE = 'speed'\n", capsys)
    assert code == 0 and "CUDA graphs: on" in out, out
    code, out = _check(good, "MEMORY_PROFILE = 'speed'\nCHECKPOINTING = 'full'\n", capsys)
    assert code == 0 and "CUDA graphs: on" in out, out  # no dropout: the recomputation reads no RNG state
    ckpt_dropout = "MEMORY_PROFILE = 'speed'\nCHECKPOINTING = 'full'\nDROPOUT = 0.1\n"
    code, out = _check(good, ckpt_dropout, capsys)
    assert code == 0 and "CUDA graphs: off (CHECKPOINTING:" in out, out
    code, out = _check(good, ckpt_dropout + "CUDA_GRAPHS = 'on'\n", capsys)
    assert code == 1 and "CUDA_GRAPHS: 'on' is not possible with this run: CHECKPOINTING" in out, out


def test_check_all_problems_at_once_and_data_schema(good, capsys):
    code, out = _check(good, "RANKK = 4\nSTEPS = 0\n", capsys)
    assert code == 1 and "RANKK" in out and "STEPS: 0 is below the minimum 1" in out and "2 problem(s)" in out
    code, out = _check(good, "", capsys, "--script", "data")
    assert code == 1 and "RANK: unknown knob" in out  # train knobs are not data-script knobs


def test_estimate_matches_the_measured_run():
    """docs/performance/memory.md: moss-image-5b, LoRA r32 on every linear, 8704 tokens, bf16, speed: 53.8 GiB."""
    knobs = {"RANK": 32, "TOKENS_PER_STEP": 8704, "PRECISION": "bf16", "TARGET_PRESET": "full"}
    est = estimate_peak(TrainConfig.from_knobs(knobs), get_preset("moss-image-5b"), params=4_970_396_800)
    mlp = estimate_peak(
        TrainConfig.from_knobs({**knobs, "TARGET_PRESET": "attn-mlp"}),
        get_preset("moss-image-5b"),
        params=4_970_396_800,
    )
    assert abs(mlp.parts["trainable weights"] / 4 - 74.3e6) < 0.5e6
    assert abs(est.total / (1 << 30) / 53.8 - 1) < 0.10
    full = estimate_peak(
        TrainConfig.from_knobs({**knobs, "ALGO": "full"}), get_preset("moss-image-5b"), params=4_970_396_800
    )
    # fp32 weights and grads and Muon's one moment on the card (the 'speed' plan)
    assert full.total > 12 * 4_970_396_800 + est.parts["saved activations"]


# --- profiles ------------------------------------------------------------------------------------


def test_profiles_marks_the_fastest_fit(capsys):
    assert main(["profiles", "--gpu-mem", "8"]) == 0
    out = capsys.readouterr().out
    assert "moss-image-5b (42 blocks, dim 3072)" in out and "card 8 GiB" in out
    rows = {ln.split()[1]: ln for ln in out.splitlines() if ln.split()[:1] and ln.split()[0][:1] in "c-"}
    assert " no " in rows["speed"] and " yes " in rows["minimal"]
    fastest = [ln for ln in out.splitlines() if ln.endswith("<- fastest fit")]
    assert len(fastest) == 1 and " yes " in fastest[0]
    best = fastest[0].split()[0]
    assert f"MEMORY_PROFILE = '{best}'" in out
    from kohakumoss.memory import catalog, fastest_fit

    knobs = {**TRAIN_SCHEMA.defaults(), "MEMORY_PROFILE": "auto"}
    assert (
        fastest_fit(catalog(get_preset("moss-image-5b"), TrainConfig.from_knobs(knobs)), 8 << 30).id == best
    )
    assert main(["profiles", "--gpu-mem", "8", "--all"]) == 0
    out = capsys.readouterr().out
    assert sum(ln.startswith("c0") for ln in out.splitlines()) == 300


def test_profiles_for_a_config_and_without_a_card(good, capsys):
    assert main(["profiles", "--config", str(good), "--tokens", "4096"]) == 0
    out = capsys.readouterr().out
    assert "4096 tokens/step" in out and "card 24 GiB" in out  # the card from the config's _metadata
    assert main(["profiles"]) == 0
    out = capsys.readouterr().out
    assert "card memory unknown" in out and "<- fastest fit" not in out
    assert main(["profiles", "--tokens", "1"]) == 1
    assert "TOKENS_PER_STEP: 1 is below the minimum 2" in capsys.readouterr().err


def test_new_train_writes_the_fastest_fit(world, tmp_path, capsys):
    argv = ["new", "train", "--weights", str(world["comfy"]), "--data", str(world["data"]), "--name", "p"]
    assert main([*argv, "--gpu", "rtx3060", "--out-dir", str(tmp_path)]) == 0
    said = capsys.readouterr().out
    text = (tmp_path / "p.py").read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("MEMORY_PROFILE = "))
    assert "fastest catalog entry that fits 12 GiB" in line and "memory profile: speed" in said
    assert TRAIN_SCHEMA.validate(_knobs(tmp_path / "p.py"))["MEMORY_PROFILE"] == "speed"  # the tiny DiT fits
    assert main(["check", str(tmp_path / "p.py")]) == 0


def test_new_train_chooses_by_the_dit_size(world, tmp_path, monkeypatch, capsys):
    """With the DiT's size that of moss-image-5b, a 12 GB card gets a catalog entry, not 'speed'."""
    from kohakumoss.cli import config_tool

    def big(found, layers, own, card_gb):
        from kohakumoss.cli.config_layers import compose
        from kohakumoss.cli.config_profiles import CatalogView, chosen_profile

        knobs = {**TRAIN_SCHEMA.defaults(), **compose(layers, own)}
        return chosen_profile(CatalogView(knobs, get_preset("moss-image-5b"), "5b", None, 0, 0, card_gb, []))

    monkeypatch.setattr(config_tool, "_memory_profile", big)
    argv = ["new", "train", "--weights", str(world["comfy"]), "--data", str(world["data"]), "--name", "q"]
    assert main([*argv, "--gpu", "12", "--out-dir", str(tmp_path), "--no-check"]) == 0
    value = TRAIN_SCHEMA.validate(_knobs(tmp_path / "q.py"))["MEMORY_PROFILE"]
    assert value != "speed" and (value in ("balanced", "low_vram", "minimal") or value.startswith("c"))


def test_generated_config_runs_under_kogine(good, tmp_path):
    script = tmp_path / "show.py"
    script.write_text(
        "RANK = 0\nALGO = ''\nWEIGHTS = ''\n\n\ndef main():\n    print(RANK, ALGO, WEIGHTS)\n\n\n"
        "if __name__ == '__main__':\n    main()\n"
    )
    kogine = Path(sys.executable).with_name("kogine")
    res = subprocess.run(
        [str(kogine), "run", str(script), "--config", str(good)], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.split()[:2] == ["32", "lora"] and "moss_image.safetensors" in res.stdout.splitlines()[0]


def test_new_with_a_lone_dit_file(world, tmp_path, capsys):
    dit = world["comfy"] / "diffusion_models" / "moss_image.safetensors"
    argv = ["new", "train", "--weights", str(dit), "--data", str(world["data"]), "--name", "lone"]
    assert main([*argv, "--gpu", "80", "--out-dir", str(tmp_path)]) == 0
    assert "set TEXT_ENCODER, TOKENIZER and VAE" in capsys.readouterr().out
    k = TRAIN_SCHEMA.validate(_knobs(tmp_path / "lone.py"))
    assert k["WEIGHTS"] == str(dit) and k["TEXT_ENCODER"] == "" and k["RANK"] == 64


def test_source_guess(tmp_path):
    from kohakumoss.cli.config_dataset import guess_source

    (tmp_path / "m.jsonl").write_text("")
    (tmp_path / "tars").mkdir()
    (tmp_path / "tars" / "000.tar").write_bytes(b"")
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "shard-00000.safetensors").write_bytes(b"")
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "a.png").write_bytes(b"")
    got = [guess_source(tmp_path / n) for n in ("m.jsonl", "tars", "shards", "plain")]
    assert got == ["jsonl", "webdataset", "shards", "folder"]


# --- answers checked as given; --no-check keeps what the user gave -----------------------------------


def test_wizard_says_a_bad_gpu_at_once_and_keeps_the_answers(world, tmp_path, monkeypatch, capsys):
    answers = ["", "rtx9999", "16", "lokr", str(world["data"]), "", "512", str(world["comfy"]), "wiz"]
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(answers) + "\n"))
    assert main(["wizard", "--out-dir", str(tmp_path)]) == 0
    said = capsys.readouterr().out
    # the card is refused before the next question is asked, then asked again
    bad = said.index("unknown card 'rtx9999'")
    assert said.index("GPU: auto") < bad < said.index("algorithm")
    assert said.count("GPU: auto, a card name") == 2
    k = TRAIN_SCHEMA.validate(_knobs(tmp_path / "wiz.py"))
    assert k["ALGO"] == "lokr" and k["AREA"] == 512 * 512 and k["GRAD_ACCUM"] == 2


def test_wizard_asks_again_for_missing_data_weights_and_a_taken_name(world, tmp_path, monkeypatch, capsys):
    (tmp_path / "taken.py").write_text("")
    answers = [
        "train", "24", "lora",
        str(tmp_path / "nope"), str(world["data"]), "", "1mp",
        str(world["junk"]), str(world["comfy"]),
        "taken", "fresh",
    ]  # fmt: skip
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(answers) + "\n"))
    assert main(["wizard", "--out-dir", str(tmp_path)]) == 0
    said = capsys.readouterr().out
    assert f"'{tmp_path / 'nope'}' does not exist: please answer again" in said
    assert "WEIGHTS:" in said and "taken.py exists" in said
    k = TRAIN_SCHEMA.validate(_knobs(tmp_path / "fresh.py"))
    assert k["DATASET"]["path"] == str(world["data"].resolve()) and "moss_image" in k["WEIGHTS"]


def test_wizard_that_runs_out_of_answers_says_them_as_a_new_command(world, tmp_path, monkeypatch, capsys):
    answers = ["train", "12", "loha", str(world["data"]), "", "512", "/no/such/models"]
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(answers) + "\n"))
    assert main(["wizard", "--out-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    line = next(ln for ln in err.splitlines() if ln.startswith("your answers so far: "))
    assert "--gpu 12 --algo loha" in line and f"--data {world['data']}" in line and "--resolution 512" in line
    assert not list(tmp_path.glob("*.py"))


def test_wizard_no_check_keeps_weights_with_problems(world, tmp_path, monkeypatch, capsys):
    answers = ["sample", "8", str(world["junk"]), "", "samp"]
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(answers) + "\n"))
    assert main(["wizard", "--out-dir", str(tmp_path), "--no-check"]) == 0
    assert "(kept: --no-check)" in capsys.readouterr().out
    # the file found there (not a DiT it recognises) is written, not an empty knob
    assert SAMPLE_SCHEMA.validate(_knobs(tmp_path / "samp.py"))["WEIGHTS"].startswith(str(world["junk"]))


@pytest.mark.parametrize("weights", ["missing", "junk"])
def test_no_check_never_drops_the_weights_given(world, tmp_path, weights, capsys):
    path = str(tmp_path / "not-there") if weights == "missing" else str(world["junk"])
    argv = ["new", "train", "--weights", path, "--data", str(world["data"]), "--name", "nc"]
    assert main([*argv, "--gpu", "24", "--out-dir", str(tmp_path)]) == 1  # refused without --no-check
    assert main([*argv, "--gpu", "24", "--out-dir", str(tmp_path), "--no-check"]) == 0
    assert _knobs(tmp_path / "nc.py")["WEIGHTS"].startswith(path)
    target = tmp_path / "r.py"
    assert main(["new", "--from", "lora_8g", str(target), "--weights", path, "--no-check"]) == 0
    assert _knobs(target)["WEIGHTS"].startswith(path)
    assert main(["new", "--from", "lora_8g", str(tmp_path / "r2.py"), "--weights", path]) == 1


def test_check_prices_a_data_parallel_rank_for_its_share_of_the_step(good, capsys):
    """Under DDP on 4 GPUs a rank holds about a quarter of the step's tokens: its saved activations are
    priced for that share, as the trainer plans them (memory.profiles.rank_share)."""
    body = (
        "WEIGHTS = ''\nMODEL_PRESET = 'moss-image-5b'\nTEXT_ENCODE = 'cache'\nVAE_ENCODE = 'cache'\n"
        "TOKENS_PER_STEP = 8 * (4096 + 256)\nAREA = 1024 * 1024\nMAX_TEXT_TOKENS = 256\n"
    )

    def saved(out: str) -> float:
        line = next(x for x in out.splitlines() if "saved activations" in x)
        return float(re.search(r"([\d.]+) GiB", line).group(1))

    _, one = _check(good, body, capsys, "--gpu", "h200")
    _, four = _check(good, body + "DISTRIBUTED = 'ddp'\nDEVICES = 4\n", capsys, "--gpu", "h200")
    # 2 samples' tokens plus 3/4 of one, of the step's 8
    assert saved(four) == pytest.approx(saved(one) * 2.75 / 8, rel=0.02), (one, four)

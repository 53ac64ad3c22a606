"""The export and sample scripts on a tiny trained run; every script's knobs equal its schema."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from kohakumoss.config.export import EXPORT_SCHEMA
from kohakumoss.config.sample import SAMPLE_SCHEMA
from kohakumoss.config.train import TRAIN_SCHEMA
from kohakumoss.train.loop import train
from kohakumoss_common.knobs import run_checked

from .conftest import tiny_knobs

ROOT = Path(__file__).resolve().parents[2]


def script_defaults(path: Path) -> dict:
    tree = ast.parse(path.read_text())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name.isupper():
                out[name] = ast.literal_eval(node.value)
    return out


@pytest.mark.parametrize(
    "script, schema",
    [
        ("scripts/train/moss.py", TRAIN_SCHEMA),
        ("scripts/sample/sample.py", SAMPLE_SCHEMA),
        ("scripts/export/export.py", EXPORT_SCHEMA),
    ],
)
def test_script_knobs_equal_schema_defaults(script, schema):
    assert script_defaults(ROOT / script) == schema.defaults()


def load_script(path: str):
    import runpy

    return runpy.run_path(str(ROOT / path), run_name="kohakumoss_test")


@pytest.fixture(scope="module")
def trained(train_world) -> Path:
    return train(
        tiny_knobs(train_world, "scripts", STEPS=4, SAVE_FORMAT="both", SAVE_EVERY=2, EMA=True, EMA_WARMUP=0)
    )


def test_export_script_reexports_a_checkpoint(trained, tmp_path):
    ns = load_script("scripts/export/export.py")
    ckpt = trained / "checkpoints" / "step_00000004"
    knobs = {
        **ns,
        "MODEL_PRESET": "tiny",
        "ADAPTER": str(ckpt),
        "OUT": str(tmp_path),
        "NAME": "again",
        "SAVE_MERGED": True,
    }
    assert run_checked(EXPORT_SCHEMA, knobs, ns["run"], "export.py") == 0
    for name in ("again-comfy.safetensors", "lycoris/again.safetensors"):
        fresh, original = (
            load_file(tmp_path / name),
            load_file(ckpt / "export" / name.replace("again", "scripts")),
        )
        assert fresh.keys() == original.keys() and all(torch.equal(fresh[k], original[k]) for k in fresh), (
            name
        )
    assert (tmp_path / "merged").is_dir()
    ema = {**knobs, "OUT": str(tmp_path / "ema"), "USE_EMA": True, "SAVE_MERGED": False}
    assert run_checked(EXPORT_SCHEMA, ema, ns["run"], "export.py") == 0
    raw, averaged = (
        load_file(tmp_path / "lycoris" / "again.safetensors"),
        load_file(tmp_path / "ema" / "lycoris" / "again.safetensors"),
    )
    assert any(not torch.equal(raw[k], averaged[k]) for k in raw)


def test_export_script_refuses_a_disk_without_room_before_writing(trained, tmp_path, monkeypatch, capsys):
    import kohakumoss_common.io as io

    ns = load_script("scripts/export/export.py")
    out = tmp_path / "out"
    knobs = {**ns, "MODEL_PRESET": "tiny", "ADAPTER": str(trained / "checkpoints" / "step_00000004"),
             "OUT": str(out), "NAME": "again", "SAVE_MERGED": True}  # fmt: skip
    monkeypatch.setattr(io, "free_bytes", lambda path: 1000)
    assert run_checked(EXPORT_SCHEMA, knobs, ns["run"], "export.py") == 2
    err = capsys.readouterr().err
    assert re.search(r"not enough disk space: needs [0-9.]+ MiB, 0.0 MiB free", err) and str(out) in err
    assert not out.exists() or not any(out.iterdir())


def test_export_script_names_bad_knobs(capsys):
    ns = load_script("scripts/export/export.py")
    assert run_checked(EXPORT_SCHEMA, {**ns, "ADAPTER": "/no/such/file"}, ns["run"], "export.py") == 2
    assert "ADAPTER: path '/no/such/file' does not exist" in capsys.readouterr().err


def test_sample_script_writes_pngs_with_settings_and_a_grid(trained, train_world, tmp_path):
    ns = load_script("scripts/sample/sample.py")
    world = {k: v for k, v in train_world.items() if k in SAMPLE_SCHEMA.knobs}
    base = {
        **ns,
        **world,
        "MODEL_PRESET": "tiny",
        "DEVICE": "cpu",
        "PRECISION": "fp32",
        "STEPS": 3,
        "UNCOND_SKIP_LAYERS": [1],  # the released [22] needs a 23-block model; tiny has 4
        "WIDTH": 48,
        "HEIGHT": 32,
        "COUNT": 2,
    }
    lora = trained / "export" / "lycoris" / "scripts.safetensors"
    with_adapter = {
        **base,
        "PROMPT": "blue glass hexagons",
        "ADAPTERS": [[str(lora), 1.0]],
        "OUT_DIR": str(tmp_path / "a"),
    }
    assert run_checked(SAMPLE_SCHEMA, with_adapter, ns["run"], "sample.py") == 0
    pngs = sorted((tmp_path / "a").glob("0*.png"))
    assert len(pngs) == 2 and (tmp_path / "a" / "grid.png").exists()
    info = json.loads(Image.open(pngs[0]).text["kohakumoss"])
    assert info["prompt"] == "blue glass hexagons" and info["seed"] == 0 and info["adapters"][0][1] == 1.0
    assert Image.open(pngs[0]).size == (48, 32)
    without = {**base, "PROMPT": "blue glass hexagons", "OUT_DIR": str(tmp_path / "b")}
    assert run_checked(SAMPLE_SCHEMA, without, ns["run"], "sample.py") == 0
    a, b = (
        torch.tensor(list(Image.open(d / pngs[0].name).tobytes())) for d in (tmp_path / "a", tmp_path / "b")
    )
    assert not torch.equal(a, b)  # the adapter changes the picture
    comfy = trained / "export" / "scripts-comfy.safetensors"  # the default export, merged into the weights
    with_comfy = {**with_adapter, "ADAPTERS": [str(comfy)], "OUT_DIR": str(tmp_path / "c")}
    assert run_checked(SAMPLE_SCHEMA, with_comfy, ns["run"], "sample.py") == 0
    c = torch.tensor(list(Image.open(tmp_path / "c" / pngs[0].name).tobytes()))
    assert (c.int() - a.int()).abs().max() <= 3  # same picture as the LyCORIS file, up to rounding
    for adapters, name in (([[str(lora), 1.0]], "lycoris"), ([str(comfy)], "comfy")):
        streamed = {
            **with_adapter,
            "ADAPTERS": adapters,
            "STREAM_BLOCKS": -1,
            "OUT_DIR": str(tmp_path / name),
        }
        assert run_checked(SAMPLE_SCHEMA, streamed, ns["run"], "sample.py") == 0
        s = torch.tensor(list(Image.open(tmp_path / name / pngs[0].name).tobytes()))
        ref = a if name == "lycoris" else c
        assert torch.equal(s, ref), name  # streaming every block moves the weights, not the picture


def test_sample_script_on_an_fp8_base(trained, train_world, tmp_path, capsys):
    """BASE_PRECISION fp8_weight: the LyCORIS file runs beside the fp8 base, the picture close to the
    full-precision one; the ComfyUI file draws the same picture."""
    ns = load_script("scripts/sample/sample.py")
    world = {k: v for k, v in train_world.items() if k in SAMPLE_SCHEMA.knobs}
    lora = trained / "export" / "lycoris" / "scripts.safetensors"
    base = {**ns, **world, "MODEL_PRESET": "tiny", "DEVICE": "cpu", "PRECISION": "fp32", "STEPS": 3,
            "UNCOND_SKIP_LAYERS": [1], "WIDTH": 48, "HEIGHT": 32, "PROMPT": "blue glass hexagons", "ADAPTERS": [[str(lora), 1.0]]}  # fmt: skip
    pics = {}
    for mode in ("same", "fp8_weight"):
        out = tmp_path / mode
        assert (
            run_checked(SAMPLE_SCHEMA, {**base, "BASE_PRECISION": mode, "OUT_DIR": str(out)}, ns["run"], "s")
            == 0
        )
        pics[mode] = torch.tensor(list(Image.open(out / "0000_seed0.png").tobytes())).float()
    diff = (pics["fp8_weight"] - pics["same"]).abs()
    assert 0 < diff.mean() < 8  # fp8's rounding moves pixels a little, not the picture
    # the ComfyUI LoRA file (fused qkv) loads back as unmerged LoRA modules: it runs beside the fp8 base
    # and draws the LyCORIS file's picture
    comfy = trained / "export" / "scripts-comfy.safetensors"
    out = tmp_path / "c"
    run = {**base, "BASE_PRECISION": "fp8_weight", "ADAPTERS": [[str(comfy), 1.0]], "OUT_DIR": str(out)}
    assert run_checked(SAMPLE_SCHEMA, run, ns["run"], "s") == 0
    pic = torch.tensor(list(Image.open(out / "0000_seed0.png").tobytes())).float()
    assert (pic - pics["fp8_weight"]).abs().mean() < 1


def test_export_script_out_names_the_comfy_file_and_save_format_picks_the_files(trained, tmp_path, capsys):
    ns = load_script("scripts/export/export.py")
    ckpt = trained / "checkpoints" / "step_00000004"
    base = {**ns, "MODEL_PRESET": "tiny", "ADAPTER": str(ckpt)}
    out = tmp_path / "my-lora.safetensors"
    assert run_checked(EXPORT_SCHEMA, {**base, "OUT": str(out)}, ns["run"], "export.py") == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "my-lora-lycoris",
        "my-lora.safetensors",
    ]
    for mine, theirs in (
        (out, "scripts-comfy"),
        (tmp_path / "my-lora-lycoris" / "my-lora.safetensors", "lycoris/scripts"),
    ):
        fresh, original = load_file(mine), load_file(ckpt / "export" / f"{theirs}.safetensors")
        assert fresh.keys() == original.keys() and all(torch.equal(fresh[k], original[k]) for k in fresh)
    only = tmp_path / "only" / "comfy.safetensors"
    knobs = {**base, "OUT": str(only), "SAVE_FORMAT": "comfy"}
    assert run_checked(EXPORT_SCHEMA, knobs, ns["run"], "export.py") == 0
    assert [p.name for p in only.parent.iterdir()] == ["comfy.safetensors"]
    folder = {**base, "OUT": str(tmp_path / "folder"), "NAME": "f", "SAVE_FORMAT": "hf"}
    assert run_checked(EXPORT_SCHEMA, folder, ns["run"], "export.py") == 0
    assert [
        p.relative_to(tmp_path / "folder").as_posix() for p in (tmp_path / "folder").rglob("*.safetensors")
    ] == ["lycoris/f.safetensors"]
    capsys.readouterr()
    named = {**base, "OUT": str(tmp_path / "x.safetensors"), "NAME": "again"}
    assert run_checked(EXPORT_SCHEMA, named, ns["run"], "export.py") == 2
    assert "NAME" in capsys.readouterr().err and not (tmp_path / "x.safetensors").exists()
    bad = {**base, "SAVE_FORMAT": "comfyui"}
    assert run_checked(EXPORT_SCHEMA, bad, ns["run"], "export.py") == 2
    assert "SAVE_FORMAT" in capsys.readouterr().err

"""The Python helpers of the example scripts: write_config.py (write, check) and stack_grid.py."""

from __future__ import annotations

import pytest
from PIL import Image

from .conftest import load_script

engine = pytest.importorskip("kohakuengine", reason="kohaku-engine (kogine) is not installed")
write_config = load_script("write_config")
stack_grid = load_script("stack_grid")


def values(path) -> dict:
    return {k: v for k, v in engine.load_config_file(str(path)).globals_dict.items() if k.isupper()}


def test_write_extends_a_base_and_keeps_odd_strings(tmp_path):
    base = tmp_path / "user" / "run.py"
    base.parent.mkdir()
    base.write_text("STEPS = 1000\nRANK = 16\nADAPTERS = ['x']\n")
    out = tmp_path / "user" / "run_example.py"
    windows = "C:\\new\\table.safetensors"
    assert (
        write_config.main(
            [
                *("write", str(out), "--base", str(base), "--int", "STEPS=30", "--float", "CFG=4.5"),
                *("--str", "PROMPT=a \"quoted\" 'prompt'\\n", "--bool", "GRID=false", "--ints", "SEEDS=3,4"),
                *("--item", "SAMPLE_PROMPTS=one", "--item", "SAMPLE_PROMPTS=two"),
                *("--adapter", windows, "--multiplier", "0.5", "--adapter", "b.safetensors"),
            ]
        )
        == 0
    )
    assert "use_config('run.py')" in out.read_text()  # a sibling: relative, so the folder can move
    got = values(out)
    assert got["STEPS"] == 30 and got["RANK"] == 16  # own knobs win, the base fills the rest
    assert got["CFG"] == 4.5 and got["GRID"] is False and got["SEEDS"] == [3, 4]
    assert got["PROMPT"] == "a \"quoted\" 'prompt'\\n"
    assert got["SAMPLE_PROMPTS"] == ["one", "two"]
    assert got["ADAPTERS"] == [[windows, 0.5], "b.safetensors"]
    row = tmp_path / "grid" / "configs" / "base.py"
    write_config.main(["write", str(row), "--base", str(out), "--no-adapters", "--str", "OUT_DIR=g/base"])
    got = values(row)
    assert got["ADAPTERS"] == [] and got["STEPS"] == 30 and got["OUT_DIR"] == "g/base"


def test_plain_config_from_a_comfy_folder(weights, dataset, tmp_path):
    (weights / "text_encoders" / "clip_l.safetensors").write_bytes(b"")  # not the one: no 'qwen'
    # where the README's `hf download ... --local-dir text_encoders/qwen3.5_tokenizer` puts it; a folder
    # named so that holds no tokenizer is passed over
    fetched = weights / "text_encoders" / "qwen3.5_tokenizer" / "tokenizer"
    fetched.mkdir(parents=True)
    (fetched / "tokenizer_config.json").write_text("{}")
    (weights / "text_encoders" / "a_tokenizer").mkdir()
    out = tmp_path / "plain.py"
    args = ["write", str(out), "--weights", str(weights), "--data", str(dataset)]
    write_config.main([*args, "--prompts-from", f"SAMPLE_PROMPTS={dataset}"])
    got = values(out)
    assert got["WEIGHTS"] == str(weights / "diffusion_models" / "moss_image_base.safetensors")
    assert got["TEXT_ENCODER"] == str(weights / "text_encoders" / "qwen3.5_9b.safetensors")
    assert got["VAE"] == str(weights / "vae" / "flux2-vae_small.safetensors")
    assert got["TOKENIZER"] == str(fetched)
    assert got["DATASET"] == {"kind": "kohya", "path": str(dataset)}
    assert got["SAMPLE_PROMPTS"] == ["a red lighthouse, watercolor", "a harbour at night, watercolor"]


def test_plain_config_from_an_hf_snapshot(tmp_path):
    for sub in ("transformer", "text_encoder", "vae", "tokenizer"):
        (tmp_path / "hf" / sub).mkdir(parents=True)
    got = write_config.weights_knobs(tmp_path / "hf")
    assert got == {k: str(tmp_path / "hf" / s) for k, s in [
        ("WEIGHTS", "transformer"), ("TEXT_ENCODER", "text_encoder"), ("VAE", "vae"), ("TOKENIZER", "tokenizer")
    ]}  # fmt: skip


def test_plain_config_names_what_is_missing(weights, tmp_path):
    with pytest.raises(SystemExit, match="neither a ComfyUI models folder"):
        write_config.weights_knobs(tmp_path)
    (weights / "vae" / "flux2-vae_small.safetensors").unlink()
    with pytest.raises(SystemExit, match="no file for VAE under"):
        write_config.weights_knobs(weights)
    with pytest.raises(SystemExit, match="UPPER_CASE knob, got 'steps=3'"):
        write_config.main(["write", str(tmp_path / "x.py"), "--int", "steps=3"])


def test_check_reports_bad_knobs_by_name(tmp_path, capsys):
    good = tmp_path / "good.py"
    good.write_text("PROMPT = 'a fox'\nSTEPS = 8\nADAPTERS = []\n")
    assert write_config.main(["check", str(good), "--script", "sample"]) == 0
    bad = tmp_path / "bad.py"
    bad.write_text(f"PROMT = 'a fox'\nSTEPS = 0\nVAE = {str(tmp_path / 'nope')!r}\n")
    assert write_config.main(["check", str(bad), "--script", "sample"]) == 1
    err = capsys.readouterr().err
    assert "PROMT: unknown knob (did you mean PROMPT?)" in err
    assert "STEPS: 0 is below the minimum 1" in err
    assert "VAE: path" in err and "does not exist" in err


def _png(path, color, size=(32, 48)):
    Image.new("RGB", size, color).save(path)


def test_stack_grid_rows_and_columns(tmp_path):
    for row, color in (("base", "red"), ("step_00010", "blue")):
        (tmp_path / row).mkdir()
        for i, seed in enumerate((7, 8, 9)):
            _png(tmp_path / row / f"{i:04d}_seed{seed}.png", color)
        _png(tmp_path / row / "grid.png", "green", (5, 5))  # not a sample: ignored
    out = tmp_path / "g" / "grid.png"
    assert stack_grid.main([str(out), str(tmp_path / "base"), str(tmp_path / "step_00010")]) == 0
    im = Image.open(out)
    # kohakumoss.diffusion.grid's label column and caption header, then cells 256 px wide (one scale)
    label_w, header = im.width - 3 * 256, im.height - 2 * 384
    assert label_w > 0 and header > 0
    assert im.getpixel((label_w + 10, header + 10)) == (255, 0, 0)
    assert im.getpixel((label_w + 2 * 256 + 10, header + 384 + 10)) == (0, 0, 255)
    assert im.getpixel((label_w - 1, header + 10)) == (255, 255, 255)
    assert [s for s, _ in stack_grid.row_images(tmp_path / "base")] == [7, 8, 9]
    (tmp_path / "empty").mkdir()
    assert stack_grid.main([str(out), str(tmp_path / "empty")]) == 1

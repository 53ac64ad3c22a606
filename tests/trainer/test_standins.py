"""`kohakumoss-standins`: tiny random weights in the Comfy-Org and HF trees that the loaders and the trainer
take exactly as they take the real downloads (no MODEL_PRESET: WEIGHTS is read and its config inferred)."""

from __future__ import annotations

import pytest

from kohakumoss.cli.standins import main
from kohakumoss.train.loop import train

from .conftest import tiny_knobs


@pytest.mark.parametrize("layout", ["comfy", "hf"])
def test_standins_train_and_export_like_the_real_files(train_world, tmp_path, layout, capsys):
    assert main(["--out", str(tmp_path / layout), "--layout", layout]) == 0
    printed = capsys.readouterr().out
    paths = dict(
        line.strip().split(" = ") for line in printed.splitlines() if line.startswith("  ") and " = " in line
    )
    paths = {k: v.strip("'") for k, v in paths.items()}
    assert set(paths) == {"WEIGHTS", "TEXT_ENCODER", "TOKENIZER", "VAE"}
    if layout == "comfy":  # the ComfyUI models tree, the tokenizer beside the text encoder
        assert paths["WEIGHTS"].endswith("models/diffusion_models/moss_image_standin.safetensors")
        assert paths["TOKENIZER"].endswith("models/text_encoders/qwen3.5_tokenizer")
    knobs = tiny_knobs(
        train_world, f"standins-{layout}", STEPS=2, MODEL_PRESET="", TEXT_TEMPLATE="chat", **paths
    )
    run = train(knobs)
    assert (run / "export").is_dir() and any((run / "export").glob("*.safetensors"))

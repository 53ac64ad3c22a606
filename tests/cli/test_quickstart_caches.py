"""The quickstart (docs/guides/first-lora.md steps 5 to 7) on every GPU layer: training reads the caches
that the data scripts filled, and encodes nothing again.

The weights are a tiny Comfy-Org-shaped models folder (a ConvRot int8 DiT, a ConvRot int8 single-file text
encoder with its tokenizer fetched into text_encoders/ as the README's command puts it, a single-file VAE); the
config tool writes the configs, the user appends the knobs that keep a CPU run short (to the training
config: the data config reads them from there), the data scripts run as kogine runs them, then the
trainer runs two steps (several epochs, each flipping images anew) while every encoder call is counted.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from kohakumoss.cli import config_gpu
from kohakumoss.cli.config_layers import GPU_SIZES, load_file
from kohakumoss.cli.config_tool import main
from kohakumoss.encoders import ImageVAE, TextEncoder
from tests.tiny_trees import write_comfy_models

REPO = Path(__file__).resolve().parents[2]
CAPTIONS = ["a blue glass tile", "a golden square grid", "brown wood planks"]
# a short CPU run: small crops, two steps, no checkpoints; what the user may add to their config file
SHORT_RUN = {
    "AREA": 64 * 64,
    "MIN_SIDE": 32,
    "STEPS": 2,  # two epochs of three images (one micro-step each), each flipped anew
    "GRAD_ACCUM": 1,
    "FLIP_PROB": 0.5,
    "PRECISION": "fp32",  # bf16 matmuls are slow on a CPU (the encoders run in fp32 here either way)
    "WORKERS": 0,
    "SAVE_EVERY": 0,
    "SAMPLE_PROMPTS": [],
    "OPS_BACKEND": "eager",
    "VAL_ITEMS": 0,
}
GPUS = [f"vram_{gb}g" for gb in GPU_SIZES] + ["auto"]  # 'auto' on this machine: no GPU found


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    """ComfyUI/models as the README's commands fill it (tests/tiny_trees.py: ConvRot int8 DiT and text
    encoder, single-file VAE, the tokenizer in text_encoders/qwen3.5_tokenizer/tokenizer)."""
    return write_comfy_models(tmp_path_factory.mktemp("quickstart") / "ComfyUI" / "models", CAPTIONS)


@pytest.fixture(scope="module")
def dataset(models) -> Path:
    data = models.parents[1] / "data" / "my_set"
    (data / "2_style").mkdir(parents=True)
    for i, caption in enumerate(CAPTIONS):
        Image.new("RGB", (64 + 16 * i, 48), (60 * i, 120, 200 - 50 * i)).save(data / "2_style" / f"{i}.png")
        (data / "2_style" / f"{i}.txt").write_text(caption)
    return data


def kogine_data_script(script: str, config: Path) -> None:
    """`kogine run scripts/data/SCRIPT --config CONFIG`, in this process."""
    import kohakuengine as engine

    run = engine.Script(str(REPO / "scripts" / "data" / script))
    run.config = engine.load_config_file(str(config))
    try:
        engine.ScriptExecutor(run).execute()
    except SystemExit as e:  # the data scripts exit through run_checked: 0 done, 2 a named problem
        assert not e.code, f"{script} exited {e.code}"


class EncoderCalls:
    """Every text-encoder and VAE encode of the patched classes (training's and the data scripts')."""

    def __init__(self, monkeypatch):
        self.captions: list[str] = []
        self.images = 0
        text_encode, vae_encode = TextEncoder.encode, ImageVAE.encode

        def count_text(encoder, captions, *args, **kwargs):
            self.captions += list(captions)
            return text_encode(encoder, captions, *args, **kwargs)

        def count_images(vae, images, *args, **kwargs):
            self.images += len(images)
            return vae_encode(vae, images, *args, **kwargs)

        monkeypatch.setattr(TextEncoder, "encode", count_text)
        monkeypatch.setattr(ImageVAE, "encode", count_images)


def cache_files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and p.suffix != ".lock"}


@pytest.mark.parametrize("gpu", GPUS)
def test_training_reads_what_the_data_scripts_cached(models, dataset, gpu, tmp_path, monkeypatch):
    from kohakumoss.train.loop import train

    monkeypatch.setattr(config_gpu, "detect_gpu", lambda: None)
    monkeypatch.chdir(tmp_path)  # CACHE_DIR and RUNS_DIR as written: relative to where the user runs
    # 5. a config for the GPU and dataset; the user's own knobs go at the end of the training config
    assert (
        main(["new", "train", "--weights", str(models), "--data", str(dataset), "--name", "q", "--gpu", gpu])
        == 0
    )
    config, data_config = Path("configs/user/q.py"), Path("configs/user/q_data.py")
    with config.open("a") as f:
        f.writelines(f"{k} = {v!r}\n" for k, v in SHORT_RUN.items())
    assert main(["check", str(config)]) == 0
    assert main(["check", str(data_config)]) == 0
    # 6. cache the text and the latents
    calls = EncoderCalls(monkeypatch)
    kogine_data_script("cache_text.py", data_config)
    kogine_data_script("cache_latents.py", data_config)
    assert sorted(set(calls.captions)) == sorted(CAPTIONS) and calls.images >= len(CAPTIONS)
    cache = Path(load_file(config)[0]["CACHE_DIR"])
    cached = cache_files(cache)
    # 7. train: nothing the data scripts cached is encoded again, and no second cache appears
    calls.captions, calls.images = [], 0
    run = train(load_file(config)[0])
    assert (run / "checkpoints").is_dir() or (run / "log.txt").is_file()
    assert calls.captions == [] and calls.images == 0, (
        f"training encoded again: {calls.captions}, {calls.images} images"
    )
    assert cache_files(cache) == cached

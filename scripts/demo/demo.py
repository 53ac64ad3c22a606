"""The embedded demo: train a LoRA on a tiny MOSS-architecture model in a few minutes, on any machine.

    kogine run scripts/demo/demo.py            (or: python scripts/demo/demo.py)

Everything is built here, nothing is downloaded: a tiny random MOSS backbone (the `tiny` preset), a
tiny random Qwen3.5 text encoder with a word-level tokenizer made from the captions, and the small
FLUX.2-shaped VAE in assets/demo/vae (trained on the demo pictures by make_demo_vae.py, so it
reconstructs them). The four pictures in assets/demo/images are public domain or CC0 (see
assets/demo/README.md). The run writes RUNS_DIR/RUN_NAME/: log.txt, metrics.jsonl, loss.png,
samples/grid_step_XXXXX.png (the base model's row above the LoRA's, same seeds per column) and
export/ with the ComfyUI-format and LyCORIS files, and prints how much closer the LoRA row is to the
training pictures than the base row (`resemblance`). On a GPU the same command runs there.
"""

import sys

RUN_NAME = "demo"  # run folder name
RUNS_DIR = "runs/moss"  # where runs are written
STEPS = 450  # optimizer steps
LR = 1.5e-3  # learning rate (3e-3 and up left the LoRA row farther from the pictures: assets/demo/README.md)
RANK = 32  # LoRA rank
DEVICE = "auto"  # auto, cpu or cuda
SEED = 0  # seed of the random base model, the plan and the noise
SAMPLE_STEPS = 24  # sampler steps of the grid


def colour_histogram(image, bins: int = 8):
    """Joint RGB histogram (bins^3 cells), summing to 1: where the colours are, not where they sit."""
    import numpy as np

    q = (np.asarray(image.convert("RGB")) // (256 // bins)).reshape(-1, 3).astype(np.int64)
    counts = np.bincount((q[:, 0] * bins + q[:, 1]) * bins + q[:, 2], minlength=bins**3)
    return counts / counts.sum()


def picture_distances(generated, training) -> dict[str, float]:
    """'hist': L1 distance of the colour histograms (0..2); 'mse16': pixel MSE after fitting both to 16x16."""
    import numpy as np
    from PIL import Image, ImageOps

    def small(im):
        return np.asarray(ImageOps.fit(im.convert("RGB"), (16, 16), Image.LANCZOS), dtype=np.float64) / 255

    return {
        "hist": float(np.abs(colour_histogram(generated) - colour_histogram(training)).sum()),
        "mse16": float(((small(generated) - small(training)) ** 2).mean()),
    }


def resemblance(run_dir, pictures: dict, step: int) -> dict[str, dict[str, float]]:
    """Mean distance from each grid picture to its prompt's training picture, per row ('base', 'lora').

    `pictures` maps each sample prompt, in grid order, to its training picture's path.
    """
    from pathlib import Path

    from PIL import Image

    from kohakumoss.checkpoint.folders import step_dirname

    samples = Path(run_dir) / "samples"
    rows = {
        "base": samples / "base" / "base_{:02d}.png",
        "lora": samples / step_dirname(step) / "sample_{:02d}.png",
    }
    out = {}
    for row, pattern in rows.items():
        found = [
            picture_distances(Image.open(str(pattern).format(i)), Image.open(path))
            for i, path in enumerate(pictures.values())
        ]
        out[row] = {key: sum(d[key] for d in found) / len(found) for key in found[0]}
    return out


def run(k: dict) -> dict[str, dict[str, float]]:
    import shutil
    from pathlib import Path

    import torch

    from kohakumoss.config.train import TRAIN_SCHEMA
    from kohakumoss.encoders.tiny import write_tiny_text_encoder
    from kohakumoss.train.loop import train

    root = Path(__file__).resolve().parents[2]
    images = root / "assets" / "demo" / "images"
    pictures = {
        p.read_text(encoding="utf-8").strip(): p.with_suffix(".jpg") for p in sorted(images.rglob("*.txt"))
    }
    captions = sorted(pictures)
    run_dir = Path(k["RUNS_DIR"]) / k["RUN_NAME"]
    work = run_dir / "demo_assets"
    if work.is_dir():  # an earlier demo run: the demo starts over (the trainer refuses a used run folder)
        print(f"replacing the earlier demo run in {run_dir}")
        shutil.rmtree(run_dir)
    text = write_tiny_text_encoder(work / "text_encoder", captions, seed=int(k["SEED"]))
    knobs = TRAIN_SCHEMA.validate(
        dict(
            MODEL_PRESET="tiny",
            TEXT_ENCODER=text.path,
            TOKENIZER=text.tokenizer_path,
            TEXT_TEMPLATE=text.template,
            VAE=str(root / "assets" / "demo" / "vae"),
            DEVICE=k["DEVICE"],
            PRECISION="fp32",
            DATASET={"kind": "kohya", "path": str(images)},
            CATALOG_DIR=str(work / "catalog"),
            CACHE_DIR=str(work / "cache"),
            AREA=128 * 128,
            MIN_SIDE=64,
            TOKENS_PER_STEP=340,
            MAX_TEXT_TOKENS=16,
            WORKERS=0,
            ALGO="lora",
            RANK=int(k["RANK"]),
            ALPHA=float(k["RANK"]),
            TARGET_PRESET="full",
            BYPASS=True,
            LR=float(k["LR"]),
            LR_SCHEDULE="cosine",
            LR_WARMUP_STEPS=20,
            STEPS=int(k["STEPS"]),
            TIMESTEP_SHIFT="none",
            SEED=int(k["SEED"]),
            RUNS_DIR=k["RUNS_DIR"],
            RUN_NAME=k["RUN_NAME"],
            SAVE_EVERY=0,
            LOG_EVERY=1,
            SAVE_FORMAT="both",
            SAMPLE_PROMPTS=captions,
            SAMPLE_SEEDS=[1, 2, 3, 4],
            SAMPLE_STEPS=int(k["SAMPLE_STEPS"]),
            SAMPLE_CFG=3.0,  # the released default; the unconditional branch is the template alone
            SAMPLE_SHIFT=1.0,  # the schedule the demo trains on (TIMESTEP_SHIFT none)
            SAMPLE_WIDTH=128,
            SAMPLE_HEIGHT=128,
        ),
        source="demo knobs",
    )
    # one thread: the tiny model's run is then bitwise reproducible (two threads reorder float sums and the
    # grid drifts from run to run) and faster on a small CPU; the caller's setting comes back after
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_dir = train(knobs)
    finally:
        torch.set_num_threads(threads)
    print(f"demo finished: {run_dir}")
    print(f"  samples grid: {sorted((run_dir / 'samples').glob('grid_step_*.png'))[-1]}")
    for f in sorted((run_dir / "export").iterdir()):
        print(f"  export: {f}")
    near = resemblance(run_dir, {c: pictures[c] for c in captions}, int(k["STEPS"]))
    print(
        "  distance to the training pictures (lower is closer), base row -> LoRA row: "
        f"colour histogram {near['base']['hist']:.3f} -> {near['lora']['hist']:.3f}, "
        f"16px MSE {near['base']['mse16']:.4f} -> {near['lora']['mse16']:.4f}"
    )
    return near


def main() -> None:
    from kohakumoss.config.bounds import SEED_MAX, SEED_MIN, device_problem
    from kohakumoss_common.knobs import Knob, Schema, run_checked

    schema = Schema(
        [
            Knob("RUN_NAME", "demo", "run folder name"),
            Knob("RUNS_DIR", "runs/moss", "where runs are written"),
            Knob("STEPS", 450, "optimizer steps", min=1),
            Knob("LR", 1.5e-3, "learning rate", min=0.0),
            Knob("RANK", 32, "LoRA rank", min=1),
            Knob("DEVICE", "auto", "auto, cpu or cuda", check=device_problem),
            Knob("SEED", 0, "seed", min=SEED_MIN, max=SEED_MAX),
            Knob("SAMPLE_STEPS", 24, "sampler steps of the grid", min=1),
        ]
    )
    sys.exit(run_checked(schema, globals(), run, "scripts/demo/demo.py"))


if __name__ == "__main__":
    main()

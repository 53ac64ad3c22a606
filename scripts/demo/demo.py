"""The embedded demo: train a LoRA on a tiny MOSS-architecture model in a few minutes, on any machine.

    kogine run scripts/demo/demo.py            (or: python scripts/demo/demo.py)

Everything is built here, nothing is downloaded: a tiny random MOSS backbone (the `tiny` preset), a
tiny random Qwen3.5 text encoder with a word-level tokenizer made from the captions, and the small
FLUX.2-shaped VAE in assets/demo/vae (trained on the demo pictures by make_demo_vae.py, so it
reconstructs them). The four pictures in assets/demo/images are public domain or CC0 (see
assets/demo/README.md). The run writes RUNS_DIR/RUN_NAME/: log.txt, metrics.jsonl, loss.png,
samples/grid_step_XXXXX.png (the base model's row above the LoRA's, same seeds per column) and
export/ with the ComfyUI-format and LyCORIS files. On a GPU the same command runs there.
"""

import sys

RUN_NAME = "demo"  # run folder name
RUNS_DIR = "runs/moss"  # where runs are written
STEPS = 450  # optimizer steps
LR = 3e-3  # learning rate
RANK = 32  # LoRA rank
DEVICE = "auto"  # auto, cpu or cuda
SEED = 0  # seed of the random base model, the plan and the noise
SAMPLE_STEPS = 24  # sampler steps of the grid


def run(k: dict) -> None:
    from pathlib import Path

    from kohakumoss.config.train import TRAIN_SCHEMA
    from kohakumoss.encoders.tiny import write_tiny_text_encoder
    from kohakumoss.train.loop import train

    root = Path(__file__).resolve().parents[2]
    images = root / "assets" / "demo" / "images"
    captions = sorted(p.read_text(encoding="utf-8").strip() for p in images.rglob("*.txt"))
    work = Path(k["RUNS_DIR"]) / k["RUN_NAME"] / "demo_assets"
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
            SAMPLE_CFG=1.0,
            SAMPLE_WIDTH=128,
            SAMPLE_HEIGHT=128,
        ),
        source="demo knobs",
    )
    run_dir = train(knobs)
    print(f"demo finished: {run_dir}")
    print(f"  samples grid: {sorted((run_dir / 'samples').glob('grid_step_*.png'))[-1]}")
    for f in sorted((run_dir / "export").iterdir()):
        print(f"  export: {f}")


def main() -> None:
    from kohakumoss.config.knobs import Knob, Schema, run_checked

    schema = Schema(
        [
            Knob("RUN_NAME", "demo", "run folder name"),
            Knob("RUNS_DIR", "runs/moss", "where runs are written"),
            Knob("STEPS", 450, "optimizer steps", min=1),
            Knob("LR", 3e-3, "learning rate", min=0.0),
            Knob("RANK", 32, "LoRA rank", min=1),
            Knob("DEVICE", "auto", "auto, cpu or cuda"),
            Knob("SEED", 0, "seed"),
            Knob("SAMPLE_STEPS", 24, "sampler steps of the grid", min=1),
        ]
    )
    sys.exit(run_checked(schema, globals(), run, "scripts/demo/demo.py"))


if __name__ == "__main__":
    main()

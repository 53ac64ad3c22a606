"""Other MOSS-Image trainers beside this one: each peer's own trainer run as its README tells a user, on
the same random 5B weights, the same synthetic data and the same GPU, next to ours through kogine.

    python scripts/bench/peers.py --dry-run                         # every command, nothing run
    python scripts/bench/peers.py --out $OUT/peers.json --doc-json docs/performance/data/peers_DATE.json
    python scripts/bench/peers.py --rows lora/card24 --peers kohakumoss-0.1.0 --steps 12
    python scripts/bench/peers.py --preflight                       # SimpleTuner's side checked, nothing run
    python scripts/bench/peers.py --rows "" --merge a.json --merge b.json --doc-json docs/performance/data/peers_DATE.json
    python scripts/bench/peers.py --rows lora/card24 --peers "" --skip-ours --merge km010.json --at-peer-peak

Rows (LoRA r32 on the attention + MLP projections, 2 images of 1 MP per step, latent + text caches filled
before the run; full: every DiT weight):
- `lora/whole` the whole card, each trainer's own setting for it (ours: `kohakumoss-config new train`'s
  layer for the card, rank 32; KohakuMoss 0.1.0: its `vram_auto` layer; SimpleTuner: its 80 GB example);
- `lora/card24` a 24 GiB cap with each trainer's own 24 GB setting (ours CARD_GB=24; 0.1.0 `vram_24g`;
  SimpleTuner its 24 GB example);
- `lora/card8` an 8 GiB cap (ours CARD_GB=8; 0.1.0 `vram_8g`; SimpleTuner has no such setting);
- `full/whole` a full fine-tune on the whole card where the peer has one (0.1.0: `_base/base_full`);
- `sample/whole` sampling 1024 x 1024, 50 steps, CFG 3, one image: ours scripts/bench/sample.py's `fast`
  row; 0.1.0 its `scripts/sample/sample.py` on write_weights.py's pipeline tree (the same transformer/,
  random stand-ins of the released text encoder, tokenizer and VAE architectures: the text encoder with 4
  of its 32 blocks, which costs only the one prompt encoding); s/step is each sampler's own step time
  after the first.
Our side is scripts/bench/user_runs.py's row of the same card (its `run_row`: the trainer through kogine,
random weights, synthetic encoders), one micro-step per step (GRAD_ACCUM 1: the 8 GB layer's 4 would make
8 images a step). --card-gb names the card a `whole` row's layer is read for on a machine without one
(a dry run here). A peer runs from its own install folder (`--peer-root`, one folder
per peer, made by `pip install --no-index --no-deps --target` from scripts/bench/bundle_peers.sh's
wheels) with PYTHONPATH set to that folder (and scripts/bench/peer_path for its stand-in encoders):
KohakuMoss 0.1.0's import name is this project's. Its weights are scripts/bench/write_weights.py's `hf`
folder (the same values as our MODEL_PRESET rows: 0.1.0 reads the released key names), its caches are
written by its own cache scripts with stand-in encoders (peer_path/peer_encoders.py: random embeddings
of the real shapes, one text token per caption word, as our synthetic encoder counts), its cap is torch's
per-process fraction (peer_path/capped_run.py; 0.1.0 has no cap knob).
SimpleTuner 4.10.1 runs as its docs start it: `simpletuner train` (its console script, `python -m st_cli
train`) in a folder holding the row's config.json (`simpletuner_config`: its per-card MOSS-Image example
with the benchmark's changes), which runs `accelerate launch ... simpletuner/train.py`; `accelerate` is
this Python's (`simpletuner_launcher`). Its trainer loads every model from write_weights.py's pipeline
tree and fills its own text-embed and VAE-latent caches before its loop, through that tree's text encoder
and VAE (no stand-in encoder); its PYTHONPATH holds its install folder, import-only stand-ins of wandb,
boto3 and spaCy (peer_path/simpletuner_stubs) and a probe (peer_path/simpletuner_probe, its
sitecustomize: in the training process that `accelerate launch` starts, the cap as torch's per-process
fraction and the steps' torch peak into its metrics). `--preflight` checks that side where it will run
(peer_path/simpletuner_preflight.py: Python, glibc, versions, imports, the cap).

--at-peer-peak runs our side of each row again with CARD_GB at each peer's nvidia-smi peak on it (its doc rows
are `<row>@peak`): the speed this project gets on a card holding no more than the peer's process did.

Columns per row and side: s/step, images/s, joint and image tokens/s, the torch step peak, the GPU's
nvidia-smi peak above its idle use (sampled every 0.5 s while the row runs), first-step seconds, and the
fallbacks the trainer logged. The peers' own figures: 0.1.0 logs image tokens/s (`tokens_per_s`),
samples/s, `step_time` and `vram_peak_alloc`; its joint tokens/s is image tokens/s plus images/s times
the data set's mean caption tokens. SimpleTuner logs each step's seconds (`iteration_step_time_seconds`
in training_metrics.jsonl, under `report_to` "simpletuner"), no token count: its images/s are 2 over that,
its image tokens 4096 per 1 MP image. --doc-json writes the comparison as a list of rows {peer, row,
metric, ours, theirs, unit, higher_is_better}; a row a peer could not run is listed with its reason under
`not_measured` (docs/performance/peers.md). A peer that does not run: DiffSynth-Studio 2.1.12 (its
README trains and samples MOSS-Image through scripts in a clone's examples/moss_image/, which neither its
wheel nor its sdist holds and no source reachable here has: DIFFSYNTH_SCRIPTS); SimpleTuner has no
`lora/card8`, `full/whole` or `sample/whole` setting (ST_CANNOT); the MOSS-Image code of sd-scripts
(v0.12.1+) and of ai-toolkit is on no package index and newer than the snapshots readable here, and
OpenCV, which ai-toolkit imports, does not fit a call beside .whl/ (CANNOT). Their rows say so.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "scripts" / "bench"
PEER_PATH = BENCH / "peer_path"
IMAGES = 2  # per step
RANK = 32
ROWS = ("lora/whole", "lora/card24", "lora/card8", "full/whole", "sample/whole")
OURS = "kohakumoss"
KM010 = "kohakumoss-0.1.0"
SIMPLETUNER = "simpletuner-4.10.1"
DIFFSYNTH = "diffsynth-2.1.12"
SDSCRIPTS = "sd-scripts-0.12.1"  # kohya-ss/sd-scripts, the release issue #47 names
AITOOLKIT = "ai-toolkit"  # ostris/ai-toolkit (no releases: a commit of its main branch)
PEERS = (KM010, SIMPLETUNER, DIFFSYNTH, SDSCRIPTS, AITOOLKIT)
# DiffSynth-Studio's own MOSS-Image scripts in a clone's examples/: its README's model table names the .sh and
# the sampler; every model's LoRA .sh runs `accelerate launch examples/<model>/model_training/train.py`
DIFFSYNTH_SCRIPTS = (
    "examples/moss_image/model_training/train.py",
    "examples/moss_image/model_training/lora/MOSS-Image-Base.sh",
    "examples/moss_image/model_inference/MOSS-Image-Base.py",
)
# what ai-toolkit lacks for the GPU machine beyond its image and .whl/ (every call carries at most 64 MiB,
# .whl/ ~44 MB of it): OpenCV, which its toolkit/data_loader.py imports at module level
# (`bundle_peers.sh --sdscripts-aitoolkit-size`); later sd-scripts stub it (library/cv2_compat.py)
OPENCV_WHEEL = (
    "opencv-python-headless 5.1.0.95's wheel is 60.8 MiB, which with .whl/ (44 MB) is past a call's 64 MiB"
)
# why a peer has no such row, or cannot run at all (checked from its package: docs/performance/peers.md)
CANNOT = {
    DIFFSYNTH: f"DiffSynth-Studio 2.1.12 trains MOSS-Image with {DIFFSYNTH_SCRIPTS[1]} (accelerate launch "
    f"{DIFFSYNTH_SCRIPTS[0]}) and samples with {DIFFSYNTH_SCRIPTS[2]}, from a git clone (its README installs "
    "with git clone, pip install -e .); its wheel and sdist hold only the diffsynth/ package (the MOSS-Image "
    "pipeline, DiT and text encoder, and the generic loop diffusion/runner.py, not the script that builds "
    "the MOSS-Image training module and picks its LoRA targets), and the newest snapshot of its repository "
    "reachable here (2026-08-22, version 2.1.2) predates its MOSS-Image support (2026-10-20): its own "
    "trainer and sampler cannot be carried to the GPU machine (a script written here would be this "
    "project's, not its): not run",
    SDSCRIPTS: "sd-scripts' MOSS-Image trainer (v0.12.1 or later) cannot be read or carried from here: the "
    "project is on no package index (its README installs a git clone), the GPU machine has no network, "
    "and the repository's stored snapshot (main 48d368fa, 2026-02-16; newest tag v0.10.1, Anima) predates "
    "its MOSS-Image support, so its script, the model files it loads, its text-encoder caching and its "
    "blocks_to_swap / fp8_base settings for this model are unknown: not run",
    AITOOLKIT: "ai-toolkit's MOSS-Image model (extensions_built_in/diffusion_models/moss_image) cannot be read "
    "or carried from here: the project is on no package index (PyPI's ostris-ai-toolkit 0.2.7 is a 2024 "
    "fork without it), the GPU machine has no network, and the repository's stored snapshot (27a03a91, "
    "2026-08-21) predates MOSS-Image, so its example YAML, the files it loads, its low_vram / "
    "layer_offloading settings for this model and the diffusers commit it pins are unknown; besides, "
    f"{OPENCV_WHEEL}: not run",
}
KM010_CANNOT: dict[str, str] = {}  # every row runs
# SimpleTuner 4.10.1's rows it has no setting for, or whose side is not written (read from its wheel)
ST_CANNOT = {
    "lora/card8": "SimpleTuner 4.10.1 ships MOSS-Image LoRA examples for 24, 32, 48, 80 and 144 GB cards only "
    "(simpletuner/examples/moss_image-*.peft-lora): it has no 8 GB setting of its own: not run",
    "full/whole": "SimpleTuner 4.10.1's MOSS-Image examples are all LoRA (peft-lora); a full fine-tune "
    "(model_type 'full') is no setting it ships for this model: not run",
    "sample/whole": "SimpleTuner 4.10.1 has no sampler a user starts on a base model: it samples as its "
    "trainer's validation (validation_on_startup, validation_step_interval) or through simpletuner/inference.py, "
    "its WebUI's worker on a training checkpoint, and logs no per-step sampler time; that side is not "
    "written: not run",
}
# the training-step knobs the benchmark changes from 0.1.0's layers (the rest are data, paths and logging)
KM010_STEP_CHANGES = ("BATCHING", "BATCH_SIZE", "SCHEDULE")
# the compilers' caches of a peer's rows (user_runs.py gives ours one folder for all our rows)
COMPILER_CACHES = {
    "TRITON_CACHE_DIR": "triton",
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
    "TILELANG_CACHE_DIR": "tilelang",
}
# our rows: one micro-step per optimizer step (the 8 GB layer's GRAD_ACCUM 4 would make 8 images a step)
OUR_SET = ("GRAD_ACCUM=1",)
SAMPLE_PROMPT = "a lighthouse on a rocky coast at sunset"  # words of write_weights.PROMPT_WORDS
SAMPLE_TEXT_TOKENS = 32  # our sampler benchmark's synthetic prompt tokens: the prompt under a chat template
# ours: user_runs.py's row of the same card; rank 32 through its --rank
OUR_ROWS = {"lora/whole": "whole/lora/2", "lora/card24": "card24/lora/2", "lora/card8": "card8/lora/2",
            "full/whole": "whole/full/2"}  # fmt: skip
# our row again on a card of a peer's nvidia-smi peak on it ("a peak no higher"): its results key is
# (OURS, f"{row}{AT_PEAK}{peer}"), its doc rows' row f"{row}{AT_PEAK}"
AT_PEAK = "@peak-of-"
# 0.1.0's own layers for the row (its bundled configs/moss/...), composed as its recipes compose them
KM010_LAYERS = {
    "lora/whole": ("_base/base_lora.py", "vram/vram_auto.py", "precision/precision_bf16.py"),
    "lora/card24": ("_base/base_lora.py", "vram/vram_24g.py", "precision/precision_bf16.py"),
    "lora/card8": ("_base/base_lora.py", "vram/vram_8g.py", "precision/precision_bf16.py"),
    "full/whole": ("_base/base_full.py", "vram/vram_auto.py", "precision/precision_bf16.py"),
}
CAPS = {"lora/whole": 0.0, "lora/card24": 24.0, "lora/card8": 8.0, "full/whole": 0.0, "sample/whole": 0.0}
METRICS = (  # (key, unit, higher is better)
    ("s_per_step", "s", False),
    ("images_per_s", "images/s", True),
    ("joint_tokens_per_s", "tokens/s", True),
    ("image_tokens_per_s", "tokens/s", True),
    ("peak_torch_gib", "GiB", False),
    ("peak_smi_gib", "GiB", False),
    ("first_step_s", "s", False),
    # the trainer process, launch to exit (a peer's cache scripts before it not counted)
    ("wall_s", "s", False),
)
STOP_GRACE_S = 60  # a timed-out row's seconds between Ctrl+C and a kill
FALLBACK = re.compile(r"fall(?:s|ing)? ?back|fell back|fallback|compile failed|not supported|WARNING", re.I)


@dataclass(frozen=True)
class Side:
    """One trainer's run of a row: its command, environment, and where it writes."""

    peer: str
    row: str
    argv: list[str]
    env: dict
    run_dir: Path
    setup: list[list[str]]  # commands before the timed run (the peer's own cache scripts)
    cwd: Path = ROOT  # where its commands start (SimpleTuner's `simpletuner train` reads ./config.json)


def km010_bundle(peer_root: Path) -> Path:
    """The scripts and configs 0.1.0's wheel carries (`kohakumoss/bundle/`)."""
    return peer_root / KM010 / "kohakumoss" / "bundle"


def km010_env(a, row: str) -> dict:
    """0.1.0's process: its install folder and the stand-in encoders' folder, nothing of this project. As
    user_runs.py runs ours: its tuning tables (its own and lycoris-lora's) one per row, emptied by run_peer;
    the compilers' caches one folder for all its rows, apart from ours."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", *COMPILER_CACHES)}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(a.peer_root) / KM010), str(PEER_PATH)])
    tables = Path(a.work) / "km010-kernel-cache" / row.replace("/", "-")
    env.update(KOHAKUMOSS_KERNEL_CACHE=str(tables), LYCORIS_KERNEL_CACHE_DIR=str(tables / "lycoris"))
    compiled = Path(a.work) / "km010-compiled"
    env.update({name: str(compiled / folder) for name, folder in COMPILER_CACHES.items()})
    return env


def km010_config(a, row: str) -> Path:
    """The row's config file: 0.1.0's own layers (absolute paths: use_config resolves them as given), then
    the benchmark's knobs (`km010_knobs`) as Python values: kogine's --set coerces text by a script's
    defaults, and the cache scripts have no default for most training knobs."""
    bundle = km010_bundle(Path(a.peer_root)) / "configs" / "moss"
    path = Path(a.work) / "km010" / f"{row.replace('/', '-')}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ['"""KohakuMoss 0.1.0 row of scripts/bench/peers.py: its own layers, as its recipes compose them."""',
             "", "from kohakuengine import use_config", ""]  # fmt: skip
    lines += [f'use_config("{bundle / layer}")' for layer in KM010_LAYERS[row]]
    lines += [""] + [f"{name} = {value!r}" for name, value in km010_knobs(a, row).items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def km010_knobs(a, row: str) -> dict:
    """What the benchmark sets on top of 0.1.0's layers: the weights, data and caches, 2 images per step,
    LoRA r32 on attn-mlp (its base layer's already), no samples, saves or exports. Of the step's own knobs
    only BATCHING, BATCH_SIZE and the LR warm-up change (KM010_STEP_CHANGES); its MEMORY_PROFILE,
    MAX_TOKENS, OVERLONG, PRECISION, ADAPTER_MODE, COMPILE and TUNE stay its layers' (MAX_TOKENS is a
    per-sample limit under count batching, above a 1 MP image and its caption at every layer)."""
    work = Path(a.work)
    k = {
        "WEIGHTS": str(weights_dir(a) / "transformer"),
        "DATASETS": [{"source": "kohya", "path": str(data_dir(a)), "repeat_prefix": "first"}],
        "TARGET_AREA": a.size * a.size,
        "BATCHING": "count",  # the same images per step on every row (its layers pack tokens instead)
        "BATCH_SIZE": IMAGES,
        "CAPTION": {"template": "tags", "keep": [], "shuffle": False, "tag_dropout": 0.0},
        "CAPTION_VARIANTS": 1,  # one cached rendering per image (its default 4 only fills the cache longer)
        "TEXT_DROP": 0.0,  # every caption kept, as our rows' CAPTION_DROPOUT 0 (its base layer drops 10%)
        "LATENT_CACHE": "offline",
        "TEXT_CACHE": "offline",
        "CACHE_DIR": str(work / "km010-cache"),
        "TEXT_ENCODER_ID": "random-qwen3.5",  # peer_encoders.TEXT_ID
        "LATENT_ENCODER_ID": "random-flux2-vae",  # peer_encoders.LATENT_ID
        "STEPS": a.steps,
        "LOG_EVERY": 1,
        "SAVE_EVERY": 0,
        "SAMPLE_EVERY": 0,
        "EXPORT_FORMATS": [],
        "PROGRESS": False,
        "OUTPUT_DIR": str(work / "km010-runs"),
        "RUN_NAME": row.replace("/", "-"),
        "SEED": 0,
        # its layers' warm-up of 100 steps is refused with fewer STEPS; the LR's shape costs nothing
        "SCHEDULE": {"mode": "cosine", "warmup": 0, "end": -1, "min_value": 0.1},
    }
    if row.startswith("lora/"):
        k.update(ALGO="lora", PRESET="attn-mlp", DIM=RANK, ALPHA=float(RANK))
    if arch := km010_arch(a.preset):
        k["ARCH_OVERRIDES"] = arch
    if a.device == "cpu":
        k["PRECISION"] = "bf16"  # its CPU smoke (no GPU: it picks the CPU itself); no fp32 compute there
    return k


def km010_arch(preset: str) -> dict:
    """0.1.0's ARCH_OVERRIDES for our preset: none for the 5B model (its VARIANT 'base' is that shape),
    the fields of a smaller preset otherwise (its trainer builds VARIANT's shape, then loads WEIGHTS)."""
    if preset == "moss-image-5b":
        return {}
    from kohakumoss.model.presets import get_preset

    c = get_preset(preset)
    return {"dim": c.dim, "depth": c.depth, "heads": c.num_heads, "ffn_dim": c.mlp_hidden, "text_dim": c.text_dim,
            "text_blocks": c.refiner_depth, "latent_channels": c.in_channels, "freq_dim": c.time_freq_dim,
            "negative_skip_layers": ()}  # fmt: skip


def text_dim(preset: str) -> int:
    from kohakumoss.model.presets import get_preset

    return get_preset(preset).text_dim


def set_args(k: dict) -> list[str]:
    """kogine's --set pairs: strings bare, the rest as Python literals."""
    out: list[str] = []
    for name, value in k.items():
        out += ["--set", f"{name}={value if isinstance(value, str) else repr(value)}"]
    return out


def km010_side(a, row: str) -> Side:
    """0.1.0's trainer as its README runs it (`kogine run scripts/train/moss.py --config ...`), capped
    where the row is, after its own cache scripts filled the caches with the stand-in encoders."""
    bundle = km010_bundle(Path(a.peer_root))
    config = km010_config(a, row)
    knobs = km010_knobs(a, row)
    kogine = [
        sys.executable,
        str(PEER_PATH / "capped_run.py"),
        str(CAPS[row]),
        "-m",
        "kohakuengine.cli",
        "run",
    ]
    device = "cpu" if a.device == "cpu" else "cuda"
    setup = [
        [*kogine, str(bundle / "scripts/data/cache_latents.py"), "--config", str(config),
         *set_args({"IMAGE_ENCODER": "peer_encoders.random_latents", "IMAGE_ENCODER_KWARGS": {"device": device}})],
        [*kogine, str(bundle / "scripts/data/cache_text.py"), "--config", str(config),
         *set_args({"TEXT_ENCODER": "peer_encoders.random_text",
                    "TEXT_ENCODER_KWARGS": {"device": device, "width": text_dim(a.preset)}})],
    ]  # fmt: skip
    argv = [*kogine, str(bundle / "scripts/train/moss.py"), "--config", str(config)]
    run_dir = Path(knobs["OUTPUT_DIR"]) / knobs["RUN_NAME"]
    return Side(KM010, row, argv, km010_env(a, row), run_dir, setup)


# SimpleTuner 4.10.1's own per-card MOSS-Image LoRA examples (its wheel's simpletuner/examples/): the
# 80 GB one for the whole card, the 24 GB one for the 24 GiB cap; it has no 8 GB one
ST_EXAMPLES = {"lora/whole": "moss_image-80g.peft-lora", "lora/card24": "moss_image-24g.peft-lora"}
# the DiT blocks' attention + MLP projections (its transformer.py's MOSSImageTransformerBlock.proj); its
# DEFAULT_LORA_TARGET is attention and the text embedder only
ST_LORA_TARGETS = ["proj.q", "proj.k", "proj.v", "proj.o", "proj.ffn_up_gate", "proj.ffn_down"]
ST_PEAK = "probe/peak_allocated_gib"  # peer_path/simpletuner_probe's per-step torch peak
# its console lines (helpers/log_format.py ColorizedFormatter: f"[RANK {rank}] {level_color}{message}{reset_color}"
# of "%(asctime)s [%(levelname)s] %(message)s"): rank and colours cut, so `fallbacks` cuts the date and
# time as it does the other logs' heads and keeps the level
ST_LOG_PREFIX = re.compile(r"^\[RANK \d+\] ", re.M)
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def simpletuner_config(a, row: str) -> Path:
    """SimpleTuner's config.json and dataloader.json for the row, written under --work: its own example
    for the card, with the benchmark's changes (2 images of 1 MP a step, rank 32 on the attention + MLP
    projections, the pipeline tree, the synthetic data and its caches, no checkpoints, validation or
    CREPA: its examples' CREPA loads DINOv2 through torch.hub, and the GPU machine has no network).
    Returns the config's path without its suffix (its CONFIG_PATH, with CONFIG_BACKEND=json)."""
    example = Path(a.peer_root) / SIMPLETUNER / "simpletuner" / "examples" / ST_EXAMPLES[row]
    config = json.loads((example / "config.json").read_text())
    folder = Path(a.work) / "simpletuner" / row.replace("/", "-")
    folder.mkdir(parents=True, exist_ok=True)
    caches = Path(a.work) / "simpletuner-cache"  # one cache for all its rows, as 0.1.0's
    dataloader = [
        {"id": "synthetic", "type": "local", "dataset_type": "image", "instance_data_dir": str(data_dir(a)),
         "caption_strategy": "textfile", "resolution": a.size * a.size / 1e6, "resolution_type": "area",
         "crop": False, "cache_dir_vae": str(caches / "vae"), "text_embeds": "text", "repeats": 0},
        {"id": "text", "type": "local", "dataset_type": "text_embeds", "default": True,
         "cache_dir": str(caches / "text")},
    ]  # fmt: skip
    config.update(
        data_backend_config=str(folder / "dataloader.json"),
        pretrained_model_name_or_path=str(weights_dir(a) / "pipeline"),
        output_dir=str(folder / "output"),
        train_batch_size=IMAGES,
        gradient_accumulation_steps=1,
        lora_rank=RANK,
        lora_alpha=RANK,
        peft_lora_target_modules=ST_LORA_TARGETS,
        resolution=a.size,  # its default for a dataset without one: pixels (an int); the dataset's is area
        max_train_steps=a.steps,
        num_train_epochs=0,
        lr_warmup_steps=0,
        checkpoint_step_interval=a.steps + 1,
        validation_step_interval=a.steps + 1,
        validation_disable=True,  # no validation images before, between or after the steps
        crepa_enabled=False,
        report_to="simpletuner",  # its own local metrics file (training_metrics.jsonl): step times per step
        push_to_hub=False,
        push_checkpoints_to_hub=False,
    )
    config.pop("user_prompt_library", None)  # its examples' prompt file path is relative to its repository
    (folder / "dataloader.json").write_text(json.dumps(dataloader, indent=1))
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder / "config"


def simpletuner_folder(a) -> Path:
    """SimpleTuner's install folder (bundle_peers.sh --simpletuner's wheels, `pip install --target`)."""
    return Path(a.peer_root) / SIMPLETUNER


def simpletuner_launcher(a) -> Path:
    """A folder holding `accelerate`, the command `simpletuner train` starts (its cli/train.py runs
    `accelerate launch ... simpletuner/train.py`), as accelerate's own console script: this Python's
    `accelerate.commands.accelerate_cli`, so its training process runs on the interpreter peers.py runs on."""
    folder = Path(a.work) / "simpletuner-bin"
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "accelerate"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m accelerate.commands.accelerate_cli "$@"\n')
    script.chmod(0o755)
    return folder


def simpletuner_env(a, row: str) -> dict:
    """SimpleTuner's processes: its install folder, the stand-ins of packages it imports but never calls
    (peer_path/simpletuner_stubs) and the probe (peer_path/simpletuner_probe: the cap, PEER_CAP_GIB, and the
    steps' torch peak); nothing of this project. No hub access (HF_HUB_OFFLINE; HF_HOME under --work, so no
    stray accelerate config is read); the compilers' caches one folder for all its rows, apart from ours."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", *COMPILER_CACHES)}
    env["PYTHONPATH"] = os.pathsep.join(
        [
            str(simpletuner_folder(a)),
            str(PEER_PATH / "simpletuner_stubs"),
            str(PEER_PATH / "simpletuner_probe"),
        ]
    )
    env["PATH"] = os.pathsep.join([str(simpletuner_launcher(a)), env.get("PATH", "")])
    work = Path(a.work)
    env.update(HF_HUB_OFFLINE="1", HF_HOME=str(work / "simpletuner-hf"), PEER_CAP_GIB=str(CAPS[row]))
    compiled = work / "simpletuner-compiled"
    env.update({name: str(compiled / folder) for name, folder in COMPILER_CACHES.items()})
    return env


def simpletuner_side(a, row: str) -> Side:
    """SimpleTuner's trainer as its docs start it: `simpletuner train` in the folder holding the row's
    config.json (its CLI sets CONFIG_BACKEND json and CONFIG_PATH, then runs `accelerate launch
    --mixed_precision=bf16 --num_processes=1 --num_machines=1 --dynamo_backend=no simpletuner/train.py`).
    Its trainer fills its own caches first (text embeds through the pipeline tree's text encoder, VAE
    latents through its VAE: no setup command) and logs each step to training_metrics.jsonl."""
    config = simpletuner_config(a, row)
    argv = [sys.executable, "-m", "st_cli", "train"]  # the `simpletuner` console script (st_cli:main)
    return Side(SIMPLETUNER, row, argv, simpletuner_env(a, row), config.parent / "output", [], config.parent)


def simpletuner_preflight(a) -> int:
    """peer_path/simpletuner_preflight.py in SimpleTuner's environment at the 24 GiB cap (so the probe's
    cap is tried too), on the pipeline tree; its exit status."""
    argv = [sys.executable, str(PEER_PATH / "simpletuner_preflight.py"), str(weights_dir(a) / "pipeline")]
    return subprocess.run(argv, env=simpletuner_env(a, "lora/card24"), cwd=Path(a.work)).returncode


def read_simpletuner(run: Path, warmup: int, caption_tokens: float, size: int, log: str) -> dict:
    """SimpleTuner's training_metrics.jsonl (`report_to` "simpletuner": its LocalMetricsTracker, one record
    per step with IterationTracker's `iteration_step_time_seconds`, the time since the step before, step 1's
    since its training loop started; the probe's `probe/peak_allocated_gib`) and console log as this
    script's columns. It logs no token counts: image tokens are 16 px patches, joint adds the captions'."""
    path = run / "training_metrics.jsonl"
    records = (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    )
    steps = [
        (r["step"], r["metrics"]) for r in records if "iteration_step_time_seconds" in r.get("metrics", {})
    ]
    late = [m for step, m in steps if step > warmup] or [m for _, m in steps]
    out: dict = {"steps": max((step for step, _ in steps), default=0)}
    if late:
        step_s = statistics.median(m["iteration_step_time_seconds"] for m in late)
        out.update(s_per_step=step_s, images_per_s=IMAGES / step_s,
                   image_tokens_per_s=IMAGES * image_tokens(size) / step_s)  # fmt: skip
        out["joint_tokens_per_s"] = out["image_tokens_per_s"] + out["images_per_s"] * caption_tokens
    peaks = [m[ST_PEAK] for _, m in steps if ST_PEAK in m]
    out["peak_torch_gib"] = max(peaks) if peaks else None
    out["first_step_s"] = next((m["iteration_step_time_seconds"] for step, m in steps if step == 1), None)
    out["fallbacks"] = fallbacks(ST_LOG_PREFIX.sub("", ANSI.sub("", log)))
    return out


def weights_dir(a) -> Path:
    """write_weights.py's folder of the preset (user_runs.py's --weights-dir: one copy for both scripts)."""
    return Path(a.weights_dir) / a.preset


def data_dir(a) -> Path:
    """user_runs.py's synthetic data set (the same folder name, made the same way)."""
    return Path(a.work) / f"data-{a.images}x{a.size}-{a.caption_words}"


def load_script(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"{name}_bench", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def ur_args(a):
    """user_runs.py's options for our side of the rows: rank 32, the same data, steps and warm-up."""
    ur = load_script("user_runs")
    return ur, argparse.Namespace(
        preset=a.preset, device=a.device, size=a.size, text_tokens=a.text_tokens, caption_words=a.caption_words,
        rank=RANK, steps=a.steps, warmup=a.warmup, images=a.images, row_timeout=a.row_timeout,
        seed_cache=a.seed_cache, empty_table=False, set=[*OUR_SET, *a.set], logs=str(Path(a.work) / "logs"), work=a.work,
        weights_dir=a.weights_dir,
    )  # fmt: skip


def ours_sample_argv(a) -> list[str]:
    """Our sampler's benchmark at the row's settings: the shipped path (`fast`), one image, bf16 base."""
    return [sys.executable, str(BENCH / "sample.py"), "--preset", a.preset, "--device", a.device, "--rows", "fast",
            "--batches", "1", "--base-precisions", "same", "--size", str(a.size), "--steps", str(a.sample_steps),
            "--cfg", "3.0", "--text-tokens", str(SAMPLE_TEXT_TOKENS),
            "--out", str(Path(a.work) / "ours-sample.json")]  # fmt: skip


def km010_sample_side(a) -> Side:
    """0.1.0's sampler as its README runs it (`kogine run scripts/sample/sample.py --set PROMPT=...`) on
    write_weights.py's pipeline tree (its transformer/ the same weights; the text encoder, tokenizer and
    VAE random stand-ins of the released architectures), one 1024 x 1024 image, 50 steps, CFG 3."""
    bundle = km010_bundle(Path(a.peer_root))
    knobs = {"WEIGHTS": str(weights_dir(a) / "pipeline"), "PROMPT": SAMPLE_PROMPT, "STEPS": a.sample_steps,
             "CFG": 3.0, "SIZES": [(a.size, a.size)], "SEEDS": [0], "BATCH": 1, "PROGRESS": False,
             "OUT": str(Path(a.work) / "km010-sample")}  # fmt: skip
    if a.device == "cpu":
        knobs.update(DEVICE="cpu", PRECISION="bf16")
    argv = [sys.executable, str(PEER_PATH / "capped_run.py"), "0", "-m", "kohakuengine.cli", "run",
            str(bundle / "scripts/sample/sample.py"), *set_args(knobs)]  # fmt: skip
    return Side(KM010, "sample/whole", argv, km010_env(a, "sample/whole"), Path(knobs["OUT"]), [])


def read_km010_sample(out: Path, log: str, steps: int) -> dict:
    """0.1.0's sampler log (`steps: first X s, then Y s/step`) and metadata JSON as this script's columns:
    images/s over the sampler steps alone (as ours: no prompt encoding or decode)."""
    found = re.search(r"steps: first ([\d.]+) s, then ([\d.]+) s/step", log)
    metas = sorted(out.glob("metadata-*.json"))
    run = json.loads(metas[-1].read_text()).get("run", {}) if metas else {}
    if not found:
        return {"steps": 0, "generate_s": run.get("generate_s")}
    first, rest = float(found.group(1)), float(found.group(2))
    return {"steps": steps, "first_step_s": first, "s_per_step": rest,
            "images_per_s": 1.0 / (first + (steps - 1) * rest), "generate_s": run.get("generate_s"),
            "vram": run.get("vram"), "fallbacks": fallbacks(log)}  # fmt: skip


def mean_caption_tokens(folder: Path) -> float:
    """Words per caption over the data set: both trainers' text tokens per image (one per word)."""
    counts = [len(p.read_text().split()) for p in sorted(folder.rglob("*.txt"))]
    return statistics.mean(counts) if counts else 0.0


def read_km010(run: Path, warmup: int, caption_tokens: float) -> dict:
    """0.1.0's metrics.jsonl and log.txt as this script's columns."""
    path = run / "metrics.jsonl"
    rows = (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    )
    steps = [r for r in rows if "step_time" in r]
    late = [r for r in steps if r["step"] > warmup] or steps
    out: dict = {"steps": max((r["step"] for r in steps), default=0)}
    if late:
        out["s_per_step"] = statistics.median(r["step_time"] for r in late)
        out["images_per_s"] = statistics.median(r["samples_per_s"] for r in late)
        out["image_tokens_per_s"] = statistics.median(r["tokens_per_s"] for r in late)
        out["joint_tokens_per_s"] = out["image_tokens_per_s"] + out["images_per_s"] * caption_tokens
    peaks = [r["vram_peak_alloc"] for r in steps if "vram_peak_alloc" in r]
    out["peak_torch_gib"] = max(peaks) if peaks else None
    out["first_step_s"] = steps[0]["step_time"] if steps and steps[0]["step"] == 1 else None
    log = run / "log.txt"
    out["fallbacks"] = fallbacks(log.read_text(errors="replace") if log.exists() else "")
    return out


def image_tokens(size: int) -> int:
    """Tokens of a size x size image (16 px a token: 4096 at 1 MP)."""
    return (size // 16) ** 2


def from_user_run(result: dict, caption_tokens: float, size: int) -> dict:
    """user_runs.py's row as this script's columns (its tokens/s are the real joint tokens)."""
    out = {"steps": result.get("steps", 0), "first_step_s": result.get("first_step_s"),
           "peak_torch_gib": result.get("peak_gib"), "wall_s": result.get("wall_s")}  # fmt: skip
    if result.get("step_s"):
        out["s_per_step"] = result["step_s"]
        out["images_per_s"] = IMAGES / result["step_s"]
        out["image_tokens_per_s"] = IMAGES * image_tokens(size) / result["step_s"]
        out["joint_tokens_per_s"] = result.get("tokens_per_s") or (
            IMAGES * (image_tokens(size) + caption_tokens) / result["step_s"]
        )
    return out


def fallbacks(log: str, limit: int = 12) -> list[str]:
    """The log's fallback and warning lines, each once (the first `limit`)."""
    seen: list[str] = []
    for line in log.splitlines():
        text = re.sub(r"^\S+ \S+ ", "", line.strip())[:240]
        if FALLBACK.search(text) and text not in seen:
            seen.append(text)
    return seen[:limit]


class SmiPeak:
    """The GPU's nvidia-smi memory.used peak above its use when started (GiB), sampled every 0.5 s."""

    def __init__(self, device: str):
        self.on = device.startswith("cuda") and shutil.which("nvidia-smi") is not None
        self.index = device.partition(":")[2] or "0"
        self.peak = self.base = 0.0
        self._stop = threading.Event()

    def _used(self) -> float:
        out = subprocess.run(["nvidia-smi", "-i", self.index, "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout  # fmt: skip
        return float(out.split()[0]) / 1024

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            with contextlib.suppress(OSError, subprocess.SubprocessError, ValueError, IndexError):
                self.peak = max(self.peak, self._used())  # a missed sample: the next one counts

    def __enter__(self):
        if self.on:
            self.base = self.peak = self._used()
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self.on:
            self._thread.join()

    @property
    def gib(self) -> float | None:
        return self.peak - self.base if self.on else None


def run_logged(argv: list[str], env: dict, log: Path, timeout: float, cwd: Path = ROOT) -> int | str:
    """Run `argv` into `log`; past `timeout` it gets Ctrl+C first (SimpleTuner's CLI then stops the
    `accelerate launch` session it started, which a kill of the CLI alone would leave on the GPU), then a
    kill after STOP_GRACE_S."""
    with open(log, "a") as f:
        f.write(f"$ {' '.join(argv)}\n")
        f.flush()
        process = subprocess.Popen(argv, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=cwd)
        try:
            return process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            return "timeout"


def run_peer(a, side: Side) -> dict:
    """The peer's setup commands (untimed), then its trainer under the nvidia-smi sampler."""
    log = Path(a.work) / f"{side.peer}-{side.row.replace('/', '-')}.log"
    log.unlink(missing_ok=True)
    shutil.rmtree(side.run_dir, ignore_errors=True)
    if "KOHAKUMOSS_KERNEL_CACHE" in side.env:  # 0.1.0: an empty tuning cache, as ours
        shutil.rmtree(side.env["KOHAKUMOSS_KERNEL_CACHE"], ignore_errors=True)
    for argv in side.setup:
        rc = run_logged(argv, side.env, log, a.row_timeout, side.cwd)
        if rc != 0:
            return {"rc": rc, "stopped": f"setup exit {rc}: {tail(log)}", "log": str(log)}
    t0 = time.perf_counter()
    with SmiPeak(a.device) as smi:
        rc = run_logged(side.argv, side.env, log, a.row_timeout, side.cwd)
    out = {"rc": rc, "wall_s": time.perf_counter() - t0, "log": str(log), "peak_smi_gib": smi.gib}
    if side.peer == SIMPLETUNER:
        text = log.read_text(errors="replace")
        out.update(read_simpletuner(side.run_dir, a.warmup, mean_caption_tokens(data_dir(a)), a.size, text))
        out["completed"] = rc == 0 and out["steps"] == a.steps
    elif side.row == "sample/whole":
        out.update(read_km010_sample(side.run_dir, log.read_text(errors="replace"), a.sample_steps))
        out["completed"] = rc == 0 and out["steps"] == a.sample_steps
    else:
        out.update(read_km010(side.run_dir, a.warmup, mean_caption_tokens(data_dir(a))))
        out["completed"] = rc == 0 and out["steps"] == a.steps
    if not out["completed"]:
        out["stopped"] = f"exit {rc}: {tail(log)}"
    return out


def tail(log: Path) -> str:
    lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
    return lines[-1][:240] if lines else ""


def run_ours(a, row: str, ur, ur_a, our_row: str | None = None) -> dict:
    """Our side of `row`: user_runs.py's row of the same card, or `our_row` (a capped copy: at_peak_row)."""
    our_row = our_row or OUR_ROWS.get(row)
    if row == "sample/whole":
        log = Path(a.work) / f"{OURS}-sample.log"
        with SmiPeak(a.device) as smi:
            rc = run_logged(ours_sample_argv(a), dict(os.environ), log, a.row_timeout)
        data = json.loads((Path(a.work) / "ours-sample.json").read_text()) if rc == 0 else []
        rows = data.get("rows", data) if isinstance(data, dict) else data
        fast = next((r for r in rows if r.get("row") == "fast" and "s_per_image" in r), None)
        out = {"rc": rc, "peak_smi_gib": smi.gib, "completed": fast is not None}
        if fast:
            out.update(s_per_step=fast["s_per_image"] / a.sample_steps, images_per_s=fast["images_per_s"],
                       peak_torch_gib=fast.get("peak_gib"))  # fmt: skip
        return out
    with SmiPeak(a.device) as smi:
        result = ur.run_row(ur_a, ur.parse_row(our_row), Path(a.work))
    out = from_user_run(result, mean_caption_tokens(data_dir(a)), a.size)
    out.update(rc=result["rc"], completed=result["completed"], peak_smi_gib=smi.gib, stopped=result.get("stopped"),
               plan=result.get("plan"), predicted_gib=result.get("predicted_gib"))  # fmt: skip
    run = Path(a.work) / "runs" / our_row.replace("/", "-")
    logs = Path(ur_a.logs) / run.name / "log.txt"
    out["fallbacks"] = fallbacks(logs.read_text(errors="replace") if logs.exists() else "")
    return out


def at_peak_row(row: str, peak_gib: float) -> str:
    """user_runs.py's row of `row`'s adapter and images on a card of `peak_gib` (CARD_GB: a peer's
    nvidia-smi peak on the row, rounded down to 0.1 GiB): our planner then picks the fastest plan whose
    estimate, with the CUDA context and margin a card needs, fits the memory the peer's process held."""
    cap = math.floor(peak_gib * 10) / 10
    return f"card{cap:g}/{OUR_ROWS[row].split('/', 1)[1]}"


def peer_peak(side: dict) -> float | None:
    """What a peer's process held on the card: its nvidia-smi peak, else its torch peak."""
    return side.get("peak_smi_gib") or side.get("peak_torch_gib")


def at_peak_plan(results: dict, rows: list[str]) -> list[tuple[str, str, str]]:
    """(row, peer, our capped row) for each peer's completed training side of `rows` with a peak."""
    return [(row, peer, at_peak_row(row, peer_peak(r))) for (peer, row), r in sorted(results.items())
            if peer != OURS and row in rows and row in OUR_ROWS and r.get("completed") and peer_peak(r)]  # fmt: skip


def why_not(peer: str, row: str, a) -> str | None:
    """Why `peer` has no run of `row` here, or None when it runs."""
    if peer in CANNOT:
        return CANNOT[peer]
    if peer == KM010:
        if row in KM010_CANNOT:
            return KM010_CANNOT[row]
        if not (Path(a.peer_root) / KM010 / "kohakumoss" / "bundle").is_dir():
            return f"KohakuMoss 0.1.0 is not installed under {Path(a.peer_root) / KM010} (bundle_peers.sh)"
    if peer == SIMPLETUNER:
        if row in ST_CANNOT:
            return ST_CANNOT[row]
        if not (simpletuner_folder(a) / "simpletuner" / "examples" / ST_EXAMPLES[row]).is_dir():
            return f"SimpleTuner 4.10.1 is not installed under {simpletuner_folder(a)} (bundle_peers.sh --simpletuner)"
    return None


def peer_side(a, peer: str, row: str) -> Side:
    """The side of `peer` that runs `row` (why_not(peer, row) is None)."""
    if peer == SIMPLETUNER:
        return simpletuner_side(a, row)
    return km010_sample_side(a) if row == "sample/whole" else km010_side(a, row)


def comparison(results: dict) -> list[dict]:
    """The doc rows: one per (peer, row, metric) both sides measured; `row@peak` for our side capped at the
    peer's nvidia-smi peak on the row (--at-peer-peak)."""
    rows = []
    for (peer, row), theirs in sorted(results.items()):
        if peer == OURS or not theirs.get("completed"):
            continue
        ours = results.get((OURS, row), {})
        sides = [(row, ours), (row + "@peak", results.get((OURS, f"{row}{AT_PEAK}{peer}"), {}))]
        for name, side in sides:
            if not side.get("completed"):
                continue
            for key, unit, higher in METRICS:
                if side.get(key) is not None and theirs.get(key) is not None:
                    rows.append({"peer": peer, "row": name, "metric": key, "ours": side[key], "theirs": theirs[key],
                                 "unit": unit, "higher_is_better": higher})  # fmt: skip
    return rows


def fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def table(results: dict) -> list[str]:
    lines = [f"{'peer':<18} {'row':<13} {'done':>4} {'s/step':>7} {'img/s':>6} {'joint tok/s':>11} {'img tok/s':>9} "
             f"{'torch GiB':>9} {'smi GiB':>7} {'step 1 s':>8} {'run s':>6}  fallbacks / why not"]  # fmt: skip
    for (peer, row), r in sorted(results.items()):
        note = r.get("not_measured") or r.get("stopped") or "; ".join(r.get("fallbacks") or [])
        lines.append(
            f"{peer:<18} {row:<13} {'yes' if r.get('completed') else 'NO':>4} {fmt(r.get('s_per_step'), '.3f'):>7} "
            f"{fmt(r.get('images_per_s'), '.2f'):>6} {fmt(r.get('joint_tokens_per_s'), ',.0f'):>11} "
            f"{fmt(r.get('image_tokens_per_s'), ',.0f'):>9} {fmt(r.get('peak_torch_gib'), '.1f'):>9} "
            f"{fmt(r.get('peak_smi_gib'), '.1f'):>7} {fmt(r.get('first_step_s'), '.0f'):>8} "
            f"{fmt(r.get('wall_s'), '.0f'):>6}  {note[:160]}"
        )
    return lines


def options(a) -> dict:
    """What a side ran with, kept beside its columns (and in the doc JSON)."""
    return {"preset": a.preset, "size": a.size, "steps": a.steps, "warmup": a.warmup, "images_per_step": IMAGES,
            "rank": RANK, "caption_words": a.caption_words, "sample_steps": a.sample_steps, "cfg": 3.0,
            "device": a.device, "gpu": gpu_name()}  # fmt: skip


def gpu_name() -> str | None:
    """nvidia-smi's name of GPU 0 (None without one): which card a side's columns are from."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def write_doc_json(path: Path, results: dict, a) -> None:
    """docs/performance/data/peers_<date>.json: the comparison rows, what was not measured and why."""
    doc = {
        "rows": comparison(results),
        "not_measured": [
            {"peer": p, "row": r, "why": v["not_measured"]}
            for (p, r), v in sorted(results.items())
            if v.get("not_measured")
        ],  # fmt: skip
        "failed": [
            {"peer": p, "row": r, "why": v.get("stopped")}
            for (p, r), v in sorted(results.items())
            if not v.get("not_measured") and not v.get("completed")
        ],  # fmt: skip
        # the options the sides ran with (a --merge'd call's own), else this call's
        "config": next((v["options"] for v in results.values() if v.get("options")), options(a)),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")


def prepare(a, layouts: list[str]) -> None:
    """The shared inputs, made once: the data set, and the weights the peers load (write_weights.py)."""
    if not data_dir(a).exists():
        subprocess.run([sys.executable, str(BENCH / "make_images.py"), str(data_dir(a)), str(a.images), str(a.size),
                        a.caption_words], check=True)  # fmt: skip
    if layouts:
        subprocess.run([sys.executable, str(BENCH / "write_weights.py"), str(weights_dir(a)), "--preset", a.preset,
                        "--layouts", ",".join(layouts), "--seed", "0", "--device", a.device], check=True)  # fmt: skip


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", default=",".join(ROWS), help=f"comma list of {ROWS}")
    p.add_argument("--peers", default=",".join(PEERS), help=f"comma list of {PEERS} (ours always runs)")
    p.add_argument("--peer-root", default="/tmp/peers", help="one install folder per peer (bundle_peers.sh)")
    p.add_argument("--preset", default="moss-image-5b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--size", type=int, default=1024)
    p.add_argument(
        "--text-tokens", type=int, default=256, help="our TEXT_PAD budget per image (user_runs.py)"
    )
    p.add_argument("--caption-words", default="3-40", help="words per synthetic caption (varied lengths)")
    p.add_argument("--images", type=int, default=16, help="synthetic images in the data set")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the medians")
    p.add_argument("--sample-steps", type=int, default=50)
    p.add_argument("--row-timeout", type=float, default=900)
    p.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE", help="a knob for our rows")
    p.add_argument(
        "--work", default="/tmp/peers-work", help="working folder (runs, caches: keep it out of $OUT)"
    )
    p.add_argument(
        "--weights-dir", default="/tmp/kohakumoss-weights", help="write_weights.py's folders, per preset"
    )
    p.add_argument("--seed-cache", default=None, help="our rows start from a copy of this kernel cache")
    p.add_argument("--logs", default=None, help="copy every side's logs here (default $OUT/peers-logs)")
    p.add_argument("--out", default=None, help="every run's columns as JSON (default $OUT/peers.json)")
    p.add_argument(
        "--doc-json", default=None, help="the comparison rows (docs/performance/data/peers_DATE.json)"
    )
    p.add_argument("--dry-run", action="store_true", help="print each side's commands, run nothing")
    p.add_argument("--preflight", action="store_true",
                   help="check SimpleTuner's side where it will run (peer_path/simpletuner_preflight.py), run nothing else")  # fmt: skip
    p.add_argument("--card-gb", type=float, default=0.0,
                   help="the card a 'whole' row's layer is read for (default: nvidia-smi's; a dry run without a GPU)")  # fmt: skip
    p.add_argument("--at-peer-peak", action="store_true",
                   help="then our side of each row again, CARD_GB at each peer's nvidia-smi peak on it (this call's or --merge'd)")  # fmt: skip
    p.add_argument("--skip-ours", action="store_true", help="the peers' sides only (ours in another call)")
    p.add_argument("--merge", action="append", default=[], metavar="JSON",
                   help="an earlier call's --out (same machine): its sides join this call's in the tables")  # fmt: skip
    a = p.parse_args(argv)
    rows = [r for r in a.rows.split(",") if r]
    peers = [q for q in a.peers.split(",") if q]
    if bad := sorted(set(rows) - set(ROWS)) + sorted(set(peers) - set(PEERS)):
        raise SystemExit(f"unknown rows / peers {bad}; rows {ROWS}, peers {PEERS}")
    Path(a.work).mkdir(parents=True, exist_ok=True)
    if a.preflight:
        raise SystemExit(simpletuner_preflight(a))
    ur, ur_a = ur_args(a)
    if a.card_gb > 0:
        ur.card_gb = lambda device: a.card_gb
    results: dict = merged(a.merge)
    plan = []
    for row in rows:
        if not a.skip_ours:
            plan.append((OURS, row, None))
        for peer in peers:
            plan.append((peer, row, why_not(peer, row, a)))
    if a.dry_run:
        for peer, row, why in plan:
            print(f"=== {peer} {row}")
            if why:
                print(f"    not run: {why}")
            elif peer == OURS:
                argv = ours_sample_argv(a) if row == "sample/whole" else ur.kogine_argv(
                    ur.knobs(ur_a, ur.parse_row(OUR_ROWS[row]), Path(a.work)))  # fmt: skip
                print("    " + " ".join(argv))
            else:
                side = peer_side(a, peer, row)
                cd = f"cd {side.cwd} && " if side.cwd != ROOT else ""
                for cmd in [*side.setup, side.argv]:
                    print(f"    {cd}PYTHONPATH={side.env['PYTHONPATH']} " + " ".join(cmd))
        return {}
    if plan:  # none with --rows "": the tables and --doc-json of --merge'd calls only
        km010 = [row for peer, row, why in plan if peer == KM010 and why is None]
        st = [row for peer, row, why in plan if peer == SIMPLETUNER and why is None]
        pipeline = "sample/whole" in km010 or bool(st)  # SimpleTuner loads every model from the pipeline tree
        prepare(a, (["hf"] if km010 or st else []) + (["pipeline"] if pipeline else []))
    for peer, row, why in plan:
        print(f"=== {peer} {row}", flush=True)
        if why:
            results[(peer, row)] = {"not_measured": why, "completed": False}
        elif peer == OURS:
            results[(peer, row)] = run_ours(a, row, ur, ur_a)
        else:
            results[(peer, row)] = run_peer(a, peer_side(a, peer, row))
        results[(peer, row)]["options"] = options(a)
        print("\n".join(table({(peer, row): results[(peer, row)]})[1:]), flush=True)
    for row, peer, our_row in at_peak_plan(results, rows) if a.at_peer_peak else []:
        key = (OURS, f"{row}{AT_PEAK}{peer}")
        print(f"=== {OURS} {row} on a card of {peer}'s nvidia-smi peak: {our_row}", flush=True)
        results[key] = {**run_ours(a, row, ur, ur_a, our_row), "options": options(a), "our_row": our_row}
        print("\n".join(table({key: results[key]})[1:]), flush=True)
    # the options the sides ran with (a --merge'd call's own)
    ran = next((v["options"] for v in results.values() if v.get("options")), None) or options(a)
    print(f"\n{ran['preset']} random weights, {ran['size']}x{ran['size']}, {IMAGES} images per step, LoRA r{RANK} "
          f"attn-mlp, {ran['steps']} steps (medians after {ran['warmup']}), {ran.get('gpu') or 'GPU not read'}")  # fmt: skip
    print("\n".join(table(results)))
    out = a.out or (os.path.join(os.environ["OUT"], "peers.json") if os.environ.get("OUT") else None)
    if out:
        Path(out).write_text(json.dumps([{"peer": p, "row": r, **v} for (p, r), v in results.items()], indent=2,
                                        default=str))  # fmt: skip
        print(f"wrote {out}")
    if a.doc_json:
        write_doc_json(Path(a.doc_json), results, a)
        print(f"wrote {a.doc_json}")
    keep_logs(a)
    return results


def merged(paths: list[str]) -> dict:
    """(peer, row) -> columns of earlier calls' --out files (a device call runs a few rows at most)."""
    out: dict = {}
    for path in paths:
        for side in json.loads(Path(path).read_text()):
            out[(side.pop("peer"), side.pop("row"))] = side
    return out


def keep_logs(a) -> None:
    """Every side's console log and our runs' records into --logs (or $OUT/peers-logs): the work folder
    holds caches and runs too large to bring back."""
    dest = a.logs or (os.path.join(os.environ["OUT"], "peers-logs") if os.environ.get("OUT") else None)
    if not dest:
        return
    Path(dest).mkdir(parents=True, exist_ok=True)
    for log in Path(a.work).glob("*.log"):
        shutil.copy(log, Path(dest) / log.name)
    for run in (Path(a.work) / "km010-runs").glob("*"):
        for name in ("log.txt", "metrics.jsonl"):
            if (run / name).exists():
                shutil.copy(run / name, Path(dest) / f"{KM010}-{run.name}-{name}")
    for run in (Path(a.work) / "simpletuner").glob("*/output"):
        for name in ("training_metrics.jsonl", "simpletuner_config.json"):
            if (run / name).exists():
                shutil.copy(run / name, Path(dest) / f"{SIMPLETUNER}-{run.parent.name}-{name}")
    if (Path(a.work) / "logs").is_dir():
        shutil.copytree(Path(a.work) / "logs", Path(dest) / OURS, dirs_exist_ok=True)


if __name__ == "__main__":
    main()

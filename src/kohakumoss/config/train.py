"""The knobs of scripts/train/moss.py: names, defaults, types, ranges and one line of help each.

The script lists the same knobs with the same defaults (tests/config/test_train_knobs.py checks it);
this schema is what validates them before any work starts, and what `kohakumoss-config` documents.
"""

from __future__ import annotations

from kohakumoss.adapters.algos import ALGOS
from kohakumoss.adapters.targets import TARGET_PRESETS
from kohakumoss.diffusion.objective import LOSS_TYPES, REDUCTIONS, WEIGHTINGS
from kohakumoss.diffusion.prompts import prompt_file_problem, prompt_list_problem
from kohakumoss.diffusion.timestep import MODE_SCALE_RANGE, SHIFT_MODES, SIGMA_MODES
from kohakumoss.memory.plan import (
    ACTIVATION_OFFLOAD_MODES,
    CHECKPOINT_MODES,
    ENCODER_PLACEMENTS,
    OPTIMIZER_PLACEMENTS,
)
from kohakumoss.memory.profiles import profile_problem
from kohakumoss.precision import BASE_PRECISIONS

from .knobs import Knob, Schema

ENCODE_PLACEMENTS = (
    "auto",
    "cache",
    "online",
)  # auto: cache hits, misses encoded in the step and written back
SAVE_FORMATS = ("comfy", "hf", "both")
PRECISIONS = ("bf16", "fp16", "fp32")
ALGO_CHOICES = (*sorted(ALGOS), "full")

_ANY = (str, type(None))
_INT_OR_NONE = (int, type(None))


def _optimizer_problem(value: str) -> str | None:
    from kohakumoss.train.optim import optimizer_problem

    return optimizer_problem(value)


def _exists_or_synthetic(value: str, knob: str) -> str | None:
    from pathlib import Path

    if value in ("", "synthetic") or Path(value).exists():
        return None
    return f"path '{value}' does not exist"


def _resume_rule(name: str, value: object) -> str | None:
    from kohakumoss.train import resume  # imported when checked: the trainer's rules, one definition

    return getattr(resume, name)(value)


def _ops_backend(value: str) -> str | None:
    """auto, or backend names (comma-separated) the kernel registry knows."""
    from kohakumoss_kernels.registry import BACKENDS

    if not isinstance(value, str) or not value:
        return f"{value!r} is not 'auto' or backend names"
    unknown = [n for n in value.split(",") if n not in BACKENDS] if value != "auto" else []
    return f"unknown backend(s) {unknown}; known: auto, {', '.join(BACKENDS)}" if unknown else None


def _distributed_mode(value: str) -> str | None:
    from kohakumoss.distributed.knobs import mode_problem
    from kohakumoss.distributed.trainer import TRAINER_MODES

    if problem := mode_problem(value):
        return problem
    if value not in TRAINER_MODES:
        return f"'{value}' is not driven by the trainer yet (kohakumoss.distributed has it); use 'ddp'"
    return None


def _distributed_devices(value: int | list) -> str | None:
    from kohakumoss.distributed.knobs import devices_problem

    return devices_problem(value, "ddp")  # DEVICES with DISTRIBUTED='none': the trainer's own check


def _loggers(value: list) -> str | None:
    from kohakumoss.train.tracking import loggers_problem  # imported when checked: a trainer module

    return loggers_problem(value)


ENCODER_KNOBS = [
    Knob(
        "TEXT_ENCODER",
        "",
        "Qwen3.5 text encoder: HF folder or single ComfyUI-style file ('synthetic': benchmarks only)",
        check=lambda v: _exists_or_synthetic(v, "TEXT_ENCODER"),
    ),
    Knob("TOKENIZER", "", "tokenizer folder (needed with a single-file text encoder)", path="any"),
    Knob("TEXT_TEMPLATE", "", "prompt template with {caption}; empty: the encoder's default"),
    Knob("TEXT_LAYERS", [-1], "hidden-state layer(s) of the text encoder (HF numbering)", type=list),
    Knob(
        "TEXT_ENCODER_QUANT",
        "none",
        "text encoder's block linears: none, fp8 (GEMMs sm89+), fp8_weight, int8 (GEMMs sm80+), int8_weight",
        choices=("none", "fp8", "fp8_weight", "int8", "int8_weight"),  # TextEncoderConfig.quant
    ),
    Knob(
        "ENCODER_PRECISION",
        "auto",
        "text encoder and VAE dtype: auto (fp32 on a CPU, fp16 with PRECISION fp16, else bf16), bf16, fp16, fp32",
        choices=("auto", "bf16", "fp16", "fp32"),
    ),
    Knob(
        "VAE",
        "",
        "FLUX.2 VAE: diffusers folder or single file ('synthetic': benchmarks only)",
        check=lambda v: _exists_or_synthetic(v, "VAE"),
    ),
]

TRAIN_KNOBS = [
    # model and weights
    Knob(
        "WEIGHTS",
        "",
        "DiT checkpoint: file, index json or folder, any layout (native / hf / comfy)",
        path="any",
    ),
    Knob(
        "MODEL_PRESET",
        "",
        "with WEIGHTS empty: random weights of this preset (tiny, moss-image-5b): demos and benchmarks",
    ),
    *ENCODER_KNOBS,
    Knob("DEVICE", "auto", "auto, cpu, cuda, cuda:N or xpu"),
    Knob(
        "PRECISION",
        "bf16",
        "compute precision (autocast); weights of the frozen base follow it",
        choices=PRECISIONS,
    ),
    Knob(
        "BASE_PRECISION",
        "same",
        "frozen block linears: same (as PRECISION), fp8 (fp8 storage and GEMMs, sm89+), fp8_weight (fp8 storage), "
        "int8 (int8 storage and forward GEMMs, sm80+), int8_weight (int8 storage) or mxfp8 (block-scaled, sm100+)",
        choices=BASE_PRECISIONS,
    ),
    # memory plan (docs/concepts/profiles.md): a profile, then per-engine knobs (None: from the profile)
    Knob(
        "MEMORY_PROFILE",
        "auto",
        "auto (fastest catalog entry that fits the card), speed, balanced, low_vram, minimal, or an id like c0042",
        check=profile_problem,
    ),
    Knob(
        "CARD_GB", 0.0, "card memory in GiB that MEMORY_PROFILE 'auto' plans for (0: read the GPU)", min=0.0
    ),
    Knob(
        "CHECKPOINTING",
        None,
        "activation checkpointing: none, full block, attn half or mlp half (None: from the profile)",
        type=_ANY,
        choices=(None, *CHECKPOINT_MODES),
    ),
    Knob(
        "CHECKPOINT_EVERY",
        None,
        "checkpoint every k-th block (None: from the profile)",
        type=_INT_OR_NONE,
        min=1,
    ),
    Knob(
        "STREAM_BLOCKS",
        None,
        "blocks whose weights stream from pinned host memory, -1: all (None: from the profile)",
        type=_INT_OR_NONE,
        min=-1,
    ),
    Knob(
        "STREAM_SLOTS",
        None,
        "GPU slots of the streaming ring, >= 2 (None: from the profile)",
        type=_INT_OR_NONE,
        min=2,
    ),
    Knob(
        "ACTIVATION_OFFLOAD",
        None,
        "saved activations to host memory: none or on (None: from the profile)",
        type=_ANY,
        choices=(None, *ACTIVATION_OFFLOAD_MODES),
    ),
    Knob(
        "GRAD_OFFLOAD",
        None,
        "grads to host fp32 sums (needs OPTIMIZER_PLACEMENT stream or host; None: from the profile)",
        type=(bool, type(None)),
    ),
    Knob(
        "OPTIMIZER_PLACEMENT",
        None,
        "optimizer states and fp32 masters: gpu, stream or host (None: from the profile)",
        type=_ANY,
        choices=(None, *OPTIMIZER_PLACEMENTS),
    ),
    Knob(
        "TEXT_ENCODER_PLACEMENT",
        None,
        "text encoder: resident, streamed or off (off: the text cache must hit; None: from the profile)",
        type=_ANY,
        choices=(None, *ENCODER_PLACEMENTS),
    ),
    Knob(
        "VAE_PLACEMENT",
        None,
        "VAE: resident, streamed or off (off: the latent cache must hit; None: from the profile)",
        type=_ANY,
        choices=(None, *ENCODER_PLACEMENTS),
    ),
    Knob(
        "OPS_BACKEND",
        "auto",
        "kernel registry backend: auto (per-arch priority), eager (the reference), or backend names in order (tilelang, triton, ...; the ones never run on this card's kind are used only so)",
        check=_ops_backend,
    ),
    Knob(
        "DETERMINISTIC",
        False,
        "bitwise reproducible steps: torch's deterministic algorithms, a fixed cuBLAS workspace, no kernel backend that adds with atomics",
    ),
    Knob(
        "CUDA_GRAPHS",
        "auto",
        "replay each micro-step from a CUDA graph: auto (where the plan allows), on (refuse otherwise), off",
        choices=("auto", "on", "off"),
    ),
    Knob(
        "DISTRIBUTED",
        "none",
        "none or ddp: one worker process per DEVICES entry, gradients all-reduced (docs/guides/multi-gpu.md)",
        check=_distributed_mode,
    ),
    Knob(
        "DEVICES",
        1,
        "workers of this node: a count (0: every visible GPU) or a list ([0, 2], ['cpu', 'cpu'])",
        type=(int, list),
        check=_distributed_devices,
    ),
    Knob(
        "DIST_TIMEOUT",
        1800.0,
        "seconds a collective waits for a missing rank before the run stops, naming it",
        min=1.0,
    ),
    Knob(
        "GC_EVERY",
        0,
        "Python's garbage collector: 0 its own; N: setup frozen, collected every N steps while the GPU works",
        type=int,
    ),
    # data
    Knob(
        "DATASET",
        {"kind": "kohya", "path": "data/train"},
        "data source: {'kind': kohya|folder|jsonl|parquet|webdataset|shards, 'path': ...}, or a list of them; "
        "per dataset also repeats, caption_dropout, shuffle_caption, keep_tokens, tag_dropout, reg, loss_weight, mask",
        type=(dict, list),
    ),
    Knob("CATALOG_DIR", None, "where the catalog cache lives (None: beside the dataset)", type=_ANY),
    Knob("CACHE_DIR", "cache", "latent and text caches (safetensors shards)"),
    Knob(
        "VAE_ENCODE",
        "auto",
        "latents: auto (cache, misses encoded in the step and written back), cache (must hit), online",
        choices=ENCODE_PLACEMENTS,
    ),
    Knob(
        "TEXT_ENCODE",
        "auto",
        "text embeddings: auto, cache or online (as VAE_ENCODE)",
        choices=ENCODE_PLACEMENTS,
    ),
    Knob("MIN_SIDE", 64, "images with a shorter side are dropped", min=1),
    Knob("MAX_PIXELS", 178_956_970, "decompression-bomb limit in pixels", min=1),
    Knob("MISSING_CAPTION", "empty", "error, empty or filename", choices=("error", "empty", "filename")),
    Knob("SCAN_WORKERS", 4, "threads that probe images during the catalog scan", min=1),
    Knob("AREA", 1024 * 1024, "target pixel area per image (native aspect kept)", min=256),
    Knob("MIN_ASPECT", 0.25, "smallest width/height kept", min=0.01, max=1.0),
    Knob("MAX_ASPECT", 4.0, "largest width/height kept", min=1.0),
    Knob("NO_UPSCALE", False, "never enlarge an image past its own size"),
    Knob("CROP", "center", "center or random (seeded) crop to the target size", choices=("center", "random")),
    Knob("BUCKETS", None, "None, 'kohya', or a list of [w, h] buckets", type=(str, list, type(None))),
    Knob("TOKENS_PER_STEP", 8192, "token budget per optimizer micro-step (image + text tokens)", min=2),
    Knob("MAX_TEXT_TOKENS", 256, "caption tokens budgeted per image", min=1),
    Knob("FLIP_PROB", 0.0, "horizontal flip probability", min=0.0, max=1.0),
    Knob(
        "CAPTION_DROPOUT", 0.0, "probability of an empty caption (trains the unconditional)", min=0.0, max=1.0
    ),
    Knob("SHUFFLE_CAPTION", False, "shuffle comma-separated tags"),
    Knob("KEEP_TOKENS", 0, "leading tags kept in place when shuffling", min=0),
    Knob(
        "TAG_DROPOUT",
        0.0,
        "drop each tag after the KEEP_TOKENS kept ones with this probability",
        min=0.0,
        max=1.0,
    ),
    Knob("WORKERS", 2, "loader worker processes", min=0),
    Knob("PREFETCH_STEPS", 2, "steps prepared ahead", min=1),
    Knob("VAL_ITEMS", 0, "items held out of training for the validation loss (0: none)", min=0),
    Knob("VAL_EVERY", 0, "validation loss every N steps (0: never)", min=0),
    Knob("VAL_SIGMAS", [0.1, 0.3, 0.5, 0.7, 0.9], "fixed sigmas of the validation loss", type=list),
    # adapter or full fine-tune
    Knob("ALGO", "lora", "adapter algorithm (LyCORIS) or 'full' for a full fine-tune", choices=ALGO_CHOICES),
    Knob("RANK", 16, "adapter rank (block size for OFT / BOFT)", min=1),
    Knob("ALPHA", 16.0, "adapter alpha (scale = ALPHA / RANK)", min=0.0),
    Knob("ALGO_ARGS", {}, "extra LyCORIS arguments (factor, block_size, constraint, ...)", type=dict),
    Knob("TARGET_PRESET", "attn-mlp", "which modules the adapter wraps", choices=(*TARGET_PRESETS, "custom")),
    Knob("TARGET_PATTERNS", [], "module name regexes or globs for TARGET_PRESET='custom'", type=list),
    Knob("DROPOUT", 0.0, "adapter dropout", min=0.0, max=1.0),
    Knob("RANK_DROPOUT", 0.0, "adapter rank dropout", min=0.0, max=1.0),
    Knob("MODULE_DROPOUT", 0.0, "adapter module dropout", min=0.0, max=1.0),
    Knob("LORA_PLUS_RATIO", 0.0, "LoRA+: LR multiplier of the up matrices (0: off)", min=0.0),
    Knob("BYPASS", False, "bypass forward (base output + adapter output) instead of merged weights"),
    # optimisation
    Knob(
        "LR", 1e-4, "learning rate (AdamW; adapters and the non-matrix weights of a full fine-tune)", min=0.0
    ),
    Knob("MUON_LR", 0.0, "full fine-tune: Muon LR for hidden matrices (0: same as LR)", min=0.0),
    Knob("USE_MUON", True, "full fine-tune: Muon for hidden 2-D matrices (else AdamW everywhere)"),
    Knob(
        "OPTIMIZER",
        "adamw",
        "adamw, adafactor, adamw8bit, prodigy, schedulefree_adamw or package.Class",
        check=_optimizer_problem,
    ),
    Knob("OPTIMIZER_ARGS", {}, "keyword arguments of OPTIMIZER (betas, d_coef, ...)", type=dict),
    Knob("WEIGHT_DECAY", 0.0, "weight decay", min=0.0),
    Knob("LR_SCHEDULE", "constant", "constant, linear or cosine", choices=("constant", "linear", "cosine")),
    Knob("LR_WARMUP_STEPS", 0, "linear warmup steps", min=0),
    Knob("LR_MIN_RATIO", 0.0, "final LR / LR for linear and cosine", min=0.0, max=1.0),
    Knob("STEPS", 1000, "optimizer steps", min=1),
    Knob("GRAD_ACCUM", 1, "micro-steps per optimizer step", min=1),
    Knob("GRAD_CLIP", 1.0, "max gradient norm (0: no clipping)", min=0.0),
    Knob("EMA", False, "keep an EMA of the trainable weights"),
    Knob("EMA_DECAY", 0.999, "EMA decay", min=0.0, max=1.0),
    Knob("EMA_WARMUP", 100, "steps over which the EMA decay ramps up", min=0),
    Knob("EMA_EVERY", 1, "EMA update interval in steps", min=1),
    Knob("EXPORT_EMA", False, "export the EMA weights instead of the raw ones"),
    # objective
    Knob("TIMESTEP_SAMPLING", "logit_normal", "sigma distribution", choices=SIGMA_MODES),
    Knob("LOGIT_MEAN", 0.0, "logit-normal mean"),
    Knob("LOGIT_STD", 1.0, "logit-normal std", min=1e-3),
    Knob("TIMESTEP_SHIFT", "resolution", "none, static or resolution-dependent shift", choices=SHIFT_MODES),
    Knob("STATIC_SHIFT", 3.0, "shift for TIMESTEP_SHIFT='static'", min=1e-3),
    Knob(
        "MODE_SCALE",
        1.29,
        "s of TIMESTEP_SAMPLING='mode' (SD3; 0: uniform, > 0: more mid sigmas)",
        min=MODE_SCALE_RANGE[0],
        max=MODE_SCALE_RANGE[1],
    ),
    Knob("LOSS_WEIGHTING", "none", "per-sigma loss weight", choices=WEIGHTINGS),
    Knob(
        "LOSS_REDUCTION",
        "token",
        "token: every image token alike; sample: every sample alike",
        choices=REDUCTIONS,
    ),
    Knob("MIN_SNR_GAMMA", 5.0, "gamma of LOSS_WEIGHTING='min_snr'", min=1e-3),
    Knob("LOSS_TYPE", "l2", "velocity error: l2, l1, huber or pseudo_huber", choices=LOSS_TYPES),
    Knob("HUBER_C", 0.1, "c of LOSS_TYPE huber / pseudo_huber (l2 below c, linear beyond)", min=1e-6),
    Knob("MAX_BAD_STEPS", 5, "stop after this many non-finite losses in a row", min=1),
    # run, checkpoints, samples, exports
    Knob("SEED", 0, "seed of the plan, the sigmas and the noise"),
    Knob(
        "RUN_NAME",
        "moss-lora",
        "run folder name under RUNS_DIR (a plain name, no path)",
        check=lambda v: _resume_rule("run_name_problem", v),
    ),
    Knob("RUNS_DIR", "runs/moss", "where runs are written"),
    Knob("SAVE_EVERY", 500, "checkpoint every N steps (0: only at the end)", min=0),
    Knob("KEEP_LAST", 3, "checkpoints kept (older ones deleted)", min=1),
    Knob("RESUME", "", "'' (fresh run), 'latest' or a checkpoint folder"),
    Knob(
        "RESUME_ALLOW_CHANGES",
        [],
        "knobs that may differ from the checkpoint's on resume: only LR / schedule / STEPS / GRAD_CLIP / EMA_* / dropouts / moved WEIGHTS, TEXT_ENCODER, VAE are safe",
        type=list,
        check=lambda v: _resume_rule("allow_changes_problem", v),
    ),
    Knob(
        "RESUME_REPLAN",
        False,
        "resume a run whose data changed (files removed or added): continue along today's plan from the checkpoint's step",
    ),
    Knob(
        "STOP_AT",
        0,
        "stop this invocation at this step with a checkpoint (0: run to STEPS); resume later",
        min=0,
    ),
    Knob("LOG_EVERY", 1, "metrics line every N steps", min=1),
    Knob(
        "LOGGERS",
        ["tensorboard"],
        "trackers: tensorboard (events in RUN/tensorboard/), wandb (pip install wandb)",
        type=list,
        check=_loggers,
    ),
    Knob("SAMPLE_EVERY", 0, "sample grid every N steps (0: only at the end, if prompts are set)", min=0),
    Knob(
        "SAMPLE_PROMPTS",
        [],
        "prompts of the sample grid (one column each); kohya flags as in SAMPLE_PROMPTS_FILE",
        type=list,
        check=lambda v: prompt_list_problem(v, "SAMPLE_PROMPTS"),
    ),
    Knob(
        "SAMPLE_PROMPTS_FILE",
        "",
        "more sample prompts, one a line: prompt --n neg --w W --h H --d seed --l cfg --s steps (# comments)",
        path="file",
        check=lambda v: prompt_file_problem(v, "SAMPLE_PROMPTS_FILE"),
    ),
    Knob("SAMPLE_SEEDS", [], "one seed per prompt (default: 0, 1, 2, ...)", type=list),
    Knob("SAMPLE_NEGATIVE", "", "negative prompt of the samples"),
    Knob("SAMPLE_STEPS", 20, "sampler steps", min=1),
    Knob("SAMPLE_CFG", 3.0, "classifier-free guidance scale", min=0.0),
    Knob("SAMPLE_SHIFT", 5.0, "sampler schedule shift (5: as released)", min=0.0),
    Knob("SAMPLE_WIDTH", 1024, "sample width in px (multiple of 16)", min=16),
    Knob("SAMPLE_HEIGHT", 1024, "sample height in px (multiple of 16)", min=16),
    Knob("SAVE_FORMAT", "comfy", "comfy: the ComfyUI LoRA; hf: the LyCORIS file; both", choices=SAVE_FORMATS),
    Knob(
        "COMFY_DIFFS",
        "end",
        "ComfyUI files made of full weight differences (DoRA, BOFT, IA3, T-LoRA): end (the final export "
        "only; checkpoints keep the LyCORIS file) or every (each checkpoint too)",
        choices=("end", "every"),
    ),
    Knob("SAVE_MERGED", False, "also write the merged transformer"),
    Knob("SAVE_DIFFUSERS", False, "also write a diffusers-layout transformer"),
    Knob("TRIGGER_PHRASE", "", "the adapter files' modelspec.trigger_phrase (empty: none)"),
]

TRAIN_SCHEMA = Schema(TRAIN_KNOBS)

"""The knobs of scripts/train/moss.py as one typed config: `TrainConfig`, a frozen dataclass of sections.

Each field is one knob (its name upper-cased) with its type, its one default, its help and its bounds
(kohakumoss_common/typed_config.py). The schema that validates the script's knobs before any work starts, what
`kohakumoss-config` writes and checks, and the knob reference (docs/guides/train-knobs.md,
`python -m kohakumoss.config.reference`) are generated from it. The script lists the same knobs with
the same defaults (tests/trainer/test_scripts.py checks it).
"""

from __future__ import annotations

from dataclasses import dataclass

from kohakumoss.adapters.config import AdapterConfig
from kohakumoss.diffusion.generate import GenerationRequest
from kohakumoss.diffusion.objective import LOSS_TYPES, REDUCTIONS, WEIGHTINGS, LossConfig
from kohakumoss.diffusion.prompts import prompt_file_problem, prompt_list_problem
from kohakumoss.diffusion.sampler import SamplerConfig as Sampler
from kohakumoss.diffusion.timestep import MODE_SCALE_RANGE, SHIFT_MODES, SIGMA_MODES, TimestepConfig
from kohakumoss.distributed.config import DistributedConfig
from kohakumoss.memory.config import MemoryConfig
from kohakumoss.optim.build import USE_MUON
from kohakumoss.optim.names import DEFAULT_OPTIMIZER
from kohakumoss.precision import BASE_PRECISIONS
from kohakumoss_common.knobs import Schema
from kohakumoss_common.typed_config import (
    UNDECLARED,
    ScriptConfig,
    config_knobs,
    knob,
    resume_knobs,
    section,
)
from kohakumoss_data import LoaderKnobs, PlanKnobs, ScanKnobs
from kohakumoss_data.caption_format import CAPTION_FORMATS

from .bounds import SEED_MAX, SEED_MIN, device_problem, seeds_problem
from .rules import SCHEDULES

ENCODE_PLACEMENTS = (
    "auto",
    "cache",
    "online",
)  # auto: the plan's misses encoded before the first step and cached
SAVE_FORMATS = ("comfy", "hf", "both")


def save_format_knob(default: str, resume: str | None = UNDECLARED) -> str:
    """The SAVE_FORMAT field of the trainer's and the export script's configs (one help, one set of choices)."""
    return knob(
        default, "comfy: the ComfyUI LoRA; hf: the LyCORIS file; both", resume=resume, choices=SAVE_FORMATS
    )


PRECISIONS = ("bf16", "fp16", "fp32")


def _optimizer_problem(value: str) -> str | None:
    from kohakumoss.optim.names import optimizer_problem

    return optimizer_problem(value)


def _exists_or_stand_in(value: str, knob: str) -> str | None:
    """A path that exists, or a benchmark stand-in: 'synthetic' or 'random'."""
    from pathlib import Path

    if value in ("", "synthetic", "random") or Path(value).exists():
        return None
    return f"path '{value}' does not exist"


def _resume_rule(name: str, value: object) -> str | None:
    from . import rules  # the trainer applies the same rules (train/resume.py)

    return getattr(rules, name)(value)


def _ops_backend(value: str) -> str | None:
    """auto, or backend names (comma-separated) the kernel registry knows."""
    from kohakumoss_kernels.registry import BACKENDS

    if not isinstance(value, str) or not value:
        return f"{value!r} is not 'auto' or backend names"
    unknown = [n for n in value.split(",") if n not in BACKENDS] if value != "auto" else []
    return f"unknown backend(s) {unknown}; known: auto, {', '.join(BACKENDS)}" if unknown else None


def _profile_steps(value: list) -> str | None:
    ok = not value or (
        len(value) == 2 and all(isinstance(v, int) and v >= 1 for v in value) and value[0] <= value[1]
    )
    return None if ok else f"{value} is not [first, last] with 1 <= first <= last (e.g. [5, 7])"


def _loggers(value: list) -> str | None:
    from .rules import loggers_problem  # imported when checked: it looks for the trackers' packages

    return loggers_problem(value)


@dataclass(frozen=True)
class ModelConfig:
    """The DiT's weights."""

    weights: str = knob(
        "",
        "DiT checkpoint: file, index json or folder, any layout (native / hf / comfy)",
        resume="safe",
        path="any",
    )
    model_preset: str = knob(
        "",
        "with WEIGHTS empty: random weights of this preset (tiny, moss-image-5b): demos and benchmarks",
        resume="fixed",
    )


@dataclass(frozen=True)
class EncoderConfig:
    """The text encoder and the VAE (shared with scripts/sample/sample.py)."""

    text_encoder: str = knob(
        "",
        "Qwen3.5 text encoder: HF folder or single ComfyUI-style file; benchmarks only: 'synthetic' (random "
        "word vectors) or 'random' (the Qwen3.5 architecture with random weights, sized by MODEL_PRESET)",
        resume="safe",
        check=lambda v: _exists_or_stand_in(v, "TEXT_ENCODER"),
    )
    tokenizer: str = knob(
        "",
        "tokenizer folder (empty: the one beside the text encoder, e.g. text_encoders/*/tokenizer)",
        resume="safe",
        path="any",
    )
    text_template: str = knob(
        "", "prompt template with {caption}; empty: the encoder's default", resume="fixed"
    )
    text_layers: list = knob([-1], "hidden-state layer(s) of the text encoder (HF numbering)", resume="fixed")
    text_encoder_quant: str = knob(
        "none",
        "text encoder's block linears: none, fp8 (GEMMs sm89+), fp8_weight, int8 (GEMMs sm80+), int8_weight",
        resume="fixed",
        choices=("none", "fp8", "fp8_weight", "int8", "int8_weight"),
    )
    references_in_prompt: str = knob(
        "picture",
        "edit runs' reference images: picture (shown to the text encoder's vision tower before the caption, "
        "`Picture N:`, as SimpleTuner and ai-toolkit train) or none (not in the prompt: ComfyUI's Moss-Image-Edit LoRA format)",
        resume="fixed",
        choices=("picture", "none"),
    )
    encoder_precision: str = knob(
        "auto",
        "text encoder and VAE dtype: auto (fp32 on a CPU, fp16 with PRECISION fp16, else bf16), bf16, fp16, fp32",
        resume="fixed",
        choices=("auto", "bf16", "fp16", "fp32"),
    )
    vae: str = knob(
        "",
        "FLUX.2 VAE: diffusers folder or single file; benchmarks only: 'synthetic' (a random patch "
        "projection) or 'random' (the FLUX.2 VAE architecture with random weights, sized by MODEL_PRESET)",
        resume="safe",
        check=lambda v: _exists_or_stand_in(v, "VAE"),
    )


@dataclass(frozen=True)
class DeviceConfig:
    """Where the run computes and in what precision."""

    device: str = knob("auto", "auto, cpu, cuda, cuda:N or xpu", resume=None, check=device_problem)
    precision: str = knob(
        "bf16",
        "compute precision (autocast); weights of the frozen base follow it",
        resume="fixed",
        choices=PRECISIONS,
    )
    base_precision: str = knob(
        "same",
        "frozen block linears: same (as PRECISION), fp8 (fp8 storage and GEMMs, sm89+), fp8_weight (fp8 storage), "
        "int8 (int8 storage and forward GEMMs, sm80+), int8_weight (int8 storage) or mxfp8 (block-scaled, sm100+)",
        resume="fixed",
        choices=BASE_PRECISIONS,
    )


# resume=None throughout: backends, graphs and the collector change the speed, not the step's function
@dataclass(frozen=True)
class RuntimeConfig:
    """Kernels, determinism, CUDA graphs, the garbage collector, the profiler."""

    ops_backend: str = knob(
        "auto",
        "kernel registry backend: auto (per-arch priority), eager (the reference), or backend names in order (tilelang, triton, ...; the ones never run on this card's kind are used only so)",
        resume=None,
        check=_ops_backend,
    )
    deterministic: bool = knob(
        False,
        "bitwise reproducible steps: torch's deterministic algorithms, a fixed cuBLAS workspace, no kernel backend that adds with atomics",
        resume=None,
    )
    cuda_graphs: str = knob(
        "auto",
        "replay each micro-step from a CUDA graph: auto (where the plan allows), on (refuse otherwise), off",
        resume=None,
        choices=("auto", "on", "off"),
    )
    gc_every: int = knob(
        0,
        "Python's garbage collector: 0 its own; N: setup frozen, collected every N steps while the GPU works",
        resume=None,
    )
    profile_steps: list = knob(
        [],
        "[first, last]: torch.profiler over these steps; trace and operator tables in <run>/profile/ (empty: off)",
        resume=None,
        check=_profile_steps,
    )


# A knob that sets a field of kohakumoss_data's ScanKnobs / PlanKnobs / LoaderKnobs takes that field's
# default: the data package, the data scripts and the memory estimate then agree on one value.
# DatasetConfig, CacheDirConfig, ScanConfig, PlanConfig and SeedConfig are the knobs the data scripts
# share with training (config/data_scripts.py): DataConfig and RunConfig are built from them.
@dataclass(frozen=True)
class DatasetConfig:
    """The dataset and where its catalog lives."""

    dataset: dict | list = knob(
        {"kind": "kohya", "path": "data/train"},
        "data source: {'kind': kohya|folder|jsonl|parquet|webdataset|shards, 'path': ...}, or a list of them; "
        "per dataset also repeats, caption_dropout, shuffle_caption, keep_tokens, tag_dropout, reg, loss_weight, mask",
        resume="fixed",
    )
    catalog_dir: str | None = knob(
        None, "where the catalog cache lives (None: beside the dataset)", resume=None
    )


@dataclass(frozen=True)
class CacheDirConfig:
    """Where the latent and text caches live."""

    cache_dir: str = knob("cache", "latent and text caches (safetensors shards)", resume=None)


@dataclass(frozen=True)
class ScanConfig:
    """The catalog scan: which images are kept."""

    min_side: int = knob(ScanKnobs.min_side, "images with a shorter side are dropped", resume="fixed", min=1)
    max_pixels: int = knob(ScanKnobs.max_pixels, "decompression-bomb limit in pixels", resume="fixed", min=1)
    missing_caption: str = knob(
        ScanKnobs.missing_caption,
        "error, empty or filename",
        resume="fixed",
        choices=("error", "empty", "filename"),
    )
    scan_workers: int = knob(
        ScanKnobs.workers, "threads that probe images during the catalog scan", resume=None, min=1
    )


@dataclass(frozen=True)
class PlanConfig:
    """The plan: target sizes, buckets, tokens per step, caption augmentation."""

    area: int = knob(
        PlanKnobs.area, "target pixel area per image (native aspect kept)", resume="fixed", min=256
    )
    min_aspect: float = knob(
        PlanKnobs.min_aspect, "smallest width/height kept", resume="fixed", min=0.01, max=1.0
    )
    max_aspect: float = knob(PlanKnobs.max_aspect, "largest width/height kept", resume="fixed", min=1.0)
    no_upscale: bool = knob(PlanKnobs.no_upscale, "never enlarge an image past its own size", resume="fixed")
    crop: str = knob(
        PlanKnobs.crop,
        "center or random (seeded) crop to the target size",
        resume="fixed",
        choices=("center", "random"),
    )
    buckets: str | list | None = knob(
        PlanKnobs.buckets, "None, 'kohya', or a list of [w, h] buckets", resume="fixed"
    )
    tokens_per_step: int = knob(
        PlanKnobs.tokens_per_step,
        "token budget per optimizer micro-step (image, text and reference-image tokens)",
        resume="fixed",
        min=2,
    )
    max_text_tokens: int = knob(
        PlanKnobs.max_text_tokens, "caption tokens budgeted per image", resume="fixed", min=1
    )
    flip_prob: float = knob(
        PlanKnobs.flip_prob, "horizontal flip probability", resume="fixed", min=0.0, max=1.0
    )
    caption_dropout: float = knob(
        PlanKnobs.caption_dropout,
        "probability of an empty caption (trains the unconditional)",
        resume="fixed",
        min=0.0,
        max=1.0,
    )
    shuffle_caption: bool = knob(PlanKnobs.shuffle_caption, "shuffle comma-separated tags", resume="fixed")
    keep_tokens: int = knob(
        PlanKnobs.keep_tokens, "leading tags kept in place when shuffling", resume="fixed", min=0
    )
    tag_dropout: float = knob(
        PlanKnobs.tag_dropout,
        "drop each tag after the KEEP_TOKENS kept ones with this probability",
        resume="fixed",
        min=0.0,
        max=1.0,
    )
    caption_format: str = knob(
        PlanKnobs.caption_format,
        "plain, auto-json (wrap plain captions in MOSS's layout JSON) or json (captions must be layout JSON)",
        resume="fixed",
        choices=CAPTION_FORMATS,
    )


@dataclass(frozen=True)
class DataConfig(PlanConfig, ScanConfig, CacheDirConfig, DatasetConfig):
    """The dataset, its plan (areas, buckets, tokens per step, captions), the caches and the loader."""

    vae_encode: str = knob(
        "auto",
        "latents: auto (what the plan misses is encoded before the first step and cached), cache (must hit), online",
        resume=None,
        choices=ENCODE_PLACEMENTS,
    )
    text_encode: str = knob(
        "auto",
        "text embeddings: auto, cache or online (as VAE_ENCODE)",
        resume=None,
        choices=ENCODE_PLACEMENTS,
    )
    workers: int = knob(LoaderKnobs.workers, "loader worker processes", resume=None, min=0)
    prefetch_steps: int = knob(LoaderKnobs.prefetch_steps, "steps prepared ahead", resume=None, min=1)
    val_items: int = knob(
        0, "items held out of training for the validation loss (0: none)", resume="fixed", min=0
    )
    val_every: int = knob(0, "validation loss every N steps (0: never)", resume=None, min=0)
    val_sigmas: list = knob([0.1, 0.3, 0.5, 0.7, 0.9], "fixed sigmas of the validation loss", resume=None)


@dataclass(frozen=True)
class OptimConfig:
    """The optimizer, its schedule, steps, clipping and EMA."""

    lr: float = knob(
        1e-4,
        "learning rate (AdamW; adapters and the non-matrix weights of a full fine-tune)",
        resume="safe",
        min=0.0,
    )
    muon_lr: float = knob(
        0.0, "full fine-tune: Muon LR for hidden matrices (0: same as LR)", resume="safe", min=0.0
    )
    use_muon: bool = knob(
        USE_MUON, "full fine-tune: Muon for hidden 2-D matrices (else AdamW everywhere)", resume="fixed"
    )
    optimizer: str = knob(
        DEFAULT_OPTIMIZER,
        "adamw, adafactor, adamw8bit, paged_adamw8bit, lion8bit, prodigy, schedulefree_adamw, dadapt_adam or "
        "package.Class (any case; kohya's spellings such as AdamW8bit too)",
        resume="fixed",
        check=_optimizer_problem,
    )
    optimizer_args: dict = knob({}, "keyword arguments of OPTIMIZER (betas, d_coef, ...)", resume="safe")
    weight_decay: float = knob(0.0, "weight decay", resume="safe", min=0.0)
    lr_schedule: str = knob(
        "constant",
        "constant, constant_with_warmup, linear, cosine, cosine_with_restarts, polynomial or rex",
        resume="safe",
        choices=SCHEDULES,
    )
    lr_warmup_steps: int = knob(0, "linear warmup steps", resume="safe", min=0)
    lr_min_ratio: float = knob(
        0.0, "final LR / LR for the decaying schedules", resume="safe", min=0.0, max=1.0
    )
    lr_cycles: int = knob(
        1, "cosine_with_restarts: number of cosine cycles (hard restarts)", resume="safe", min=1
    )
    lr_power: float = knob(1.0, "polynomial: power of the decay (1: linear)", resume="safe", min=1e-3)
    steps: int = knob(1000, "optimizer steps", resume="length", min=1)
    epochs: int = knob(
        0, "train this many epochs of the plan instead of STEPS (0: STEPS decides)", resume="length", min=0
    )
    grad_accum: int = knob(1, "micro-steps per optimizer step", resume="fixed", min=1)
    grad_clip: float = knob(1.0, "max gradient norm (0: no clipping)", resume="safe", min=0.0)
    ema: bool = knob(False, "keep an EMA of the trainable weights", resume="fixed")
    ema_decay: float = knob(0.999, "EMA decay", resume="safe", min=0.0, max=1.0)
    ema_warmup: int = knob(100, "steps over which the EMA decay ramps up", resume="safe", min=0)
    ema_every: int = knob(1, "EMA update interval in steps", resume="safe", min=1)
    export_ema: bool = knob(False, "export the EMA weights instead of the raw ones", resume=None)

    def __post_init__(self) -> None:
        from kohakumoss.optim.names import canonical_optimizer

        # one spelling everywhere (checkpoint member names, resume comparison, metadata): 'AdamW8bit' -> 'adamw8bit'
        object.__setattr__(self, "optimizer", canonical_optimizer(self.optimizer))


@dataclass(frozen=True)
class ObjectiveConfig:
    """The flow-matching objective: sigmas, loss weighting and type."""

    timestep_sampling: str = knob(
        TimestepConfig.mode, "sigma distribution", resume="fixed", choices=SIGMA_MODES
    )
    logit_mean: float = knob(TimestepConfig.logit_mean, "logit-normal mean", resume="fixed")
    logit_std: float = knob(TimestepConfig.logit_std, "logit-normal std", resume="fixed", min=1e-3)
    timestep_shift: str = knob(
        TimestepConfig.shift,
        "none, static or resolution-dependent shift",
        resume="fixed",
        choices=SHIFT_MODES,
    )
    static_shift: float = knob(
        TimestepConfig.static_shift, "shift for TIMESTEP_SHIFT='static'", resume="fixed", min=1e-3
    )
    mode_scale: float = knob(
        TimestepConfig.mode_scale,
        "s of TIMESTEP_SAMPLING='mode' (SD3; 0: uniform, > 0: more mid sigmas)",
        resume="fixed",
        min=MODE_SCALE_RANGE[0],
        max=MODE_SCALE_RANGE[1],
    )
    loss_weighting: str = knob(
        LossConfig.weighting, "per-sigma loss weight", resume="fixed", choices=WEIGHTINGS
    )
    loss_reduction: str = knob(
        LossConfig.reduction,
        "token: every image token alike; sample: every sample alike",
        resume="fixed",
        choices=REDUCTIONS,
    )
    min_snr_gamma: float = knob(
        LossConfig.min_snr_gamma, "gamma of LOSS_WEIGHTING='min_snr'", resume="fixed", min=1e-3
    )
    loss_type: str = knob(
        LossConfig.loss_type,
        "velocity error: l2, l1, huber or pseudo_huber",
        resume="fixed",
        choices=LOSS_TYPES,
    )
    huber_c: float = knob(
        LossConfig.huber_c,
        "c of LOSS_TYPE huber / pseudo_huber (l2 below c, linear beyond)",
        resume="fixed",
        min=1e-6,
    )
    max_bad_steps: int = knob(5, "stop after this many non-finite losses in a row", resume=None, min=1)


@dataclass(frozen=True)
class SeedConfig:
    """The seed (the data scripts' plans use the training run's)."""

    seed: int = knob(
        0, "seed of the plan, the sigmas and the noise", resume="fixed", min=SEED_MIN, max=SEED_MAX
    )


@dataclass(frozen=True)
class RunConfig(SeedConfig):
    """The run folder, checkpoints, resume, logging."""

    run_name: str = knob(
        "moss-lora",
        "run folder name under RUNS_DIR (a plain name, no path)",
        resume=None,
        check=lambda v: _resume_rule("run_name_problem", v),
    )
    runs_dir: str = knob("runs/moss", "where runs are written", resume=None)
    save_every: int = knob(500, "checkpoint every N steps (0: only at the end)", resume=None, min=0)
    save_every_epochs: int = knob(
        0, "checkpoint every N epochs instead of SAVE_EVERY (0: SAVE_EVERY decides)", resume=None, min=0
    )
    keep_last: int = knob(3, "checkpoints kept (older ones deleted)", resume=None, min=1)
    resume: str = knob("", "'' (fresh run), 'latest' or a checkpoint folder", resume=None)
    resume_allow_changes: list = knob(
        [],
        "knobs that may differ from the checkpoint's on resume: only LR / schedule / STEPS / GRAD_CLIP / EMA_* / dropouts / moved WEIGHTS, TEXT_ENCODER, TOKENIZER, VAE are safe",
        resume=None,
        check=lambda v: allow_changes_problem(v),
    )
    resume_replan: bool = knob(
        False,
        "resume a run whose data changed (files removed or added): continue along today's plan from the checkpoint's step",
        resume=None,
    )
    stop_at: int = knob(
        0,
        "stop this invocation at this step with a checkpoint (0: run to STEPS); resume later",
        resume=None,
        min=0,
    )
    log_every: int = knob(1, "metrics line every N steps", resume=None, min=1)
    loggers: list = knob(
        ["tensorboard"],
        "trackers: tensorboard (events in RUN/tensorboard/), wandb (pip install wandb)",
        resume=None,
        check=_loggers,
    )


# resume=None throughout: the grid is drawn from the weights, never trained on
@dataclass(frozen=True)
class SampleConfig:
    """The sample grid drawn during and after training."""

    sample_every: int = knob(
        0, "sample grid every N steps (0: only at the end, if prompts are set)", resume=None, min=0
    )
    sample_every_epochs: int = knob(
        0, "sample grid every N epochs instead of SAMPLE_EVERY (0: SAMPLE_EVERY decides)", resume=None, min=0
    )
    sample_prompts: list = knob(
        [],
        "prompts of the sample grid (one column each); kohya flags as in SAMPLE_PROMPTS_FILE",
        resume=None,
        check=lambda v: prompt_list_problem(v, "SAMPLE_PROMPTS"),
    )
    sample_prompts_file: str = knob(
        "",
        "more sample prompts, one a line: prompt --n neg --w W --h H --d seed --l cfg --s steps --ri reference (# comments)",
        resume=None,
        path="file",
        check=lambda v: prompt_file_problem(v, "SAMPLE_PROMPTS_FILE"),
    )
    sample_seeds: list = knob(
        [], "one seed per prompt (default: 0, 1, 2, ...)", resume=None, check=seeds_problem
    )
    sample_negative: str = knob("", "negative prompt of the samples", resume=None)
    sample_steps: int = knob(20, "sampler steps", resume=None, min=1)
    sample_cfg: float = knob(Sampler.cfg_scale, "classifier-free guidance scale", resume=None, min=0.0)
    sample_shift: float = knob(Sampler.shift, "sampler schedule shift (5: as released)", resume=None, min=0.0)
    sample_width: int = knob(
        GenerationRequest.width, "sample width in px (multiple of 16)", resume=None, min=16
    )
    sample_height: int = knob(
        GenerationRequest.height, "sample height in px (multiple of 16)", resume=None, min=16
    )


# resume=None throughout: what is written, not what is trained
@dataclass(frozen=True)
class ExportConfig:
    """The files a checkpoint and the finished run write."""

    save_format: str = save_format_knob("comfy", resume=None)
    comfy_diffs: str = knob(
        "end",
        "ComfyUI files made of full weight differences (DoRA, BOFT, IA3, T-LoRA): end (the final export "
        "only; checkpoints keep the LyCORIS file) or every (each checkpoint too)",
        resume=None,
        choices=("end", "every"),
    )
    save_merged: bool = knob(False, "also write the merged transformer", resume=None)
    save_diffusers: bool = knob(False, "also write a diffusers-layout transformer", resume=None)
    trigger_phrase: str = knob("", "the adapter files' modelspec.trigger_phrase (empty: none)", resume=None)


@dataclass(frozen=True)
class TrainConfig(ScriptConfig):
    """Every knob of scripts/train/moss.py, by section: `TrainConfig.from_knobs(k).optim.lr` is `k["LR"]`."""

    model: ModelConfig = section(ModelConfig)
    encoders: EncoderConfig = section(EncoderConfig)
    device: DeviceConfig = section(DeviceConfig)
    memory: MemoryConfig = section(MemoryConfig)
    runtime: RuntimeConfig = section(RuntimeConfig)
    parallel: DistributedConfig = section(DistributedConfig)
    data: DataConfig = section(DataConfig)
    adapter: AdapterConfig = section(AdapterConfig)
    optim: OptimConfig = section(OptimConfig)
    objective: ObjectiveConfig = section(ObjectiveConfig)
    run: RunConfig = section(RunConfig)
    samples: SampleConfig = section(SampleConfig)
    export: ExportConfig = section(ExportConfig)


ENCODER_KNOBS = config_knobs(EncoderConfig)  # scripts/sample/sample.py's schema lists them too
TRAIN_KNOBS = config_knobs(TrainConfig)
TRAIN_SCHEMA = Schema(TRAIN_KNOBS)

# what resume compares (train/resume.py), from each knob's `resume=` rule: RESUME_FIXED never changes;
# RESUME_SAFE changes when RESUME_ALLOW_CHANGES names it; LENGTH_KNOBS (safe too) freely under a flat schedule
RESUME_FIXED = resume_knobs(TrainConfig, "fixed")
RESUME_SAFE = resume_knobs(TrainConfig, "safe", "length")
LENGTH_KNOBS = resume_knobs(TrainConfig, "length")


def allow_changes_problem(names: list) -> str | None:
    """RESUME_ALLOW_CHANGES may name only the knobs that are safe to change on resume."""
    bad = [n for n in names if n not in RESUME_SAFE]
    if not bad:
        return None
    fixed = [n for n in bad if n in RESUME_FIXED]
    why = f"{fixed} change the trained function or the data plan" if fixed else f"{bad} are not compared"
    return f"{why}; only these may be allowed: {list(RESUME_SAFE)}"

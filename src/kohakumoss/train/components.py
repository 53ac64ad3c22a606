"""What a run trains with, built from its typed config: device, precision, memory plan, backbone (placed
by the plan's engines), text encoder and VAE (placed as the plan says).

The builders take the config's sections (`build_backbone(cfg.model, ...)`, `build_text_encoder(cfg.encoders,
...)`), so scripts/sample/sample.py builds its model and encoders with them from its own config."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from kohakumoss.adapters.algo_args import algo_args_problem
from kohakumoss.adapters.algos import base_precision_check
from kohakumoss.adapters.dropouts import dropout_check
from kohakumoss.adapters.targets import rank_problem
from kohakumoss.config.bounds import device_problem
from kohakumoss.config.sample import SampleModelConfig
from kohakumoss.config.train import EncoderConfig, ModelConfig, RuntimeConfig, TrainConfig
from kohakumoss.distributed.launch import current
from kohakumoss.distributed.materialize import only_on, sharded_backbone, staged_backbone
from kohakumoss.encoders import ImageVAE, TextEncoder, TextEncoderConfig
from kohakumoss.encoders.random_weights import (
    build_random_text_encoder,
    build_random_vae,
    random_encoder_bytes,
    random_size,
    random_text_config,
)
from kohakumoss.encoders.synthetic import SyntheticTextEncoder, SyntheticVAE
from kohakumoss.encoders.text_vision import vision_tower_problem
from kohakumoss.memory.engines.encoders import place_encoder
from kohakumoss.memory.estimate import estimate_peak, file_bytes
from kohakumoss.memory.install import MemoryEngines, install_memory_plan
from kohakumoss.memory.plan import MemoryPlan
from kohakumoss.memory.profiles import card_memory_gb, rank_share, resolve_plan
from kohakumoss.model import MossBackbone, MossConfig, get_preset
from kohakumoss.model.io import inspect_checkpoint, load_backbone
from kohakumoss.model.rope import rope_bands
from kohakumoss.precision import fp32_residuals, quantize_frozen_linears, wants_fp32_residuals
from kohakumoss_common.device import same_device
from kohakumoss_common.errors import ConfigError, KohakuMossError
from kohakumoss_common.io import set_module_tensor
from kohakumoss_common.log import get_logger
from kohakumoss_kernels import OpSet
from kohakumoss_kernels.runtime.deterministic import backends_for, set_deterministic

log = get_logger(__name__)
PRECISION_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def resolve_device(knob: str) -> torch.device:
    if knob == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if hasattr(torch, "xpu") and torch.xpu.is_available():
            return torch.device("xpu")
        return torch.device("cpu")
    if problem := device_problem(knob):
        raise ConfigError("DEVICE", problem)
    device = torch.device(knob)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("DEVICE", f"'{knob}' asked for, but torch sees no CUDA GPU")
    present = {
        "xpu": lambda: hasattr(torch, "xpu") and torch.xpu.is_available(),
        "mps": torch.backends.mps.is_available,
    }
    if device.type in present and not present[device.type]():
        raise ConfigError("DEVICE", f"'{knob}' asked for, but torch sees no {device.type} device")
    count = torch.cuda.device_count() if device.type == "cuda" else None
    if count is not None and device.index is not None and device.index >= count:
        raise ConfigError(
            "DEVICE", f"'{knob}' asked for, but torch sees {count} CUDA GPU(s): cuda:0..cuda:{count - 1}"
        )
    return device


@dataclass
class Components:
    device: torch.device
    dtype: torch.dtype  # compute dtype (autocast) and the frozen base's storage dtype
    backbone: MossBackbone
    text_encoder: TextEncoder | None  # placed (kohakumoss.memory.engines.encoders.PlacedEncoder)
    vae: ImageVAE | None
    plan: MemoryPlan | None = None
    engines: MemoryEngines | None = None
    plan_why: str = ""  # the plan's line: where it came from, its label, the predicted peak


def model_config(model: ModelConfig | SampleModelConfig) -> MossConfig:
    """The DiT's config from the checkpoint's headers (nothing loaded) or the preset."""
    if model.weights:
        return inspect_checkpoint(model.weights)[1]
    if model.model_preset:
        return get_preset(model.model_preset)
    raise ConfigError("WEIGHTS", "set WEIGHTS to a DiT checkpoint (or MODEL_PRESET for random weights)")


def build_plan(
    cfg: TrainConfig, device: torch.device, model: MossConfig | None = None
) -> tuple[MemoryPlan, str]:
    """MEMORY_PROFILE and the per-engine knobs -> the plan, sized against this card's memory; `model`: the
    DiT's config when the caller read it already (None: from WEIGHTS' headers or the preset)."""
    model = model if model is not None else model_config(cfg.model)
    world = current().size
    share, shards = rank_share(cfg, world)  # the step as one rank holds it
    card = card_memory_gb(cfg.memory.card_gb, device) if device.type != "cpu" else None
    encoders = cfg.encoders
    dtype = encoder_dtype(encoders, cfg.device.precision, device)
    te, vae = encoder_file_bytes(encoders, dit_preset(cfg.model), dtype)
    full = cfg.adapter.algo == "full"
    plan, why = resolve_plan(share, model, card, full, text_encoder_bytes=te, vae_bytes=vae, shards=shards)
    # the estimate the plan was chosen by, logged for every plan (user_runs.py compares it)
    if (peak := predicted_peak_gib(cfg, plan, te, vae, world, model)) is not None:
        why += f"; predicted peak {peak:.1f} GiB"
    if share is not cfg:  # a data-parallel rank's share (a pipeline's ranks plan the whole step)
        held, tokens = share.data.tokens_per_step, cfg.data.tokens_per_step
        why += f" per rank (planned for up to {held} of the step's {tokens} tokens on each of {world} ranks)"
    return plan, why


def encoder_file_bytes(
    encoders: EncoderConfig, preset: str = "", dtype: torch.dtype = torch.bfloat16
) -> tuple[int, int]:
    """The text encoder's and the VAE's sizes: their files', or for 'random' the parameter bytes the
    architecture sized by the DiT `preset` takes in `dtype` (0: none, or synthetic)."""

    def size(value: str, kind: str) -> int:
        if value in ("", "synthetic"):
            return 0
        return (
            random_encoder_bytes(kind, random_size(preset), dtype) if value == "random" else file_bytes(value)
        )

    return size(encoders.text_encoder, "text"), size(encoders.vae, "vae")


def dit_preset(model: ModelConfig | SampleModelConfig) -> str:
    """MODEL_PRESET where the DiT is one ('' with WEIGHTS): what sizes TEXT_ENCODER / VAE 'random'."""
    return "" if model.weights else model.model_preset


def check_random_text(encoders: EncoderConfig, preset: str, text_dim: int) -> None:
    """TEXT_ENCODER='random' builds a text model as wide as the DiT's text_dim, or is refused."""
    if encoders.text_encoder != "random":
        return
    size = random_size(preset)
    width = random_text_config(size).hidden_size
    if width != text_dim:
        dit = f"MODEL_PRESET '{preset}'" if preset else "WEIGHTS"
        raise ConfigError(
            "TEXT_ENCODER",
            f"'random' builds the {size} Qwen3.5 text model for {dit} (width {width}), but the DiT's "
            f"text_dim is {text_dim}: give a text encoder of width {text_dim}",
        )


def predicted_peak_gib(
    cfg: TrainConfig,
    plan: MemoryPlan,
    text_encoder_bytes: int = 0,
    vae_bytes: int = 0,
    world: int = 1,
    model: MossConfig | None = None,
) -> float | None:
    """The memory estimate's peak of this plan in GiB (one rank's of `world`), or None where the estimate
    cannot price it; `model` as for `build_plan`."""
    try:
        model = model if model is not None else model_config(cfg.model)
        share, shards = rank_share(cfg, world)
        peak = estimate_peak(share, model, None, text_encoder_bytes, vae_bytes, plan=plan, shards=shards)
        return peak.total / 2**30
    except Exception as e:  # a plan stands without its estimate
        log.debug(f"no memory estimate for this plan ({type(e).__name__}: {e})")
        return None


def ops_backend(cfg: TrainConfig) -> str:
    """OPS_BACKEND; with DETERMINISTIC, 'auto' without the backends that add with atomics."""
    runtime = cfg.runtime
    if not runtime.deterministic or runtime.ops_backend != "auto":
        return runtime.ops_backend
    from kohakumoss_common.device import device_info

    device = resolve_device(cfg.device.device)
    return backends_for(device_info(device).arch if device.type != "cpu" else "cpu")


def build_backbone(
    model: ModelConfig | SampleModelConfig,
    device: torch.device,
    dtype: torch.dtype,
    fp32_masters: bool,
    *,
    ops_backend: str = RuntimeConfig.ops_backend,
    seed: int = 0,
    draw: torch.device | None = None,
) -> MossBackbone:
    """The weights in the compute dtype, or fp32 when they are a full fine-tune's masters; frozen.
    seed: MODEL_PRESET's random values; draw: where they are drawn (a GPU fills a host-built 5B model in
    seconds)."""
    store = torch.float32 if fp32_masters else dtype
    ops = OpSet(ops_backend)
    if model.weights:
        backbone = load_backbone(model.weights, dtype=store, device=device, ops=ops)
    elif model.model_preset:
        preset = get_preset(model.model_preset)
        with torch.device("meta"):  # no default init: init_weights draws every parameter anyway
            backbone = MossBackbone(preset, ops=ops)
        backbone.to(store).to_empty(device=device)
        set_module_tensor(backbone, "rope.bands", rope_bands(preset.head_dim, preset.rope_theta, device))
        draw = draw or device
        generator = torch.Generator(device=draw).manual_seed(int(seed))
        backbone.init_weights(std=0.02, generator=generator, via=None if same_device(draw, device) else draw)
        log.info(f"random {model.model_preset} weights (MODEL_PRESET): for demos and benchmarks only")
    else:
        raise ConfigError("WEIGHTS", "set WEIGHTS to a DiT checkpoint (or MODEL_PRESET for random weights)")
    backbone.requires_grad_(False)
    return backbone


def dataset_has_references(dataset: dict | list) -> bool:
    """Whether a DATASET entry (or one of a list) gives reference images: an edit run."""
    entries = dataset if isinstance(dataset, list) else [dataset]
    return any(isinstance(e, dict) and bool(e.get("references")) for e in entries)


def text_encoder_config(
    encoders: EncoderConfig,
    device: torch.device,
    compute: torch.device,
    precision: str,
    max_length: int | None = None,
    references: bool = False,
) -> TextEncoderConfig:
    """The config's real text encoder (TEXT_ENCODER a path): loaded on `device`, in `compute`'s dtype
    (ENCODER_PRECISION, PRECISION); max_length: MAX_TEXT_TOKENS (None: the encoder's default, 4096);
    references: the run has reference images (REFERENCES_IN_PROMPT then decides whether the encoder
    loads its vision tower and puts them before the caption)."""
    dtype = encoder_dtype(encoders, precision, compute)
    kwargs: dict[str, Any] = dict(
        path=encoders.text_encoder,
        layers=tuple(encoders.text_layers),
        device=str(device),
        dtype={torch.float32: "float32", torch.float16: "float16"}.get(dtype, "bfloat16"),
        quant=encoders.text_encoder_quant,
    )
    if encoders.tokenizer:
        kwargs["tokenizer_path"] = encoders.tokenizer
    if encoders.text_template:
        kwargs["template"] = encoders.text_template
    if max_length is not None:
        kwargs["max_length"] = int(max_length)
    if references and encoders.references_in_prompt != "none":
        kwargs["reference_prompt"] = encoders.references_in_prompt
    return TextEncoderConfig(**kwargs)


def references_problem(encoders: EncoderConfig, references: bool) -> str | None:
    """REFERENCES_IN_PROMPT='picture' on a run with references whose text encoder has no vision tower
    (read from the header alone), or None."""
    if not references or encoders.references_in_prompt == "none":
        return None
    if encoders.text_encoder in ("", "synthetic", "random"):
        return None  # stand-ins: the prompt holds no references (a benchmark's encoder)
    try:
        return vision_tower_problem(encoders.text_encoder)
    except (KohakuMossError, OSError):
        return None  # a missing or unreadable file: TEXT_ENCODER's own check names it


def build_text_encoder(
    encoders: EncoderConfig,
    device: torch.device,
    text_dim: int,
    compute: torch.device | None = None,
    *,
    precision: str,
    seed: int = 0,
    max_length: int | None = None,
    preset: str = "",
    draw: torch.device | None = None,
    references: bool = False,
) -> TextEncoder | None:
    """Loaded on `device`; its dtype follows `compute` (where it will run: bf16 on a GPU, fp32 on a CPU).
    'random': sized by the DiT `preset` (`dit_preset`), its weights drawn on `draw` (default `device`)."""
    compute = compute or device
    if not encoders.text_encoder:
        return None
    if encoders.text_encoder == "synthetic":
        log.warning("TEXT_ENCODER='synthetic': fixed random word vectors, for benchmarks and smoke runs only")
        return SyntheticTextEncoder(text_dim, int(seed), device)
    if encoders.text_encoder == "random":
        check_random_text(encoders, preset, text_dim)
        size, dtype = random_size(preset), encoder_dtype(encoders, precision, compute)
        log.warning(
            f"TEXT_ENCODER='random': a {size} Qwen3.5 text model with random weights, for benchmarks only"
        )
        kwargs = {"max_length": int(max_length)} if max_length is not None else {}
        return build_random_text_encoder(size, int(seed), device, dtype, draw=draw, **kwargs)
    return TextEncoder.load(text_encoder_config(encoders, device, compute, precision, max_length, references))


def build_vae(
    encoders: EncoderConfig,
    device: torch.device,
    compute: torch.device | None = None,
    *,
    precision: str,
    seed: int = 0,
    preset: str = "",
) -> ImageVAE | None:
    """Loaded on `device` in `compute`'s encoder dtype; 'random': sized by the DiT `preset`."""
    compute = compute or device
    if not encoders.vae:
        return None
    if encoders.vae == "synthetic":
        log.warning("VAE='synthetic': a fixed random patch projection, for benchmarks and smoke runs only")
        return SyntheticVAE(int(seed), device)
    dtype = encoder_dtype(encoders, precision, compute)
    if encoders.vae == "random":
        size = random_size(preset)
        log.warning(f"VAE='random': a {size} AutoencoderKLFlux2 with random weights, for benchmarks only")
        return build_random_vae(size, int(seed), device, dtype)
    return ImageVAE.load(encoders.vae, dtype=dtype, device=device)


def encoder_dtype(encoders: EncoderConfig, precision: str, compute: torch.device) -> torch.dtype:
    """ENCODER_PRECISION: the text encoder's and the VAE's dtype; auto is fp32 on a CPU, fp16 with
    PRECISION fp16 (cards without bf16), else bf16."""
    if encoders.encoder_precision != "auto":
        return PRECISION_DTYPES[encoders.encoder_precision]
    if compute.type == "cpu":
        return torch.float32
    return torch.float16 if precision == "fp16" else torch.bfloat16


def cap_to_card(card_gb: float, device: torch.device) -> float | None:
    """CARD_GB below this GPU's memory caps the process to it, so the plan for a smaller card is run
    under that card's limit (an out-of-memory there is one here too); the cap in GiB, or None."""
    want = float(card_gb or 0)
    if device.type != "cuda" or want <= 0:
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    total = torch.cuda.get_device_properties(index).total_memory
    if want * 2**30 >= total:
        return None
    torch.cuda.set_per_process_memory_fraction(want * 2**30 / total, index)
    log.info(f"CARD_GB {want:g}: this process is capped at {want:g} GiB of the {total / 2**30:.0f} GiB card")
    return want


Problem = tuple[str, str]  # (knob, what is wrong)


def _named(error: KohakuMossError, knob: str) -> Problem:
    knob = getattr(error, "knob", None) or knob
    return knob, str(error).removeprefix(f"{knob}: ")


def component_problems(cfg: TrainConfig, model: MossConfig | None = None) -> list[Problem]:
    """What `build_components` refuses before it loads anything: BASE_PRECISION with the adapter, the
    dropouts, ALGO_ARGS for this ALGO, RANK against the targeted layers, TEXT_ENCODER='random''s width.
    `model`: the DiT's config when the caller read it already (None: from WEIGHTS' headers or the preset)."""
    adapter, base_precision = cfg.adapter, cfg.device.base_precision
    out: list[Problem] = []
    if problem := base_precision_check(adapter, base_precision):
        out.append(("BASE_PRECISION", problem))
    if refusal := dropout_check(adapter, base_precision):
        out.append(refusal)
    if adapter.algo != "full" and (problem := algo_args_problem(adapter.algo, dict(adapter.algo_args))):
        out.append(("ALGO_ARGS", problem))
    if model is None:
        try:
            model = model_config(cfg.model)
        except KohakuMossError as e:
            return [*out, _named(e, "WEIGHTS")]
    if adapter.algo != "full":
        with torch.device("meta"):  # the module tree only: no memory, no init
            skeleton = MossBackbone(model)
        try:
            if problem := rank_problem(
                skeleton, adapter.algo, int(adapter.rank), adapter.target_preset, adapter.target_patterns
            ):
                out.append(("RANK", problem))
        except KohakuMossError as e:  # TARGET_PRESET / TARGET_PATTERNS: named by their knob
            out.append(_named(e, "TARGET_PRESET"))
    if problem := references_problem(cfg.encoders, dataset_has_references(cfg.data.dataset)):
        out.append(("REFERENCES_IN_PROMPT", problem))
    try:
        check_random_text(cfg.encoders, dit_preset(cfg.model), model.text_dim)
    except KohakuMossError as e:
        out.append(_named(e, "TEXT_ENCODER"))
    return out


def refuse(problems: list[Problem]) -> None:
    """A ConfigError naming the first problem's knob, every problem in its message (none: nothing)."""
    if problems:
        knob, first = problems[0]
        raise ConfigError(knob, first + "".join(f"; {k}: {p}" for k, p in problems[1:]))


def build_components(cfg: TrainConfig, build_device: torch.device | None = None) -> Components:
    """build_device: where the DiT is built before the plan places it (the benchmark's --build-device);
    default the host when blocks stream, else the device."""
    dev, seed = cfg.device, cfg.run.seed
    set_deterministic(cfg.runtime.deterministic)  # before any GEMM: cuBLAS reads its workspace setting once
    if cfg.runtime.deterministic:
        log.info(f"DETERMINISTIC: torch deterministic algorithms, kernel backends {ops_backend(cfg)}")
    device = resolve_device(dev.device)
    cap_to_card(cfg.memory.card_gb, device)  # before anything is allocated
    dtype = PRECISION_DTYPES[dev.precision]
    full_ft = cfg.adapter.algo == "full"
    if device.type == "cpu" and dtype == torch.float16:
        raise ConfigError("PRECISION", "fp16 needs a GPU; use bf16 or fp32 on the CPU")
    try:  # the DiT's config, read once for the run (WEIGHTS' headers, or the preset)
        model = model_config(cfg.model)
    except KohakuMossError:
        model = None  # component_problems names it, beside the other refusals
    refuse(component_problems(cfg, model))  # before anything loads (kohakumoss-config check says the same)
    preset = dit_preset(cfg.model)
    plan, why = build_plan(cfg, device, model)
    log.info(f"memory plan: {why}")
    # streamed blocks never sit whole on the device: such a model is loaded on the host first;
    # a full fine-tune with host masters keeps only a compute-dtype copy on the device
    host_first = plan.streamed_count(model.depth) > 0
    masters_here = full_ft and plan.optimizer == "gpu"
    build = build_device or (torch.device("cpu") if host_first else device)
    # DISTRIBUTED='fsdp': built on the meta device, sharded, only this rank's shards read or drawn;
    # the pipelines: only this process's stages, each on its device
    staged = staged_backbone(cfg, plan, device, dtype, masters_here, ops_backend(cfg))
    if (backbone := staged) is None:
        backbone = sharded_backbone(cfg, plan, device, dtype, masters_here, ops_backend(cfg))
    if backbone is None:
        draw = device if device.type == "cuda" else None
        backbone = build_backbone(
            cfg.model, build, dtype, masters_here, ops_backend=ops_backend(cfg), seed=seed, draw=draw
        )
    if full_ft:
        backbone.requires_grad_(True)
    # before streaming places it; an int8 file's own int8 bytes are kept in the int8 modes
    source = cfg.model.weights or None
    n_fp8 = quantize_frozen_linears(backbone, dev.base_precision, device, source=source)
    if n_fp8:
        log.info(f"BASE_PRECISION {dev.base_precision}: {n_fp8} frozen block linears stored in 8 bits")
    fp32_residuals(backbone, wants_fp32_residuals(dev.precision))  # fp16: the residual streams in float32
    with (
        only_on(backbone, device) if staged is not None else nullcontext()
    ):  # other stages stay where they are
        engines = install_memory_plan(plan, backbone, device, compute_dtype=dtype, full_ft=full_ft)
    te_device = device if plan.text_encoder == "resident" else torch.device("cpu")
    vae_device = device if plan.vae == "resident" else torch.device("cpu")
    text_dim, max_length = backbone.config.text_dim, cfg.data.max_text_tokens
    # a random text model kept on the host is drawn on the GPU piece by piece, unless it never goes there
    draw = device if device.type == "cuda" and plan.text_encoder != "off" else None
    text_encoder = build_text_encoder(
        cfg.encoders,
        te_device,
        text_dim,
        device,
        precision=dev.precision,
        seed=seed,
        max_length=max_length,
        preset=preset,
        draw=draw,
        references=dataset_has_references(cfg.data.dataset),
    )
    vae = build_vae(cfg.encoders, vae_device, device, precision=dev.precision, seed=seed, preset=preset)
    text_encoder = place_encoder(text_encoder, plan.text_encoder, device)
    vae = place_encoder(vae, plan.vae, device)
    return Components(device, dtype, backbone, text_encoder, vae, plan, engines, why)

"""What a run trains with, built from its knobs: device, precision, memory plan, backbone (placed by
the plan's engines), text encoder and VAE (placed as the plan says)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kohakumoss.adapters.algos import base_precision_check
from kohakumoss.adapters.dropouts import dropout_check
from kohakumoss.distributed.materialize import sharded_backbone
from kohakumoss.encoders import ImageVAE, TextEncoder, TextEncoderConfig
from kohakumoss.encoders.synthetic import SyntheticTextEncoder, SyntheticVAE
from kohakumoss.memory.engines.encoders import place_encoder
from kohakumoss.memory.estimate import estimate_peak, file_bytes
from kohakumoss.memory.install import MemoryEngines, install_memory_plan
from kohakumoss.memory.plan import MemoryPlan
from kohakumoss.memory.profiles import card_memory_gb, resolve_plan
from kohakumoss.model import MossBackbone, MossConfig, get_preset
from kohakumoss.model.io import inspect_checkpoint, load_backbone
from kohakumoss.precision import fp32_residuals, quantize_frozen_linears, wants_fp32_residuals
from kohakumoss_common.device import same_device
from kohakumoss_common.errors import ConfigError
from kohakumoss_common.log import get_logger
from kohakumoss_kernels import OpSet
from kohakumoss_kernels.deterministic import backends_for, set_deterministic

log = get_logger(__name__)
PRECISION_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def resolve_device(knob: str) -> torch.device:
    if knob == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if hasattr(torch, "xpu") and torch.xpu.is_available():
            return torch.device("xpu")
        return torch.device("cpu")
    device = torch.device(knob)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("DEVICE", f"'{knob}' asked for, but torch sees no CUDA GPU")
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


def model_config(k: dict[str, Any]) -> MossConfig:
    """The DiT's config from the checkpoint's headers (nothing loaded) or the preset."""
    if k["WEIGHTS"]:
        return inspect_checkpoint(k["WEIGHTS"])[1]
    if k["MODEL_PRESET"]:
        return get_preset(k["MODEL_PRESET"])
    raise ConfigError("WEIGHTS", "set WEIGHTS to a DiT checkpoint (or MODEL_PRESET for random weights)")


def build_plan(k: dict[str, Any], device: torch.device) -> tuple[MemoryPlan, str]:
    """MEMORY_PROFILE and the per-engine knobs -> the plan, sized against this card's memory."""
    card = card_memory_gb(k, device) if device.type != "cpu" else None
    te = file_bytes(k["TEXT_ENCODER"]) if k["TEXT_ENCODER"] not in ("", "synthetic") else 0
    vae = file_bytes(k["VAE"]) if k["VAE"] not in ("", "synthetic") else 0
    cfg = model_config(k)
    plan, why = resolve_plan(k, cfg, card, k["ALGO"] == "full", text_encoder_bytes=te, vae_bytes=vae)
    # the estimate the plan was chosen by, logged for every plan (user_runs.py compares it)
    if (peak := predicted_peak_gib(k, plan, te, vae)) is not None:
        why += f"; predicted peak {peak:.1f} GiB"
    return plan, why


def predicted_peak_gib(
    k: dict[str, Any], plan: MemoryPlan, text_encoder_bytes: int = 0, vae_bytes: int = 0
) -> float | None:
    """The memory estimate's peak of this plan in GiB, or None where the estimate cannot price it."""
    try:
        return estimate_peak(k, model_config(k), None, text_encoder_bytes, vae_bytes, plan=plan).total / 2**30
    except Exception as e:  # a plan stands without its estimate
        log.debug(f"no memory estimate for this plan ({type(e).__name__}: {e})")
        return None


def ops_backend(k: dict[str, Any]) -> str:
    """OPS_BACKEND; with DETERMINISTIC, 'auto' without the backends that add with atomics."""
    if not k.get("DETERMINISTIC") or k["OPS_BACKEND"] != "auto":
        return k["OPS_BACKEND"]
    from kohakumoss_common.device import device_info

    device = resolve_device(k["DEVICE"])
    return backends_for(device_info(device).arch if device.type != "cpu" else "cpu")


def build_backbone(
    k: dict[str, Any],
    device: torch.device,
    dtype: torch.dtype,
    fp32_masters: bool,
    draw: torch.device | None = None,
) -> MossBackbone:
    """The weights in the compute dtype, or fp32 when they are a full fine-tune's masters; frozen.
    draw: where MODEL_PRESET's random values are drawn (a GPU fills a host-built 5B model in seconds)."""
    store = torch.float32 if fp32_masters else dtype
    ops = OpSet(ops_backend(k))
    if k["WEIGHTS"]:
        model = load_backbone(k["WEIGHTS"], dtype=store, device=device, ops=ops)
    elif k["MODEL_PRESET"]:
        cfg = get_preset(k["MODEL_PRESET"])
        with torch.device(device):
            model = MossBackbone(cfg, ops=ops)
        draw = draw or device
        generator = torch.Generator(device=draw).manual_seed(int(k["SEED"]))
        model.init_weights(std=0.02, generator=generator, via=None if same_device(draw, device) else draw)
        model.to(store)
        log.info(f"random {k['MODEL_PRESET']} weights (MODEL_PRESET): for demos and benchmarks only")
    else:
        raise ConfigError("WEIGHTS", "set WEIGHTS to a DiT checkpoint (or MODEL_PRESET for random weights)")
    model.requires_grad_(False)
    return model


def text_encoder_config(k: dict[str, Any], device: torch.device, compute: torch.device) -> TextEncoderConfig:
    """The knobs' real text encoder (TEXT_ENCODER a path): loaded on `device`, in `compute`'s dtype."""
    kwargs: dict[str, Any] = dict(
        path=k["TEXT_ENCODER"],
        layers=tuple(k["TEXT_LAYERS"]),
        device=str(device),
        dtype={torch.float32: "float32", torch.float16: "float16"}.get(encoder_dtype(k, compute), "bfloat16"),
        quant=k.get("TEXT_ENCODER_QUANT", "none"),
    )
    if k["TOKENIZER"]:
        kwargs["tokenizer_path"] = k["TOKENIZER"]
    if k["TEXT_TEMPLATE"]:
        kwargs["template"] = k["TEXT_TEMPLATE"]
    if "MAX_TEXT_TOKENS" in k:  # the sample script's knob; otherwise the encoder's default (4096)
        kwargs["max_length"] = int(k["MAX_TEXT_TOKENS"])
    return TextEncoderConfig(**kwargs)


def build_text_encoder(
    k: dict[str, Any], device: torch.device, text_dim: int, compute: torch.device | None = None
) -> TextEncoder | None:
    """Loaded on `device`; its dtype follows `compute` (where it will run: bf16 on a GPU, fp32 on a CPU)."""
    compute = compute or device
    if not k["TEXT_ENCODER"]:
        return None
    if k["TEXT_ENCODER"] == "synthetic":
        log.warning("TEXT_ENCODER='synthetic': fixed random word vectors, for benchmarks and smoke runs only")
        return SyntheticTextEncoder(text_dim, int(k["SEED"]), device)
    return TextEncoder.load(text_encoder_config(k, device, compute))


def build_vae(
    k: dict[str, Any], device: torch.device, compute: torch.device | None = None
) -> ImageVAE | None:
    compute = compute or device
    if not k["VAE"]:
        return None
    if k["VAE"] == "synthetic":
        log.warning("VAE='synthetic': a fixed random patch projection, for benchmarks and smoke runs only")
        return SyntheticVAE(int(k["SEED"]), device)
    return ImageVAE.load(k["VAE"], dtype=encoder_dtype(k, compute), device=device)


def encoder_dtype(k: dict[str, Any], compute: torch.device) -> torch.dtype:
    """ENCODER_PRECISION: the text encoder's and the VAE's dtype; auto is fp32 on a CPU, fp16 with
    PRECISION fp16 (cards without bf16), else bf16."""
    choice = k.get("ENCODER_PRECISION", "auto")
    if choice != "auto":
        return PRECISION_DTYPES[choice]
    if compute.type == "cpu":
        return torch.float32
    return torch.float16 if k.get("PRECISION") == "fp16" else torch.bfloat16


def cap_to_card(k: dict[str, Any], device: torch.device) -> float | None:
    """CARD_GB below this GPU's memory caps the process to it, so the plan for a smaller card is run
    under that card's limit (an out-of-memory there is one here too); the cap in GiB, or None."""
    want = float(k.get("CARD_GB") or 0)
    if device.type != "cuda" or want <= 0:
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    total = torch.cuda.get_device_properties(index).total_memory
    if want * 2**30 >= total:
        return None
    torch.cuda.set_per_process_memory_fraction(want * 2**30 / total, index)
    log.info(f"CARD_GB {want:g}: this process is capped at {want:g} GiB of the {total / 2**30:.0f} GiB card")
    return want


def build_components(k: dict[str, Any], build_device: torch.device | None = None) -> Components:
    """build_device: where the DiT is built before the plan places it (the benchmark's --build-device);
    default the host when blocks stream, else the device."""
    if "DETERMINISTIC" in k:  # before any GEMM: cuBLAS reads its workspace setting once
        set_deterministic(bool(k["DETERMINISTIC"]))
        if k["DETERMINISTIC"]:
            log.info(f"DETERMINISTIC: torch deterministic algorithms, kernel backends {ops_backend(k)}")
    device = resolve_device(k["DEVICE"])
    cap_to_card(k, device)  # before anything is allocated
    dtype = PRECISION_DTYPES[k["PRECISION"]]
    full_ft = k["ALGO"] == "full"
    if device.type == "cpu" and dtype == torch.float16:
        raise ConfigError("PRECISION", "fp16 needs a GPU; use bf16 or fp32 on the CPU")
    if problem := base_precision_check(k):  # before anything loads
        raise ConfigError("BASE_PRECISION", problem)
    if refusal := dropout_check(k):
        raise ConfigError(*refusal)
    plan, why = build_plan(k, device)
    log.info(f"memory plan: {why}")
    # streamed blocks never sit whole on the device: such a model is loaded on the host first;
    # a full fine-tune with host masters keeps only a compute-dtype copy on the device
    host_first = plan.streamed_count(model_config(k).depth) > 0
    masters_here = full_ft and plan.optimizer == "gpu"
    build = build_device or (torch.device("cpu") if host_first else device)
    # DISTRIBUTED='fsdp': built on the meta device, sharded, only this rank's shards read or drawn
    backbone = sharded_backbone(k, plan, device, dtype, masters_here, ops_backend(k))
    if backbone is None:
        backbone = build_backbone(
            k, build, dtype, masters_here, draw=device if device.type == "cuda" else None
        )
    if full_ft:
        backbone.requires_grad_(True)
    # before streaming places it; an int8 file's own int8 bytes are kept in the int8 modes
    n_fp8 = quantize_frozen_linears(backbone, k["BASE_PRECISION"], device, source=k["WEIGHTS"] or None)
    if n_fp8:
        log.info(f"BASE_PRECISION {k['BASE_PRECISION']}: {n_fp8} frozen block linears stored in 8 bits")
    fp32_residuals(backbone, wants_fp32_residuals(k["PRECISION"]))  # fp16: the residual streams in float32
    engines = install_memory_plan(plan, backbone, device, compute_dtype=dtype, full_ft=full_ft)
    te_device = device if plan.text_encoder == "resident" else torch.device("cpu")
    vae_device = device if plan.vae == "resident" else torch.device("cpu")
    text_encoder = build_text_encoder(k, te_device, backbone.config.text_dim, compute=device)
    vae = build_vae(k, vae_device, compute=device)
    text_encoder = place_encoder(text_encoder, plan.text_encoder, device)
    vae = place_encoder(vae, plan.vae, device)
    return Components(device, dtype, backbone, text_encoder, vae, plan, engines, why)

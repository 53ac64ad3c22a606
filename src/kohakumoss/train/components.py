"""What a run trains with, built from its knobs: device, precision, backbone, text encoder, VAE."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kohakumoss.encoders import ImageVAE, TextEncoder, TextEncoderConfig
from kohakumoss.encoders.synthetic import SyntheticTextEncoder, SyntheticVAE
from kohakumoss.model import MossBackbone, get_preset
from kohakumoss.model.io import load_backbone
from kohakumoss_common.errors import ConfigError
from kohakumoss_common.log import get_logger
from kohakumoss_kernels import OpSet

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
    text_encoder: TextEncoder | None
    vae: ImageVAE | None


def build_backbone(
    k: dict[str, Any], device: torch.device, dtype: torch.dtype, full_ft: bool
) -> MossBackbone:
    """Frozen-base runs keep the base in the compute dtype; a full fine-tune keeps fp32 masters."""
    store = torch.float32 if full_ft else dtype
    ops = OpSet(k["OPS_BACKEND"])
    if k["WEIGHTS"]:
        model = load_backbone(k["WEIGHTS"], dtype=store, device=device, ops=ops)
    elif k["MODEL_PRESET"]:
        cfg = get_preset(k["MODEL_PRESET"])
        with torch.device(device):
            model = MossBackbone(cfg, ops=ops)
        model.init_weights(std=0.02, generator=torch.Generator(device=device).manual_seed(int(k["SEED"])))
        model.to(store)
        log.info(f"random {k['MODEL_PRESET']} weights (MODEL_PRESET): for demos and benchmarks only")
    else:
        raise ConfigError("WEIGHTS", "set WEIGHTS to a DiT checkpoint (or MODEL_PRESET for random weights)")
    model.requires_grad_(full_ft)
    return model


def build_text_encoder(k: dict[str, Any], device: torch.device, text_dim: int) -> TextEncoder | None:
    if not k["TEXT_ENCODER"]:
        return None
    if k["TEXT_ENCODER"] == "synthetic":
        log.warning("TEXT_ENCODER='synthetic': fixed random word vectors, for benchmarks and smoke runs only")
        return SyntheticTextEncoder(text_dim, int(k["SEED"]), device)
    kwargs: dict[str, Any] = dict(
        path=k["TEXT_ENCODER"],
        layers=tuple(k["TEXT_LAYERS"]),
        device=str(device),
        dtype="float32" if device.type == "cpu" else "bfloat16",
    )
    if k["TOKENIZER"]:
        kwargs["tokenizer_path"] = k["TOKENIZER"]
    if k["TEXT_TEMPLATE"]:
        kwargs["template"] = k["TEXT_TEMPLATE"]
    return TextEncoder.load(TextEncoderConfig(**kwargs))


def build_vae(k: dict[str, Any], device: torch.device) -> ImageVAE | None:
    if not k["VAE"]:
        return None
    if k["VAE"] == "synthetic":
        log.warning("VAE='synthetic': a fixed random patch projection, for benchmarks and smoke runs only")
        return SyntheticVAE(int(k["SEED"]), device)
    return ImageVAE.load(
        k["VAE"], dtype=torch.float32 if device.type == "cpu" else torch.bfloat16, device=device
    )


def build_components(k: dict[str, Any]) -> Components:
    device = resolve_device(k["DEVICE"])
    dtype = PRECISION_DTYPES[k["PRECISION"]]
    if device.type == "cpu" and dtype == torch.float16:
        raise ConfigError("PRECISION", "fp16 needs a GPU; use bf16 or fp32 on the CPU")
    backbone = build_backbone(k, device, dtype, k["ALGO"] == "full")
    text_encoder = build_text_encoder(k, device, backbone.config.text_dim)
    return Components(device, dtype, backbone, text_encoder, build_vae(k, device))

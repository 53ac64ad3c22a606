"""What scripts/sample/sample.py does: load, attach adapters, sample in packed batches, write PNGs."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from PIL import PngImagePlugin

from kohakumoss_common.errors import ConfigError
from kohakumoss_common.io import save_image
from kohakumoss_common.log import get_logger
from kohakumoss_common.progress import StepProgress

from .generate import GenerationRequest, generate
from .grid import grid
from .prompts import PromptLine, parse_prompt_line, read_prompt_file
from .sampler import SamplerConfig, SamplerSpeed

log = get_logger(__name__)


def read_prompts(k: dict[str, Any]) -> list[PromptLine]:
    """PROMPT, then every line of PROMPT_FILE (kohya format: `prompt --n neg --w W --h H --d seed --l cfg --s steps`)."""
    prompts = [parse_prompt_line(k["PROMPT"])] if k["PROMPT"] else []
    if k["PROMPT_FILE"]:
        prompts += read_prompt_file(k["PROMPT_FILE"], "PROMPT_FILE")
    if not prompts:
        raise ConfigError("PROMPT", "set PROMPT or PROMPT_FILE")
    return prompts


def requests_for(k: dict[str, Any], prompts: list[PromptLine]) -> list[GenerationRequest]:
    """COUNT (or len(SEEDS)) requests per prompt; a line's own settings override the knobs' (its --ri
    references REFERENCE_IMAGES)."""
    seeds = [int(s) for s in k["SEEDS"]] or [int(k["SEED"]) + i for i in range(int(k["COUNT"]))]
    out = []
    for p in prompts:
        line_seeds = seeds if p.seed is None else [p.seed + i for i in range(len(seeds))]
        p = p.with_defaults(
            negative=k["NEGATIVE"],
            width=int(k["WIDTH"]),
            height=int(k["HEIGHT"]),
            references=tuple(k.get("REFERENCE_IMAGES", [])),
        )
        for s in line_seeds:
            out.append(
                GenerationRequest(p.prompt, s, p.width, p.height, p.negative, p.steps, p.cfg, p.references)
            )
    return out


def most_references(k: dict[str, Any]) -> int:
    """The most reference images a request has (REFERENCE_IMAGES, or a line's --ri); 0: none has any."""
    return max(len(r.references) for r in requests_for(k, read_prompts(k)))


def longest_prompt_tokens(k: dict[str, Any], prompt_tokenizer) -> int:
    """Tokens of the longest templated prompt or negative the knobs ask for: what the sampling plan prices."""
    texts = {t for r in requests_for(k, read_prompts(k)) for t in (r.prompt, r.negative)}
    return max(len(prompt_tokenizer(t)) for t in texts)


def adapter_entries(k: dict[str, Any]) -> list[tuple[str, float]]:
    out = []
    for entry in k["ADAPTERS"]:
        path, mult = (entry, 1.0) if isinstance(entry, str) else (entry[0], float(entry[1]))
        if not Path(path).exists():
            raise ConfigError("ADAPTERS", f"adapter '{path}' does not exist")
        out.append((path, mult))
    return out


def png_info(
    request: GenerationRequest, k: dict[str, Any], adapters: list[tuple[str, float]]
) -> PngImagePlugin.PngInfo:
    info = PngImagePlugin.PngInfo()
    settings = dict(
        prompt=request.prompt,
        negative=request.negative,
        seed=request.seed,
        width=request.width,
        height=request.height,
        steps=k["STEPS"] if request.steps is None else request.steps,
        cfg=k["CFG"] if request.cfg is None else request.cfg,
        shift=k["SHIFT"],
        uncond_skip_layers=list(k["UNCOND_SKIP_LAYERS"]),
        **({"references": list(request.references)} if request.references else {}),
        **({"references_in_prompt": k["REFERENCES_IN_PROMPT"]} if request.references else {}),
        slg_window=[k["SLG_START"], k["SLG_STOP"]],
        max_text_tokens=k["MAX_TEXT_TOKENS"],
        weights=k["WEIGHTS"] or k["MODEL_PRESET"],
        adapters=adapters,
    )
    info.add_text("prompt", request.prompt)
    info.add_text("kohakumoss", json.dumps(settings))
    return info


def attach_adapters(k: dict[str, Any], model, attach: Callable[..., tuple[Any, Any]]) -> list:
    """Every ADAPTERS entry on `model` through `attach(model, path, multiplier=...)` (the caller's loader,
    kohakumoss.export.from_checkpoint.attach: sampling sits below export); LyCORIS networks returned,
    ComfyUI files merge into the weights."""
    networks = []
    for path, mult in adapter_entries(k):
        network, _ = attach(model, path, multiplier=mult)
        if network is not None:
            networks.append(network)
        log.info(f"adapter {path} x {mult}")
    return networks


def sampler_config(k: dict[str, Any], depth: int | None = None) -> SamplerConfig:
    """The sampler settings of the knobs; with `depth`, the skip indices checked against the model's blocks."""
    config = SamplerConfig(
        steps=int(k["STEPS"]),
        cfg_scale=float(k["CFG"]),
        shift=float(k["SHIFT"]),
        uncond_skip_layers=tuple(k["UNCOND_SKIP_LAYERS"]),
        slg_start=float(k["SLG_START"]),
        slg_stop=float(k["SLG_STOP"]),
    )
    if depth is not None and config.guided:
        config.check_depth(depth)
    return config


def sampler_speed(k: dict[str, Any], networks: Sequence = ()) -> SamplerSpeed:
    """CUDA_GRAPHS, off where an adapter draws its rank per call (DyLoRA: a graph would replay one draw)."""
    from lycoris.modules.dylora import DyLoraModule

    if any(isinstance(m, DyLoraModule) for n in networks for m in n.modules()):
        if k["CUDA_GRAPHS"] == "on":
            raise ConfigError(
                "CUDA_GRAPHS", "'on' with a DyLoRA adapter, which draws its rank per call: use auto or off"
            )
        return SamplerSpeed(cuda_graphs="off", reference_cache=bool(k.get("REFERENCE_KV_CACHE", True)))
    return SamplerSpeed(cuda_graphs=k["CUDA_GRAPHS"], reference_cache=bool(k.get("REFERENCE_KV_CACHE", True)))


def sample_images(
    k: dict[str, Any],
    model,
    text_encoder,
    vae,
    device: torch.device,
    dtype: torch.dtype,
    speed: SamplerSpeed | None = None,
) -> list[Path]:
    """Sample every request of the knobs with `model` as it is (adapters attached by the caller);
    `speed` None: `sampler_speed(k)`."""
    adapters = adapter_entries(k)
    requests = requests_for(k, read_prompts(k))
    config = sampler_config(k, model.config.depth)
    speed = speed if speed is not None else sampler_speed(k)
    out = Path(k["OUT_DIR"])
    out.mkdir(parents=True, exist_ok=True)
    paths, images = [], []
    batch = int(k["BATCH"])
    model.eval()
    for start in range(0, len(requests), batch):
        chunk = requests[start : start + batch]
        first, last = start + 1, start + len(chunk)
        progress = StepProgress(
            f"image {first}" + (f"-{last}" if last > first else "") + f" of {len(requests)}"
        )
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            try:
                pics = generate(
                    model,
                    text_encoder,
                    vae,
                    chunk,
                    config,
                    model.config.in_channels,
                    device,
                    progress=progress,
                    speed=speed,
                )
            finally:
                progress.close()
        for i, (req, im) in enumerate(zip(chunk, pics)):
            path = out / f"{start + i:04d}_seed{req.seed}.png"
            save_image(im, path, pnginfo=png_info(req, k, adapters))
            paths.append(path)
            images.append(im)
        log.info(f"{len(paths)}/{len(requests)} images")
    if k["GRID"] and images:
        cols = len(k["SEEDS"]) or int(k["COUNT"])
        rows = [(f"prompt {r}", images[r * cols : (r + 1) * cols]) for r in range(len(images) // cols)]
        save_image(grid(rows, [f"seed {req.seed}" for req in requests[:cols]]), out / "grid.png")
    return paths

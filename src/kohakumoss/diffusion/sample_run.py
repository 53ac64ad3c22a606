"""What scripts/sample/sample.py does: load, attach adapters, sample in packed batches, write PNGs.

Every function takes the script's typed config, `cfg` (config/sample.py's SampleScriptConfig: this package
sits below config/, so it is passed in, never imported) and reads its sections (`cfg.sampler.steps`).
"""

from __future__ import annotations

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
from .png_meta import sample_png_info, sample_settings
from .prompts import PromptLine, parse_prompt_line, read_prompt_file
from .sampler import SamplerConfig, SamplerSpeed

log = get_logger(__name__)


def read_prompts(cfg: Any) -> list[PromptLine]:
    """PROMPT, then every line of PROMPT_FILE (kohya format: `prompt --n neg --w W --h H --d seed --l cfg --s steps`)."""
    given = cfg.prompts
    prompts = [parse_prompt_line(given.prompt)] if given.prompt else []
    if given.prompt_file:
        prompts += read_prompt_file(given.prompt_file, "PROMPT_FILE")
    if not prompts:
        raise ConfigError("PROMPT", "set PROMPT or PROMPT_FILE")
    return prompts


def requests_for(cfg: Any, prompts: list[PromptLine]) -> list[GenerationRequest]:
    """COUNT (or len(SEEDS)) requests per prompt; a line's own settings override the knobs' (its --ri
    references REFERENCE_IMAGES)."""
    sampler = cfg.sampler
    seeds = [int(s) for s in sampler.seeds] or [int(sampler.seed) + i for i in range(int(sampler.count))]
    out = []
    for p in prompts:
        line_seeds = seeds if p.seed is None else [p.seed + i for i in range(len(seeds))]
        p = p.with_defaults(
            negative=cfg.prompts.negative,
            width=int(sampler.width),
            height=int(sampler.height),
            references=tuple(cfg.prompts.reference_images),
        )
        for s in line_seeds:
            out.append(
                GenerationRequest(p.prompt, s, p.width, p.height, p.negative, p.steps, p.cfg, p.references)
            )
    return out


def most_references(cfg: Any) -> int:
    """The most reference images a request has (REFERENCE_IMAGES, or a line's --ri); 0: none has any."""
    return max(len(r.references) for r in requests_for(cfg, read_prompts(cfg)))


def longest_prompt_tokens(cfg: Any, prompt_tokenizer) -> int:
    """Tokens of the longest templated prompt or negative the knobs ask for: what the sampling plan prices."""
    texts = {t for r in requests_for(cfg, read_prompts(cfg)) for t in (r.prompt, r.negative)}
    return max(len(prompt_tokenizer(t)) for t in texts)


def adapter_entries(cfg: Any) -> list[tuple[str, float]]:
    out = []
    for entry in cfg.adapters.adapters:
        path, mult = (entry, 1.0) if isinstance(entry, str) else (entry[0], float(entry[1]))
        if not Path(path).exists():
            raise ConfigError("ADAPTERS", f"adapter '{path}' does not exist")
        out.append((path, mult))
    return out


def png_info(
    request: GenerationRequest, cfg: Any, adapters: list[tuple[str, float]], text_encoder: Any = None
) -> PngImagePlugin.PngInfo:
    """The PNG's text chunks (`png_meta`, the trainer's samples' form) with the script's own facts."""
    sampler = cfg.sampler
    settings = sample_settings(
        request,
        sampler.steps if request.steps is None else request.steps,
        sampler.cfg if request.cfg is None else request.cfg,
        sampler.shift,
        text_encoder,
        uncond_skip_layers=list(sampler.uncond_skip_layers),
        slg_window=[sampler.slg_start, sampler.slg_stop],
        max_text_tokens=sampler.max_text_tokens,
        weights=cfg.model.weights or cfg.model.model_preset,
        adapters=adapters,
    )
    return sample_png_info(settings)


def attach_adapters(cfg: Any, model, attach: Callable[..., tuple[Any, Any]]) -> list:
    """Every ADAPTERS entry on `model` through `attach(model, path, multiplier=...)` (the caller's loader,
    kohakumoss.export.from_checkpoint.attach: sampling sits below export); LyCORIS networks returned,
    ComfyUI files merge into the weights."""
    networks = []
    for path, mult in adapter_entries(cfg):
        network, _ = attach(model, path, multiplier=mult)
        if network is not None:
            networks.append(network)
        log.info(f"adapter {path} x {mult}")
    return networks


def sampler_config(cfg: Any, depth: int | None = None) -> SamplerConfig:
    """The sampler settings of the knobs; with `depth`, the skip indices checked against the model's blocks."""
    sampler = cfg.sampler
    config = SamplerConfig(
        steps=int(sampler.steps),
        cfg_scale=float(sampler.cfg),
        shift=float(sampler.shift),
        uncond_skip_layers=tuple(sampler.uncond_skip_layers),
        slg_start=float(sampler.slg_start),
        slg_stop=float(sampler.slg_stop),
    )
    if depth is not None and config.guided:
        config.check_depth(depth)
    return config


def sampler_speed(cuda_graphs: str, networks: Sequence = (), reference_cache: bool = True) -> SamplerSpeed:
    """CUDA_GRAPHS, off where an adapter draws its rank per call (DyLoRA: a graph would replay one draw);
    REFERENCE_KV_CACHE."""
    from lycoris.modules.dylora import DyLoraModule

    if any(isinstance(m, DyLoraModule) for n in networks for m in n.modules()):
        if cuda_graphs == "on":
            raise ConfigError(
                "CUDA_GRAPHS", "'on' with a DyLoRA adapter, which draws its rank per call: use auto or off"
            )
        return SamplerSpeed(cuda_graphs="off", reference_cache=reference_cache)
    return SamplerSpeed(cuda_graphs=cuda_graphs, reference_cache=reference_cache)


def sample_images(
    cfg: Any,
    model,
    text_encoder,
    vae,
    device: torch.device,
    dtype: torch.dtype,
    speed: SamplerSpeed | None = None,
) -> list[Path]:
    """Sample every request of the knobs with `model` as it is (adapters attached by the caller);
    `speed` None: `sampler_speed(CUDA_GRAPHS)`."""
    adapters = adapter_entries(cfg)
    requests = requests_for(cfg, read_prompts(cfg))
    config = sampler_config(cfg, model.config.depth)
    speed = (
        speed
        if speed is not None
        else sampler_speed(cfg.sampler.cuda_graphs, reference_cache=cfg.sampler.reference_kv_cache)
    )
    out = Path(cfg.output.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths, images = [], []
    batch = int(cfg.sampler.batch)
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
            save_image(im, path, pnginfo=png_info(req, cfg, adapters, text_encoder))
            paths.append(path)
            images.append(im)
        log.info(f"{len(paths)}/{len(requests)} images")
    if cfg.output.grid and images:
        cols = len(cfg.sampler.seeds) or int(cfg.sampler.count)
        rows = [(f"prompt {r}", images[r * cols : (r + 1) * cols]) for r in range(len(images) // cols)]
        save_image(grid(rows, [f"seed {req.seed}" for req in requests[:cols]]), out / "grid.png")
    return paths

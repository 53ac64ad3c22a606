"""Sample grids during training: the base model's row (drawn once, kept on disk) above the current row,
and a timeline of every row drawn so far; each sample PNG carries its prompt and sampler settings."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from PIL import Image, PngImagePlugin

from kohakumoss.adapters.algos import adapter_algo
from kohakumoss.config.train import SampleConfig, TrainConfig
from kohakumoss.diffusion import SamplerConfig, SamplerSpeed, png_meta, released_uncond_skip_layers
from kohakumoss.diffusion.generate import GenerationRequest, generate
from kohakumoss.diffusion.prompts import PromptLine, parse_prompt_line, read_prompt_file
from kohakumoss_common.io import save_image


def sample_prompts(samples: SampleConfig) -> list[PromptLine]:
    """SAMPLE_PROMPTS, then the lines of SAMPLE_PROMPTS_FILE (kohya flags parsed)."""
    lines = [
        parse_prompt_line(p, f"SAMPLE_PROMPTS[{i}]", "SAMPLE_PROMPTS")
        for i, p in enumerate(samples.sample_prompts)
    ]
    if samples.sample_prompts_file:
        lines += read_prompt_file(samples.sample_prompts_file, "SAMPLE_PROMPTS_FILE")
    return lines


def sample_captions(samples: SampleConfig) -> list[str]:
    """The grid's column captions: each sample's prompt, then its seed, CFG, steps and size."""
    return [
        f"{r.prompt}\nseed {r.seed}, cfg {sample_settings(r, samples)['cfg']:g}, "
        f"{sample_settings(r, samples)['steps']} steps, {r.width}x{r.height}"
        for r in sample_requests(samples)
    ]


def sample_settings(request: GenerationRequest, samples: SampleConfig, text_encoder: Any = None) -> dict:
    """What drew one sample: its prompt line's values over the SAMPLE_* knobs (`png_meta`'s form, the
    sample script's; `text_encoder`: the one that drew it, whether it was shown the references)."""
    return png_meta.sample_settings(
        request,
        int(samples.sample_steps if request.steps is None else request.steps),
        float(samples.sample_cfg if request.cfg is None else request.cfg),
        float(samples.sample_shift),
        text_encoder,
        sampler="euler (flow velocity), CFG with skip-layer guidance",
    )


def sample_png_info(
    request: GenerationRequest, samples: SampleConfig, label: str, text_encoder: Any = None
) -> PngImagePlugin.PngInfo:
    """PNG text chunks: `prompt`, `kohakumoss` (JSON, as scripts/sample/sample.py writes it, with the grid
    row) and `parameters` (the A1111 form image viewers and UIs read)."""
    return png_meta.sample_png_info({**sample_settings(request, samples, text_encoder), "row": label})


def sample_requests(samples: SampleConfig) -> list[GenerationRequest]:
    """One request per sample prompt; a line's flags override the SAMPLE_* knobs."""
    prompts = sample_prompts(samples)
    seeds = list(samples.sample_seeds) or list(range(len(prompts)))
    out = []
    for i, p in enumerate(prompts):
        p = p.with_defaults(
            negative=samples.sample_negative,
            width=int(samples.sample_width),
            height=int(samples.sample_height),
            seed=int(seeds[i % len(seeds)]),
        )
        refs = p.references or ()  # a line's --ri: an edit model's references
        out.append(GenerationRequest(p.prompt, p.seed, p.width, p.height, p.negative, p.steps, p.cfg, refs))
    return out


def sampler_config(samples: SampleConfig, depth: int) -> SamplerConfig:
    """The released sampler at SAMPLE_STEPS / SAMPLE_CFG / SAMPLE_SHIFT; the uncond branch skips block 22
    where it exists."""
    return SamplerConfig(
        steps=int(samples.sample_steps),
        cfg_scale=float(samples.sample_cfg),
        shift=float(samples.sample_shift),
        uncond_skip_layers=released_uncond_skip_layers(depth),
    )


def sampler_speed(cuda_graphs: str, algo: str) -> SamplerSpeed:
    """The sampler's fast path; its steps graphed unless the run's CUDA_GRAPHS is off or its adapter
    decides in Python per call (DyLoRA draws a rank each forward: a graph would replay one draw)."""
    record = adapter_algo(algo)
    eager = cuda_graphs == "off" or (record is not None and record.python_state)
    return SamplerSpeed(cuda_graphs="off" if eager else "auto")


@torch.no_grad()
def draw_row(
    model,
    text_encoder,
    vae,
    cfg: TrainConfig,
    device,
    dtype,
    progress: Callable[[int, int], None] | None = None,
) -> list[Image.Image]:
    """One image per sample request; `progress(i, n)` after each sampler step."""
    was_training = model.training
    model.eval()
    try:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            return generate(
                model,
                text_encoder,
                vae,
                sample_requests(cfg.samples),
                sampler_config(cfg.samples, model.config.depth),
                model.config.in_channels,
                device,
                progress=progress,
                speed=sampler_speed(cfg.runtime.cuda_graphs, cfg.adapter.algo),
            )
    finally:
        model.train(was_training)


def save_row(
    images: list[Image.Image], folder: Path, prefix: str, infos: list[PngImagePlugin.PngInfo] | None = None
) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i, im in enumerate(images):
        save_image(im, folder / f"{prefix}_{i:02d}.png", pnginfo=infos[i] if infos else None)


def timeline_rows(samples_dir: Path, n: int, upto: int) -> list[tuple[str, list[Image.Image]]]:
    """Every saved row of steps up to `upto` (`samples/step_XXXXXXXX/sample_NN.png`), oldest first."""
    rows = []
    for folder in sorted(samples_dir.glob("step_*")):
        match = re.fullmatch(r"step_(\d+)", folder.name)
        row = load_row(folder, "sample", n) if match and int(match.group(1)) <= upto else None
        if row is not None:
            rows.append((f"step {int(match.group(1))}", row))
    return rows


def load_row(folder: Path, prefix: str, n: int) -> list[Image.Image] | None:
    paths = [folder / f"{prefix}_{i:02d}.png" for i in range(n)]
    return [Image.open(p).convert("RGB") for p in paths] if all(p.exists() for p in paths) else None

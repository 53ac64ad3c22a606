"""The text chunks of a sampled PNG, one form for scripts/sample/sample.py and the trainer's samples:
`prompt`, `kohakumoss` (JSON of what drew it) and `parameters` (the A1111 line image viewers read).
An edit sample also records its reference images and whether the text encoder was shown them."""

from __future__ import annotations

import json
from typing import Any

from PIL import PngImagePlugin

from .generate import GenerationRequest


def references_in_prompt(text_encoder: Any) -> str:
    """'picture' when `text_encoder` puts reference images in its prompt (`Picture N:`), else 'none'."""
    inner = getattr(text_encoder, "encoder", text_encoder)  # the trainer's CacheOnly wraps the encoder
    return "picture" if getattr(inner, "references_in_prompt", False) else "none"


def sample_settings(
    request: GenerationRequest, steps: int, cfg: float, shift: float, text_encoder: Any, **extra: Any
) -> dict[str, Any]:
    """What drew one sample: the request, its sampler steps / CFG / shift, its references (with how the
    prompt held them), then `extra` (the caller's own facts: adapters, weights, the grid row)."""
    settings: dict[str, Any] = dict(
        prompt=request.prompt,
        negative=request.negative,
        seed=request.seed,
        width=request.width,
        height=request.height,
        steps=int(steps),
        cfg=float(cfg),
        shift=float(shift),
    )
    if request.references:
        settings["references"] = [str(r) for r in request.references]
        settings["references_in_prompt"] = references_in_prompt(text_encoder)
    return {**settings, **extra}


def sample_png_info(settings: dict[str, Any]) -> PngImagePlugin.PngInfo:
    """PNG text chunks of a sample's `sample_settings`."""
    info = PngImagePlugin.PngInfo()
    info.add_text("prompt", settings["prompt"])
    info.add_text("kohakumoss", json.dumps(settings))
    negative = f"\nNegative prompt: {settings['negative']}" if settings["negative"] else ""
    references = f", References: {len(settings['references'])}" if settings.get("references") else ""
    info.add_text(
        "parameters",
        f"{settings['prompt']}{negative}\nSteps: {settings['steps']}, Sampler: Euler, "
        f"CFG scale: {settings['cfg']:g}, Seed: {settings['seed']}, Size: {settings['width']}x"
        f"{settings['height']}, Shift: {settings['shift']:g}{references}",
    )
    return info

"""The memory plan of sampling: no backward, so only weight streaming and the encoders' placement.

STREAM_BLOCKS None streams every block when the resident DiT, the resident encoders and the sampler's
working set would not fit in the card (less CARD_MARGIN and the CUDA context); the text encoder streams by default (it
runs once per prompt batch, then leaves the card to the DiT).
"""

from __future__ import annotations

from typing import Any

import torch

from . import calibration as cal
from .catalog import card_budget
from .estimate import block_weight_bytes, encoder_file_bytes, nonblock_params
from .plan import MemoryPlan
from .profiles import card_memory_gb

# bytes per token and model dim the sampler's forward holds at once (no saved activations); a
# DERIVED bound: the widest block intermediate (ffn_up_gate's 2 x mlp_hidden in bf16 ~ 11 per dim) twice
INFERENCE_WORKING_PER_TOKEN_DIM = 24.0


def sampler_tokens(cfg: Any, text_tokens: int | None = None, references: int = 0) -> int:
    """Tokens of one packed sampler call: BATCH images, conditional and unconditional, each with
    `text_tokens` (the longest templated prompt's, when known) or MAX_TEXT_TOKENS (a bound) text tokens,
    and `references` reference images at about the image's area (an edit request's)."""
    sampler = cfg.sampler
    image = int(sampler.width) * int(sampler.height) // 256
    text = int(sampler.max_text_tokens)
    if text_tokens is not None:
        text = min(int(text_tokens), text)
    return int(sampler.batch) * 2 * (image * (1 + int(references)) + text)


def reference_kv_bytes(cfg: Any, config: Any, references: int) -> float:
    """The sampler's reference K/V cache (REFERENCE_KV_CACHE): keys and values of every block for the
    references of BATCH images in both branches, kept per skip set (two when the skip window covers
    part of the steps). DERIVED from the layout, in the compute dtype."""
    sampler = cfg.sampler
    if not references or not sampler.reference_kv_cache:
        return 0.0
    wb = cal.WEIGHT_BYTES.get(cfg.device.precision, 2)
    ref_tokens = int(sampler.width) * int(sampler.height) // 256 * int(references) * int(sampler.batch) * 2
    window = (float(sampler.slg_start), float(sampler.slg_stop))
    kinds = 1 if window in ((0.0, 1.0), (0.0, 0.0)) or not sampler.uncond_skip_layers else 2
    return 2.0 * config.depth * ref_tokens * config.dim * wb * kinds


def inference_peak(
    cfg: Any, config: Any, stream_blocks: int, text_tokens: int | None = None, references: int = 0
) -> float:
    """Predicted peak bytes of sampling with `stream_blocks` streamed (-1: all); `references`: the most
    reference images a request has (their tokens in the first step, their cached K/V after)."""
    dev = cfg.device
    wb = cal.WEIGHT_BYTES.get(dev.precision, 2)
    plan = MemoryPlan(stream_blocks=stream_blocks, stream_slots=int(dev.stream_slots))
    streamed, slots = plan.streamed_count(config.depth), plan.slots(config.depth)
    block = block_weight_bytes(config, dev.precision, dev.base_precision)
    dit = (config.depth - streamed + slots) * block + nonblock_params(config) * wb
    te, vae = encoder_file_bytes(cfg)
    encoders = (te if dev.text_encoder_placement == "resident" else 0) + (
        vae if dev.vae_placement == "resident" else 0
    )
    work = sampler_tokens(cfg, text_tokens, references) * config.dim * INFERENCE_WORKING_PER_TOKEN_DIM
    return (dit + encoders + work + reference_kv_bytes(cfg, config, references)) * cal.ALLOCATOR_SLACK


def inference_plan(
    cfg: Any, config: Any, device: torch.device, text_tokens: int | None = None, references: int = 0
) -> tuple[MemoryPlan, str]:
    """The sampling plan of the sample script's typed config `cfg` on `device`, and one line saying why;
    `text_tokens`: the longest templated prompt's tokens when known (else MAX_TEXT_TOKENS, an upper bound,
    prices every prompt); `references`: the most reference images a request has."""
    dev = cfg.device
    stream = dev.stream_blocks
    why = f"STREAM_BLOCKS={stream}"
    if stream is None:
        card = card_memory_gb(dev.card_gb, device) if device.type != "cpu" else None
        resident = inference_peak(cfg, config, 0, text_tokens, references)
        if card is None or resident <= card_budget(card * cal.GIB):
            stream = 0
            why = "the DiT stays on the card" + (
                f" (predicted {resident / cal.GIB:.1f} GiB of {card:g})" if card else ""
            )
        else:
            stream = -1
            peak = inference_peak(cfg, config, -1, text_tokens, references)
            why = (
                f"every block streamed: resident would need {resident / cal.GIB:.1f} GiB of the card's {card:g}; "
                f"streamed {peak / cal.GIB:.1f} GiB"
            )
    plan = MemoryPlan(
        stream_blocks=int(stream),
        stream_slots=int(dev.stream_slots),
        text_encoder=dev.text_encoder_placement,
        vae=dev.vae_placement,
    )
    return plan, why

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


def sampler_tokens(k: dict[str, Any], text_tokens: int | None = None, references: int = 0) -> int:
    """Tokens of one packed sampler call: BATCH images, conditional and unconditional, each with
    `text_tokens` (the longest templated prompt's, when known) or MAX_TEXT_TOKENS (a bound) text tokens,
    and `references` reference images at about the image's area (an edit request's)."""
    image = int(k["WIDTH"]) * int(k["HEIGHT"]) // 256
    text = int(k.get("MAX_TEXT_TOKENS", 256))
    if text_tokens is not None:
        text = min(int(text_tokens), text)
    return int(k["BATCH"]) * 2 * (image * (1 + int(references)) + text)


def reference_kv_bytes(k: dict[str, Any], config: Any, references: int) -> float:
    """The sampler's reference K/V cache (REFERENCE_KV_CACHE): keys and values of every block for the
    references of BATCH images in both branches, kept per skip set (two when the skip window covers
    part of the steps). DERIVED from the layout, in the compute dtype."""
    if not references or not k.get("REFERENCE_KV_CACHE", True):
        return 0.0
    wb = cal.WEIGHT_BYTES.get(k["PRECISION"], 2)
    ref_tokens = int(k["WIDTH"]) * int(k["HEIGHT"]) // 256 * int(references) * int(k["BATCH"]) * 2
    window = (float(k["SLG_START"]), float(k["SLG_STOP"]))
    kinds = 1 if window in ((0.0, 1.0), (0.0, 0.0)) or not k["UNCOND_SKIP_LAYERS"] else 2
    return 2.0 * config.depth * ref_tokens * config.dim * wb * kinds


def inference_peak(
    k: dict[str, Any], config: Any, stream_blocks: int, text_tokens: int | None = None, references: int = 0
) -> float:
    """Predicted peak bytes of sampling with `stream_blocks` streamed (-1: all); `references`: the most
    reference images a request has (their tokens in the first step, their cached K/V after)."""
    wb = cal.WEIGHT_BYTES.get(k["PRECISION"], 2)
    plan = MemoryPlan(stream_blocks=stream_blocks, stream_slots=int(k["STREAM_SLOTS"]))
    streamed, slots = plan.streamed_count(config.depth), plan.slots(config.depth)
    dit = (config.depth - streamed + slots) * block_weight_bytes(k, config) + nonblock_params(config) * wb
    te, vae = encoder_file_bytes(k)
    encoders = (te if k["TEXT_ENCODER_PLACEMENT"] == "resident" else 0) + (
        vae if k["VAE_PLACEMENT"] == "resident" else 0
    )
    work = sampler_tokens(k, text_tokens, references) * config.dim * INFERENCE_WORKING_PER_TOKEN_DIM
    return (dit + encoders + work + reference_kv_bytes(k, config, references)) * cal.ALLOCATOR_SLACK


def inference_plan(
    k: dict[str, Any], config: Any, device: torch.device, text_tokens: int | None = None, references: int = 0
) -> tuple[MemoryPlan, str]:
    """The sampling plan for these knobs on `device`, and one line saying why; `text_tokens`: the longest
    templated prompt's tokens when known (else MAX_TEXT_TOKENS, an upper bound, prices every prompt);
    `references`: the most reference images a request has."""
    stream = k["STREAM_BLOCKS"]
    why = f"STREAM_BLOCKS={stream}"
    if stream is None:
        card = card_memory_gb(k, device) if device.type != "cpu" else None
        resident = inference_peak(k, config, 0, text_tokens, references)
        if card is None or resident <= card_budget(card * cal.GIB):
            stream = 0
            why = "the DiT stays on the card" + (
                f" (predicted {resident / cal.GIB:.1f} GiB of {card:g})" if card else ""
            )
        else:
            stream = -1
            peak = inference_peak(k, config, -1, text_tokens, references)
            why = (
                f"every block streamed: resident would need {resident / cal.GIB:.1f} GiB of the card's {card:g}; "
                f"streamed {peak / cal.GIB:.1f} GiB"
            )
    plan = MemoryPlan(
        stream_blocks=int(stream),
        stream_slots=int(k["STREAM_SLOTS"]),
        text_encoder=k["TEXT_ENCODER_PLACEMENT"],
        vae=k["VAE_PLACEMENT"],
    )
    return plan, why

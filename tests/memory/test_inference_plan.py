"""Sampling's memory plan: the 5B DiT streams on a small card, stays resident on a large one."""

from __future__ import annotations

import pytest
import torch

from kohakumoss.config.sample import SAMPLE_SCHEMA, SampleScriptConfig
from kohakumoss.memory.calibration import ALLOCATOR_SLACK, GIB
from kohakumoss.memory.estimate import block_weight_bytes
from kohakumoss.memory.inference import inference_peak, inference_plan, sampler_tokens
from kohakumoss.model import get_preset

MOSS = get_preset("moss-image-5b")


def knobs(**over):
    given = {"MODEL_PRESET": "moss-image-5b", "PROMPT": "x", "DEVICE": "cpu", **over}
    return SampleScriptConfig.from_knobs(SAMPLE_SCHEMA.validate(given))


PROMPT = 256  # templated prompt tokens of a typical caption


@pytest.mark.parametrize("card, streamed", [(8, True), (12, True), (16, False), (80, False)])
def test_auto_streams_only_when_the_card_is_too_small(card, streamed):
    plan, why = inference_plan(knobs(CARD_GB=card), MOSS, torch.device("cuda"), text_tokens=PROMPT)
    assert (plan.stream_blocks == -1) == streamed, why
    assert plan.text_encoder == "streamed" and plan.vae == "resident"


def test_streamed_peak_is_a_couple_of_blocks():
    k = knobs()
    streamed, resident = inference_peak(k, MOSS, -1, PROMPT), inference_peak(k, MOSS, 0, PROMPT)
    assert streamed < 4 * GIB < 9 * GIB < resident
    # what stays resident is everything but the blocks: the refiner, the shared modulation, the rest
    block = block_weight_bytes(MOSS, "bf16")
    assert resident - streamed == pytest.approx((MOSS.depth - 2) * block * ALLOCATOR_SLACK)


def test_unknown_prompts_are_priced_at_max_text_tokens():
    k = knobs(MAX_TEXT_TOKENS=1024)  # the sample schema's truncation knob
    assert sampler_tokens(k) == k.sampler.batch * 2 * (4096 + 1024)
    assert sampler_tokens(k, PROMPT) == k.sampler.batch * 2 * (4096 + PROMPT)
    assert sampler_tokens(k, 5000) == sampler_tokens(k)  # never above the truncation
    assert inference_peak(k, MOSS, 0, PROMPT) < inference_peak(k, MOSS, 0)


def test_cpu_and_explicit_knob():
    assert inference_plan(knobs(), MOSS, torch.device("cpu"))[0].stream_blocks == 0
    plan, why = inference_plan(knobs(STREAM_BLOCKS=10), MOSS, torch.device("cpu"))
    assert plan.stream_blocks == 10 and "STREAM_BLOCKS=10" in why


def test_reference_images_are_priced_with_their_kv_cache():
    """An edit request's references: their tokens in the working set and the reference K/V cache, two
    skip sets when the skip window covers part of the steps, none when REFERENCE_KV_CACHE is off."""
    from kohakumoss.memory.inference import reference_kv_bytes

    k = knobs(BATCH=1)
    assert sampler_tokens(k, PROMPT, references=1) == 2 * (2 * 4096 + PROMPT)
    one = reference_kv_bytes(k, MOSS, 1)
    assert one == 2 * MOSS.depth * (2 * 4096) * MOSS.dim * 2  # K and V, 42 blocks, both branches, bf16
    assert reference_kv_bytes(knobs(BATCH=1, SLG_STOP=0.5), MOSS, 1) == 2 * one
    assert reference_kv_bytes(knobs(BATCH=1, REFERENCE_KV_CACHE=False), MOSS, 1) == 0
    assert inference_peak(k, MOSS, 0, PROMPT, references=1) > inference_peak(k, MOSS, 0, PROMPT) + one
    plan, _ = inference_plan(knobs(CARD_GB=16, BATCH=4), MOSS, torch.device("cuda"), PROMPT, references=2)
    assert plan.stream_blocks == -1  # a 16 GiB card holds the DiT for text-to-image, not for two references

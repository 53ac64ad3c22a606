"""Sampling's memory plan: the 5B DiT streams on a small card, stays resident on a large one."""

from __future__ import annotations

import pytest
import torch

from kohakumoss.config.sample import SAMPLE_SCHEMA
from kohakumoss.memory.calibration import GIB
from kohakumoss.memory.inference import inference_peak, inference_plan
from kohakumoss.model import get_preset

MOSS = get_preset("moss-image-5b")


def knobs(**over):
    return SAMPLE_SCHEMA.validate({"MODEL_PRESET": "moss-image-5b", "PROMPT": "x", "DEVICE": "cpu", **over})


@pytest.mark.parametrize("card, streamed", [(8, True), (12, True), (16, False), (80, False)])
def test_auto_streams_only_when_the_card_is_too_small(card, streamed):
    plan, why = inference_plan(knobs(CARD_GB=card), MOSS, torch.device("cuda"))
    assert (plan.stream_blocks == -1) == streamed, why
    assert plan.text_encoder == "streamed" and plan.vae == "resident"


def test_streamed_peak_is_a_couple_of_blocks():
    k = knobs()
    assert inference_peak(k, MOSS, -1) < 4 * GIB < 9 * GIB < inference_peak(k, MOSS, 0)


def test_cpu_and_explicit_knob():
    assert inference_plan(knobs(), MOSS, torch.device("cpu"))[0].stream_blocks == 0
    plan, why = inference_plan(knobs(STREAM_BLOCKS=10), MOSS, torch.device("cpu"))
    assert plan.stream_blocks == 10 and "STREAM_BLOCKS=10" in why

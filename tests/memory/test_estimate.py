"""The peak estimate: the measured point, monotonic in each engine, the parts each engine removes."""

from __future__ import annotations

import pytest

from kohakumoss.memory import MemoryPlan, estimate_plan
from kohakumoss.memory.calibration import ACTIVATIONS, ALLOCATOR_SLACK, GIB
from kohakumoss.memory.estimate import block_params
from kohakumoss.model.presets import get_preset

MOSS = get_preset("moss-image-5b")
MEASURED = {"RANK": 32, "TOKENS_PER_STEP": 8704, "PRECISION": "bf16", "TARGET_PRESET": "attn-mlp"}


def peak(plan: MemoryPlan, **knobs) -> float:
    return estimate_plan(plan, {**MEASURED, **knobs}, MOSS).total


# measured step peaks (torch max allocated), docs/performance/memory.md: LoRA r32 on every linear, 8704 tokens
BENCH = {"RANK": 32, "TOKENS_PER_STEP": 8704, "PRECISION": "bf16", "TARGET_PRESET": "full"}
MEASURED_PEAKS = {"speed": 53.8, "minimal": 2.4}


@pytest.mark.parametrize("profile", sorted(MEASURED_PEAKS))
def test_measured_points(profile):
    from kohakumoss.memory.profiles import PROFILES

    est = estimate_plan(PROFILES[profile], BENCH, MOSS, params=4_970_396_800)
    assert abs(est.total / GIB / MEASURED_PEAKS[profile] - 1) < 0.10, (profile, est.total / GIB)
    assert abs(est.parts["DiT weights"] / GIB - (9.3 if profile == "speed" else 0.06)) < 0.1


def test_calibrated_activation_table():
    assert ACTIVATIONS[("none", "bf16")] == {"kept": 40.69, "working": 8.85}
    assert ACTIVATIONS[("none", "fp32")]["kept"] == 2 * 40.69


def test_more_checkpointing_lowers_the_peak():
    # full/3 keeps 2/3 of the blocks whole, mlp/1 keeps ~26 of 46 bytes on every block
    order = [("none", 1), ("full", 3), ("mlp", 1), ("full", 2), ("full", 1)]
    peaks = [peak(MemoryPlan(checkpointing=m, checkpoint_every=k)) for m, k in order]
    assert peaks == sorted(peaks, reverse=True) and len(set(peaks)) == len(peaks), peaks
    assert peak(MemoryPlan(checkpointing="attn")) < peak(MemoryPlan())


@pytest.mark.parametrize("full", [False, True])
def test_more_streaming_lowers_the_peak(full):
    algo = {"ALGO": "full"} if full else {}
    opt = "host"  # with the optimizer (and fp32 masters) on the card, a full fine-tune cannot stream
    peaks = [peak(MemoryPlan(stream_blocks=n, optimizer=opt), **algo) for n in (0, 10, 21, 32, -1)]
    assert peaks == sorted(peaks, reverse=True) and len(set(peaks)) == len(peaks), peaks
    # the ring holds two blocks whatever the count
    est = estimate_plan(MemoryPlan(stream_blocks=-1, optimizer=opt), {**MEASURED, **algo}, MOSS)
    assert est.parts["streaming slots"] == 2 * block_params(MOSS) * 2  # two bf16 blocks


def test_each_engine_removes_its_part():
    base = MemoryPlan(checkpointing="full", optimizer="stream")
    off = estimate_plan(MemoryPlan(checkpointing="full", activation_offload="on"), MEASURED, MOSS)
    on = estimate_plan(MemoryPlan(checkpointing="full"), MEASURED, MOSS)
    assert off.parts["saved activations"] < on.parts["saved activations"] / 10
    full = {**MEASURED, "ALGO": "full"}
    g = estimate_plan(base, full, MOSS)
    go = estimate_plan(MemoryPlan(checkpointing="full", optimizer="stream", grad_offload=True), full, MOSS)
    assert go.parts["grad staging ring"] < g.parts["grads"] / 10 and go.total < g.total
    host = estimate_plan(MemoryPlan(checkpointing="full", optimizer="host"), full, MOSS)
    gpu = estimate_plan(MemoryPlan(checkpointing="full"), full, MOSS)
    assert "optimizer states" in gpu.parts and "optimizer states" not in host.parts
    assert gpu.parts["DiT weights (fp32)"] == 2 * host.parts["DiT weights"]  # fp32 masters vs the bf16 copy
    # stream's chunks live only in the optimizer step, after the activations are freed
    assert host.total == g.total < gpu.total and g.optimizer_peak > host.optimizer_peak


def test_the_peak_is_the_larger_phase():
    full = {**MEASURED, "ALGO": "full"}
    stream = MemoryPlan(checkpointing="full", optimizer="stream", grad_offload=True)
    est = estimate_plan(stream, full, MOSS)
    assert "optimizer stream chunks" in est.step_parts and "optimizer stream chunks" not in est.parts
    acts = sum(est.parts[k] for k in ("saved activations", "backward working set", "grad staging ring"))
    assert est.backward_peak - est.optimizer_peak == pytest.approx(
        acts + est.parts["outside the blocks"] - est.step_parts["optimizer stream chunks"]
    )
    assert est.total == pytest.approx(max(est.backward_peak, est.optimizer_peak) * ALLOCATOR_SLACK)
    tiny = estimate_plan(stream, {**full, "TOKENS_PER_STEP": 16}, MOSS)  # next to no activations
    assert tiny.optimizer_peak > tiny.backward_peak
    assert tiny.total == pytest.approx(tiny.optimizer_peak * ALLOCATOR_SLACK)
    assert any("optimizer step" in line for line in tiny.lines())


def test_encoders_count_only_when_they_run_and_are_resident():
    te = 8 * GIB
    k = {**MEASURED, "TEXT_ENCODE": "auto"}
    resident = estimate_plan(MemoryPlan(), k, MOSS, text_encoder_bytes=te)
    streamed = estimate_plan(MemoryPlan(text_encoder="streamed"), k, MOSS, text_encoder_bytes=te)
    off = estimate_plan(MemoryPlan(text_encoder="off"), k, MOSS, text_encoder_bytes=te)
    cached = estimate_plan(MemoryPlan(), {**k, "TEXT_ENCODE": "cache"}, MOSS, text_encoder_bytes=te)
    assert resident.parts["text encoder"] == te
    assert 0 < streamed.parts["text encoder"] < te
    assert off.parts["text encoder"] == 0 == cached.parts["text encoder"]


def test_fp32_doubles_activations():
    bf = estimate_plan(MemoryPlan(), MEASURED, MOSS).parts["saved activations"]
    fp = estimate_plan(MemoryPlan(), {**MEASURED, "PRECISION": "fp32"}, MOSS).parts["saved activations"]
    assert fp == 2 * bf

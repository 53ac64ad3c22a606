"""The catalog: size, stable ids, pins, and the fastest-fit choice."""

from __future__ import annotations

import pytest

from kohakumoss.config.train import TrainConfig
from kohakumoss.memory import CATALOG_SIZE, MemoryPlan, catalog, fastest_fit
from kohakumoss.memory.calibration import CUDA_CONTEXT_BYTES, GIB
from kohakumoss.memory.catalog import catalog_plans, find_entry, fits, step_seconds
from kohakumoss.model.presets import get_preset

MOSS = get_preset("moss-image-5b")
KNOBS = {"RANK": 32, "TOKENS_PER_STEP": 8704, "PRECISION": "bf16", "TARGET_PRESET": "attn-mlp"}


def test_size_and_unique_stable_ids():
    entries = catalog(MOSS, TrainConfig.from_knobs(KNOBS))
    assert len(entries) == CATALOG_SIZE >= 240
    ids = [e.id for e in entries]
    assert len(set(ids)) == len(ids) and ids == sorted(ids) and ids[0] == "c0000"
    assert len({e.plan for e in entries}) == len(entries)  # every entry a different plan
    # the same id is the same plan whatever the knobs; find_entry agrees
    other = catalog(MOSS, TrainConfig.from_knobs({**KNOBS, "TOKENS_PER_STEP": 2048, "ALGO": "lokr"}))
    assert [(e.id, e.plan) for e in other] == [(e.id, e.plan) for e in entries]
    # a full fine-tune leaves out what the engines refuse (streaming with the optimizer on the GPU)
    full = catalog(MOSS, TrainConfig.from_knobs({**KNOBS, "ALGO": "full"}))
    assert all(not (e.plan.stream_blocks and e.plan.optimizer == "gpu") for e in full)
    assert len(full) == CATALOG_SIZE - 6 * 4 * 2 and {e.id for e in full} < set(ids)
    assert find_entry("c0042", MOSS.depth) == dict(catalog_plans(MOSS.depth))["c0042"]
    assert entries[0].plan == MemoryPlan() and entries[0].profile == "speed" and entries[0].cost == 1.0


def test_costs_are_relative_and_recompute_costs_time():
    plain = step_seconds(MemoryPlan(), TrainConfig.from_knobs(KNOBS), MOSS)
    assert step_seconds(MemoryPlan(checkpointing="full"), TrainConfig.from_knobs(KNOBS), MOSS) > plain
    assert step_seconds(
        MemoryPlan(checkpointing="full", checkpoint_every=2), TrainConfig.from_knobs(KNOBS), MOSS
    ) < step_seconds(MemoryPlan(checkpointing="full"), TrainConfig.from_knobs(KNOBS), MOSS)
    # at a small token budget a streamed block's copy no longer hides behind its compute
    small = {**KNOBS, "TOKENS_PER_STEP": 512, "AREA": 256 * 256}
    streamed = step_seconds(MemoryPlan(stream_blocks=-1), TrainConfig.from_knobs(small), MOSS) / step_seconds(
        MemoryPlan(), TrainConfig.from_knobs(small), MOSS
    )
    assert streamed > 1.5
    assert min(e.cost for e in catalog(MOSS, TrainConfig.from_knobs(KNOBS))) == 1.0


def test_fastest_fit_picks_the_cheapest_fitting_entry():
    entries = catalog(MOSS, TrainConfig.from_knobs(KNOBS))
    for gb in (6, 8, 12, 16, 24, 48, 80):
        best = fastest_fit(entries, gb * GIB)
        assert best is not None and fits(best, gb * GIB)
        cheaper = [e for e in entries if e.cost < best.cost]
        assert all(not fits(e, gb * GIB) for e in cheaper), gb
    assert fastest_fit(entries, 200 * GIB).id == "c0000"
    assert fastest_fit(entries, 0.5 * GIB) is None
    # a margin of 0 lets an entry use the whole card less the CUDA context
    smallest = min(entries, key=lambda e: e.peak)
    exact = smallest.peak + CUDA_CONTEXT_BYTES
    assert fastest_fit(entries, exact, margin=0.0) is smallest
    assert fastest_fit(entries, exact - 1, margin=0.0) is None  # the context is never the step's
    assert fastest_fit(entries, exact) is None  # the default margin keeps 5% free


def test_pins_fix_fields_and_drop_entries_that_cannot_take_them():
    pinned = catalog(
        MOSS,
        TrainConfig.from_knobs(
            {**KNOBS, "CHECKPOINTING": "full", "CHECKPOINT_EVERY": 1, "OPTIMIZER_PLACEMENT": "gpu"}
        ),
    )
    assert pinned and all(e.plan.checkpointing == "full" and e.plan.optimizer == "gpu" for e in pinned)
    assert all(not e.plan.grad_offload for e in pinned)  # grad offload + GPU optimizer entries were left out
    assert len(pinned) < CATALOG_SIZE and {e.id for e in pinned} <= {
        e.id for e in catalog(MOSS, TrainConfig.from_knobs(KNOBS))
    }


def test_tiny_model_catalog():
    tiny = get_preset("tiny")
    entries = catalog(tiny, TrainConfig.from_knobs({"TOKENS_PER_STEP": 64}))
    assert len(entries) == CATALOG_SIZE
    assert {e.plan.stream_blocks for e in entries} == {0, 1, 2, 3, -1}


def test_cost_model_tracks_the_measured_block_times(monkeypatch):
    """memory_calibrate.py on the H200 (docs/performance/memory.md): fwd+bwd per block relative to 'none'
    without offload. The cost model, fed the calibration's own shape and the eager block's compute rate
    and recompute shares (the constants are now fitted to graphed steps), must land within 30% of each."""
    from kohakumoss.memory import calibration as cal

    monkeypatch.setattr(cal, "EFFECTIVE_FLOPS", 382e12)  # that run: 5.75e12 FLOPs per block in 15.05 ms
    monkeypatch.setattr(cal, "RECOMPUTE_SHARE", {"none": 0.0, "full": 1.57, "attn": 1.42, "mlp": 0.63})
    measured = {
        ("full", "none"): 24.13 / 15.05,
        ("attn", "on"): 22.91 / 15.05,
        ("full", "on"): 25.66 / 15.05,
        ("none", "on"): 39.19 / 15.05,
    }
    knobs = {
        "RANK": 32,
        "TOKENS_PER_STEP": 8704,
        "TARGET_PRESET": "full",
        "AREA": 1 << 20,
        "MAX_TEXT_TOKENS": 256,
    }
    base = step_seconds(MemoryPlan(), TrainConfig.from_knobs(knobs), MOSS)
    for (mode, offload), ratio in measured.items():
        predicted = (
            step_seconds(
                MemoryPlan(checkpointing=mode, activation_offload=offload),
                TrainConfig.from_knobs(knobs),
                MOSS,
            )
            / base
        )
        assert abs(predicted / ratio - 1) < 0.30, (mode, offload, predicted, ratio)


def test_the_cost_models_forward_counts_an_edit_steps_reference_tokens():
    """The cost model's forward multiply-adds (blocks and outside them) are the model's count
    (flops.step_flops, forward alone) for a step of whole samples: with one reference per target, the
    reference tokens pass the blocks and the video embedder, and the target's and text's queries read
    their keys; text-to-image as before."""
    from kohakumoss.memory.catalog import block_macs, outside_macs
    from kohakumoss.memory.flops import step_flops

    for refs in (0, 1):
        knobs = {**KNOBS, "TOKENS_PER_STEP": 2 * ((1 + refs) * 4096 + 256), "AREA": 1024 * 1024}
        if refs:
            knobs["DATASET"] = {"kind": "kohya", "path": "d", "references": "r"}  # not scanned: one each
        cfg = TrainConfig.from_knobs(knobs)
        attn, mlp = block_macs(MOSS, cfg)
        text, image = outside_macs(MOSS, cfg)
        predicted = 2 * (MOSS.depth * knobs["TOKENS_PER_STEP"] * (attn + mlp) + text + image)
        model = step_flops(MOSS, [4096] * 2, [256] * 2, False, backward=False, ref_lens=[4096 * refs] * 2)
        assert predicted == pytest.approx(model, rel=1e-5)

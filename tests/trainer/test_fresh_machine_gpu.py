"""The trainer on a fresh machine (an empty kernel tuning cache) under every memory profile, at 1, 2 and 4
images per step: the first step's tuning runs inside each engine (checkpointed, streamed, offloaded
blocks) and the run completes with finite losses and a written tuning table."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from .conftest import SIZE, tiny_knobs

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("images", [1, 2, 4])
@pytest.mark.parametrize("profile", ["speed", "balanced", "low_vram", "minimal"])
def test_a_fresh_machine_trains_under_every_profile(train_world, tmp_path, monkeypatch, profile, images):
    from kohakumoss.train.loop import train
    from kohakumoss_kernels import tuning

    monkeypatch.setenv("KOHAKUMOSS_CACHE", str(tmp_path / "cache"))  # nothing tuned yet
    monkeypatch.delenv("KOHAKUMOSS_TUNE", raising=False)  # the product's default: tune in the first step
    monkeypatch.setenv("KOHAKUMOSS_SHIPPED_TABLES", "0")  # a card without a shipped table
    monkeypatch.setattr(tuning, "_tables", {})  # no table this process already read
    knobs = tiny_knobs(
        train_world,
        f"fresh-{profile}-{images}",
        DEVICE="cuda",
        PRECISION="bf16",
        OPS_BACKEND="auto",
        MEMORY_PROFILE=profile,
        STEPS=4,
        TOKENS_PER_STEP=images * (SIZE * SIZE // 256 + 16),
        CACHE_DIR=str(tmp_path / "data-cache"),
    )
    run = train(knobs)
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 4 and all(math.isfinite(m["loss"]) for m in metrics)
    assert all(m["peak_reserved_gib"] >= m["peak_mem_gib"] > 0 for m in metrics)
    log = (run / "log.txt").read_text()
    assert "different number of tensors" not in log and "out of memory" not in log
    assert list(Path(tmp_path / "cache" / "tuning").glob("*.json"))  # the first step tuned and kept it

"""Exact resume: 20 steps straight == 10 steps, checkpoint, rebuild everything from scratch, 10 steps.

Bit for bit at every step, for a LoRA run (bypass, dropout and rank dropout draw from the global RNG)
and a full fine-tune run (Muon + AdamW); both with EMA, LoRA+ / cosine warmup schedule, a noise
generator and a data position.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from kohakumoss.checkpoint.folders import resolve_checkpoint
from kohakumoss.checkpoint.read import load_checkpoint
from kohakumoss.checkpoint.rng import restore_rng
from kohakumoss.checkpoint.state import load_trainable_state, trainable_state
from kohakumoss.checkpoint.write import save_checkpoint

from .runner import make_run, train_step

STEPS, HALF = 20, 10


@pytest.mark.parametrize("kind", ["lora", "full"])
def test_resume_is_bit_exact(tmp_path, kind):
    torch.manual_seed(0)
    straight = make_run(kind, STEPS)
    expected = [train_step(straight, s) for s in range(STEPS)]

    torch.manual_seed(0)
    first = make_run(kind, STEPS)
    got = [train_step(first, s) for s in range(HALF)]
    save_checkpoint(
        tmp_path,
        HALF,
        trainable_state(first.trainable),
        first.optimizer.state_dict(),
        first.ema.state_dict(),
        generators={"noise": first.noise_gen},
        data_position={"step": HALF},
        config={"kind": kind},
    )
    del first
    # a fresh process: other RNG states, new objects built from scratch
    random.seed(99), np.random.seed(99), torch.manual_seed(99)
    resumed = make_run(kind, STEPS)
    ck = load_checkpoint(resolve_checkpoint(tmp_path, "latest"))
    load_trainable_state(resumed.trainable, ck.trainable)
    resumed.optimizer.load_state_dict(ck.optimizer)
    resumed.ema.load_state_dict(ck.ema)
    restore_rng(ck.rng, {"noise": resumed.noise_gen})
    got += [train_step(resumed, s) for s in range(ck.data_position["step"], STEPS)]

    assert [x.item() for x in got] == [x.item() for x in expected]
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    for name, p in trainable_state(straight.trainable).items():
        assert torch.equal(p, trainable_state(resumed.trainable)[name]), name
    for name, s in straight.ema.shadow.items():
        assert torch.equal(s, resumed.ema.shadow[name]), name

"""Each rank's share of a micro-step: the shares cover it once, and they add up to the one-process step."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kohakumoss.distributed.shard import assign, check_shardable, rank_weight, shard_plan, step_noise
from kohakumoss.train.step import draw_step_noise
from kohakumoss_common.errors import ConfigError
from kohakumoss_data import Plan
from kohakumoss_data.plan import PlanKnobs

from . import helpers as h


def test_assign_covers_each_item_once_and_balances():
    tokens = [16, 15, 12, 15, 8, 3, 40]
    for world in (1, 2, 3, 4):
        shares = assign(tokens, world)
        assert sorted(i for s in shares for i in s) == list(range(len(tokens)))
        assert all(s == sorted(s) for s in shares)
        loads = [sum(tokens[i] for i in s) for s in shares]
        assert max(loads) - min(loads) <= max(tokens)
    assert assign(tokens, 2) == assign(list(tokens), 2)  # pure
    assert assign(tokens, 2) == [[2, 5, 6], [0, 1, 3, 4]]  # 40 12 3 | 16 15 15 8


def _plan(steps: int = 3) -> Plan:
    return Plan(seed=0, knobs=PlanKnobs(), catalog="fp", steps=[h.items() for _ in range(steps)])


def test_shard_plan_splits_every_step_and_keeps_plan_order():
    plan = _plan()
    parts = [shard_plan(plan, r, 2) for r in range(2)]
    for s, step in enumerate(plan.steps):
        keys = sorted(it.key for p, _ in parts for it in p.steps[s])
        assert keys == sorted(it.key for it in step)
        for p, picks in parts:
            assert [it.key for it in p.steps[s]] == [step[i].key for i in picks[s]]
    assert parts[0][0].catalog == plan.catalog  # the loader's fingerprint check still holds
    one, picks = shard_plan(plan, 0, 1)
    assert one is plan and picks[0] == list(range(5))


def test_a_step_with_fewer_images_than_ranks_is_refused_by_knob():
    plan = dataclasses.replace(_plan(), steps=[h.items(), h.items()[:1]])
    with pytest.raises(ConfigError, match=r"TOKENS_PER_STEP: micro-step 1 .* 1 image\(s\) for 2 ranks"):
        check_shardable(plan, 2)
    check_shardable(plan, 1)


@pytest.mark.parametrize("reduction", ["token", "sample"])
@pytest.mark.parametrize("world", [2, 3])
def test_weighted_shares_average_to_the_whole_step_loss(reduction, world):
    """sum_r rank_weight_r * loss_r / world == the loss of the whole step in one process."""
    model = h.model()
    whole = h.share_loss(model, list(range(5)), 1, reduction)
    shares = [[0], [1, 2, 3, 4]] if world == 2 else [[0, 4], [1], [2, 3]]  # any split, balanced or not
    parts = [h.share_loss(model, picks, world, reduction) for picks in shares]
    assert torch.allclose(sum(parts) / world, whole, rtol=1e-5, atol=1e-7)
    weights = [rank_weight(h.items(), picks, world, reduction) for picks in shares]
    assert max(abs(w - 1) for w in weights) > 0.2  # the split is uneven: unweighted means would differ
    assert sum(weights) == pytest.approx(world)


def test_step_noise_is_the_one_process_draw_cut_to_the_rank():
    step = h.items()
    batch = h.local_batch(list(range(5)))
    sigma, noise = draw_step_noise(7, 3, batch.x0, batch.seq, h.TCFG)
    got = [
        step_noise(draw_step_noise, 7, 3, step, picks, h.TCFG, torch.device("cpu"), torch.float32)
        for picks in [[1, 3], [0, 2, 4]]
    ]
    assert torch.equal(
        torch.cat([got[1][0][:1], got[0][0][:1], got[1][0][1:2], got[0][0][1:], got[1][0][2:]]), sigma
    )
    rows = [0, 16, 31, 43, 58, 66]
    expect = torch.cat([noise[rows[1] : rows[2]], noise[rows[3] : rows[4]]])
    assert torch.equal(got[0][1], expect)

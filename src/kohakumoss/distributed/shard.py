"""Each rank's share of every micro-step, and what makes the shares add up to the single-process step.

The plan stays a pure function of (data, seed, knobs): a micro-step holds the same images at any world
size, and `assign` splits it among the ranks (largest first, to the least-loaded rank; pure, so a resume
at the same world size replays exactly). Two things make the ranks' gradients, averaged by the all-reduce,
equal the single-process gradient of the whole micro-step:
- `rank_weight`: rank r's loss is a mean over its own tokens (or samples); scaled by
  world * local / global units, the average over ranks is the mean over the whole step;
- `step_noise`: sigmas and noise are drawn for the whole step, as one process would, and each rank keeps
  its images' rows.
So a run resumed at another world size reshards and continues: same plan, same draws, same gradients
(up to the order of float sums).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch

from kohakumoss_common.errors import ConfigError
from kohakumoss_data import Plan
from kohakumoss_data.plan import PlannedItem


def assign(tokens: Sequence[int], world: int) -> list[list[int]]:
    """Item indices per rank (ascending): largest item first, onto the least-loaded rank (ties: lower rank)."""
    loads, shares = [0] * world, [[] for _ in range(world)]
    for i in sorted(range(len(tokens)), key=lambda i: (-tokens[i], i)):
        r = min(range(world), key=lambda r: (loads[r], r))
        loads[r] += tokens[i]
        shares[r].append(i)
    return [sorted(s) for s in shares]


def step_shares(step: Sequence[PlannedItem], world: int) -> list[list[int]]:
    return assign([it.tokens for it in step], world)


def check_shardable(plan: Plan, world: int) -> None:
    """Every micro-step must give every rank at least one image (an empty rank has no loss to average)."""
    for i, step in enumerate(plan.steps):
        if len(step) < world:
            raise ConfigError(
                "TOKENS_PER_STEP",
                f"micro-step {i} of the plan holds {len(step)} image(s) for {world} ranks: each rank needs "
                f"one; raise TOKENS_PER_STEP (the budget of the whole step, all ranks together) or use "
                f"fewer DEVICES",
            )


def shard_plan(plan: Plan, rank: int, world: int) -> tuple[Plan, list[list[int]]]:
    """This rank's plan (its items of every micro-step, in plan order) and their indices in each step."""
    if world == 1:
        return plan, [list(range(len(s))) for s in plan.steps]
    check_shardable(plan, world)
    picks = [step_shares(step, world)[rank] for step in plan.steps]
    steps = [[step[i] for i in idx] for step, idx in zip(plan.steps, picks)]
    return dataclasses.replace(plan, steps=steps), picks


def units(items: Sequence[PlannedItem], reduction: str) -> int:
    """What the loss is a mean over: image tokens ('token') or samples ('sample')."""
    return sum(it.image_tokens for it in items) if reduction == "token" else len(items)


def rank_weight(step: Sequence[PlannedItem], picks: Sequence[int], world: int, reduction: str) -> float:
    """world * (this rank's units) / (the step's units): the factor on this rank's mean loss."""
    return world * units([step[i] for i in picks], reduction) / units(step, reduction)


class _Shape:
    """What `draw` reads of a packed batch: its image tokens' rows (shape, device, dtype) and lengths."""

    def __init__(self, lens: list[int], channels: int, device: torch.device, dtype: torch.dtype):
        self.img_lens = lens
        self.shape, self.device, self.dtype = (sum(lens), channels), device, dtype


def step_noise(
    draw: Callable,
    seed: int,
    micro_step: int,
    step: Sequence[PlannedItem],
    picks: Sequence[int],
    tcfg,
    device: torch.device,
    dtype: torch.dtype,
    channels: int = 128,
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's sigmas [b] and noise [T_local, channels]: `draw` (train/step.py `draw_step_noise`,
    passed in) run on the whole step as one process runs it, then cut to the rank's images."""
    lens = [it.image_tokens for it in step]
    whole = _Shape(lens, channels, device, dtype)
    sigma, noise = draw(seed, micro_step, whole, whole, tcfg)
    starts = [0]
    for n in lens:
        starts.append(starts[-1] + n)
    rows = torch.cat([torch.arange(starts[i], starts[i + 1]) for i in picks]).to(device)
    index = torch.tensor(list(picks), device=sigma.device)
    return sigma[index], noise.index_select(0, rows)

"""The adapter's initial weights are a function of SEED alone: lycoris draws them from the global generator,
and whatever drew from it before (a backbone build that stopped drawing changed the demo's adapter and
its figure) must not change them."""

from __future__ import annotations

import torch

from .conftest import tiny_knobs


def test_the_adapters_initial_weights_follow_seed_whatever_was_drawn_before(train_world):
    from kohakumoss.config.train import TrainConfig
    from kohakumoss.train.components import build_components
    from kohakumoss.train.trainer import build_trainable

    def initial(seed: int, draws_before: int) -> dict[str, torch.Tensor]:
        cfg = TrainConfig.from_knobs(tiny_knobs(train_world, "adapter-seed", SEED=seed))
        comps = build_components(cfg)
        torch.rand(draws_before)  # another build's draws from the global generator
        network = build_trainable(cfg, comps).network
        return {k: v.detach().clone() for k, v in network.state_dict().items()}

    first, moved = initial(0, 0), initial(0, 1000)
    assert first.keys() == moved.keys() and all(torch.equal(first[k], moved[k]) for k in first)
    other = initial(1, 0)
    assert any(not torch.equal(first[k], other[k]) for k in first)  # the seed still chooses the draw

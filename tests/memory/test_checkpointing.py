"""Activation checkpointing gives the plain path's loss and gradients (float32, tiny model)."""

from __future__ import annotations

import pytest
import torch

from kohakumoss.memory.engines.block_runner import install_checkpointing
from kohakumoss.memory.engines.checkpointing import CheckpointPolicy
from kohakumoss.model import get_preset
from kohakumoss_common.errors import ConfigError

from ..model.helpers import random_batch, random_model


def loss_and_grads(policy: CheckpointPolicy | None):
    cfg = get_preset("tiny")
    model = random_model(cfg).train()
    if policy is not None:
        install_checkpointing(model, policy)
    imgs, texts, sigma, seq = random_batch(cfg, [3, 9, 1], [(2, 3), (4, 4), (1, 5)])
    out = model(torch.cat(imgs), torch.cat(texts), sigma, seq)
    loss = out.pow(2).mean()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("mode, every", [("full", 1), ("attn", 1), ("mlp", 1), ("full", 2), ("attn", 3)])
def test_checkpointing_matches_the_plain_path(mode, every):
    ref_loss, ref_grads = loss_and_grads(None)
    loss, grads = loss_and_grads(CheckpointPolicy(mode, every))
    assert torch.equal(loss, ref_loss)
    for name, g in ref_grads.items():
        torch.testing.assert_close(grads[name], g, rtol=1e-5, atol=1e-7, msg=name)


def test_checkpointing_saves_activation_memory():
    """Fewer tensors kept for the backward: counted with saved-tensor hooks, not timed."""

    def saved_bytes(policy):
        cfg = get_preset("tiny")
        model = random_model(cfg).train()
        install_checkpointing(model, policy)
        imgs, texts, sigma, seq = random_batch(cfg, [8, 8], [(8, 8), (8, 8)])
        total = [0]

        def pack(t):
            total[0] += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(torch.cat(imgs), torch.cat(texts), sigma, seq).sum()
        return total[0]

    plain = saved_bytes(CheckpointPolicy("none"))
    assert saved_bytes(CheckpointPolicy("full")) < 0.5 * plain
    assert saved_bytes(CheckpointPolicy("attn")) < plain and saved_bytes(CheckpointPolicy("mlp")) < plain


def test_bad_policy_names_the_knob():
    with pytest.raises(ConfigError, match="CHECKPOINTING"):
        CheckpointPolicy("sometimes")
    with pytest.raises(ConfigError, match="CHECKPOINT_EVERY"):
        CheckpointPolicy("full", 0)


@pytest.mark.parametrize("preserve", [True, False])
def test_the_rng_state_is_read_only_when_the_forward_draws_random_numbers(monkeypatch, preserve):
    """Reading the generator state is a host call a CUDA graph cannot hold: without dropout it is skipped,
    and the gradients stay the plain path's."""
    reads = [0]
    get_state = torch.get_rng_state

    def counted():
        reads[0] += 1
        return get_state()

    monkeypatch.setattr(torch, "get_rng_state", counted)
    ref_loss, ref_grads = loss_and_grads(None)
    reads[0] = 0
    loss, grads = loss_and_grads(CheckpointPolicy("full", preserve_rng=preserve))
    assert (reads[0] > 0) == preserve
    assert torch.equal(loss, ref_loss)
    for name, g in ref_grads.items():
        torch.testing.assert_close(grads[name], g, rtol=1e-5, atol=1e-7, msg=name)

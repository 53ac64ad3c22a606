"""Weight streaming and activation offload, alone and combined with checkpointing, give the plain
path's loss and gradients (float32, tiny model), for a frozen base with a LyCORIS adapter and for a
full fine-tune. On the CPU the 'device' is the CPU: the same slot ring, barriers and hooks run."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from kohakumoss.adapters import build_adapter
from kohakumoss.memory.install import install_memory_plan
from kohakumoss.memory.plan import MemoryPlan
from kohakumoss.model import get_preset
from kohakumoss.precision import quantize_frozen_linears
from kohakumoss_common.errors import ConfigError

from ..model.helpers import random_batch, random_model

CPU = torch.device("cpu")
PLANS = {
    "stream all, 2 slots": MemoryPlan(stream_blocks=-1, stream_slots=2),
    "stream 3 of 4, 2 slots": MemoryPlan(stream_blocks=3, stream_slots=2),
    "stream all, 3 slots": MemoryPlan(stream_blocks=-1, stream_slots=3),
    "offload": MemoryPlan(activation_offload="on"),
    "full ckpt + offload": MemoryPlan(checkpointing="full", activation_offload="on"),
    "attn ckpt + offload + stream": MemoryPlan(
        checkpointing="attn", activation_offload="on", stream_blocks=-1
    ),
    "mlp ckpt every 2 + stream": MemoryPlan(checkpointing="mlp", checkpoint_every=2, stream_blocks=2),
    "minimal": MemoryPlan(checkpointing="full", activation_offload="on", stream_blocks=-1, stream_slots=2),
}


def run(plan: MemoryPlan | None, adapter: bool, steps: int = 2, base_precision: str = "same"):
    """Loss and grads of `steps` forward/backward passes (weights unchanged between them)."""
    torch.manual_seed(0)
    cfg = get_preset("tiny")
    model = random_model(cfg).train()
    if adapter:
        model.requires_grad_(False)
        quantize_frozen_linears(model, base_precision, CPU)  # as the trainer: before plan and adapter
        net = build_adapter(model, algo="lora", rank=4, alpha=4.0, preset="attn-mlp", rank_dropout=0.3)
        with torch.no_grad():  # a non-zero up projection, so every LoRA weight gets a gradient
            for name, p in net.named_parameters():
                if "lora_up" in name:
                    p.normal_(0, 0.1)
        trained = dict(net.named_parameters())
    else:
        trained = dict(model.named_parameters())
    engines = None
    if plan is not None:
        if not adapter:  # a full fine-tune streams trainable blocks only with host masters
            plan = replace(plan, optimizer="host")
        engines = install_memory_plan(plan, model, CPU, full_ft=not adapter)
        if engines.offload is not None:
            engines.offload.min_bytes = 0  # tiny tensors: offload everything the hooks see
            engines.offload.keep_tensors(trained.values())
    imgs, texts, sigma, seq = random_batch(cfg, [3, 9, 1], [(2, 3), (4, 4), (1, 5)])
    losses = []
    for step in range(steps):
        torch.manual_seed(100 + step)  # rank dropout draws the same masks on both paths
        out = model(torch.cat(imgs), torch.cat(texts), sigma, seq)
        loss = out.pow(2).mean()
        loss.backward()
        losses.append(loss.detach())
    return losses, {n: p.grad.clone() for n, p in trained.items()}, engines


@pytest.mark.parametrize("name", list(PLANS))
@pytest.mark.parametrize("adapter", [True, False], ids=["lora", "full"])
def test_engines_match_the_plain_path(name, adapter):
    ref_losses, ref_grads, _ = run(None, adapter)
    losses, grads, engines = run(PLANS[name], adapter)
    for a, b in zip(losses, ref_losses, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=0)
    assert grads.keys() == ref_grads.keys()
    for key, g in ref_grads.items():
        torch.testing.assert_close(grads[key], g, rtol=1e-5, atol=1e-7, msg=key)
    if not adapter:  # the shared modulation enters every block's runner: its gradient sums theirs
        assert grads["shared_block_modulation.weight"].abs().sum() > 0
    if engines.streamer is not None:
        st = engines.streamer
        assert st.loads > st.num_slots or len(st.streamed) <= st.num_slots  # the ring really cycled
    if engines.offload is not None:
        assert engines.offload.offloaded_bytes > 0


@pytest.mark.parametrize("name", ["stream all, 2 slots", "minimal"])
@pytest.mark.parametrize("base", ["fp8", "fp8_weight"])
def test_engines_move_an_fp8_base_as_they_move_a_plain_one(name, base):
    """The fp8 bytes and their row scales stream through the ring (half a bf16 block's bytes), and the
    engines give the fp8 plain path's loss and gradients."""
    ref_losses, ref_grads, _ = run(None, True, base_precision=base)
    losses, grads, engines = run(PLANS[name], True, base_precision=base)
    for a, b in zip(losses, ref_losses, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=0)
    for key, g in ref_grads.items():
        torch.testing.assert_close(grads[key], g, rtol=1e-5, atol=1e-7, msg=key)
    lay = engines.streamer.layouts[0]
    assert any(p.dtype == torch.float8_e4m3fn for p in lay.params) and engines.streamer.loads > 2


def test_streamed_weights_live_on_the_host_between_uses():
    cfg = get_preset("tiny")
    model = random_model(cfg).requires_grad_(False)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    engines = install_memory_plan(MemoryPlan(stream_blocks=-1, stream_slots=2), model, CPU)
    st = engines.streamer
    for n, p in model.named_parameters():  # nothing changed, and before use all point at the host copies
        torch.testing.assert_close(p, before[n])
        if n.startswith("layers."):
            assert p.data.untyped_storage().data_ptr() in {
                lay.host.untyped_storage().data_ptr() for lay in st.layouts.values()
            }
    imgs, texts, sigma, seq = random_batch(cfg, [2], [(2, 2)])
    with torch.no_grad():
        model(torch.cat(imgs), torch.cat(texts), sigma, seq)
    for n, p in model.named_parameters():  # state_dict still reads the right values after the ring moved
        torch.testing.assert_close(p, before[n], msg=n)
    assert st.loads == 4 and sum(len(lay.params) for lay in st.layouts.values()) > 0


def test_full_fine_tune_streaming_needs_host_masters():
    model = random_model(get_preset("tiny"))
    with pytest.raises(ConfigError, match="OPTIMIZER_PLACEMENT"):
        install_memory_plan(MemoryPlan(stream_blocks=-1), model, CPU, full_ft=True)

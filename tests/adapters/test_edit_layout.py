"""Adapters on the edit layout ([target | text | references]): every algorithm of the registry trains
there, the references reach its gradients, and the ComfyUI export has the text-to-image key layout
(edit training adds no module: ../shared/spec/moss-image-edit-facts.md 1.3, "No new weights")."""

from __future__ import annotations

import pytest
import torch

from kohakumoss.adapters import ALGOS, adapter_param_groups, build_adapter
from kohakumoss.diffusion import flow_matching_loss, make_flow_target
from kohakumoss.export import to_comfy_adapter
from kohakumoss.model import PackedSeq, pack_references

from .helpers import CFG, flow_batch, tiny_model
from .helpers import flow_loss as t2i_loss

ARGS = {"lokr": {"factor": 8}, "dylora": {"block_size": 4}}  # as tests/adapters/test_algorithms.py
LR = {"lokr": 5e-2, "ia3": 1e-1}
TEXT_LENS, IMG_SIZES, REF_SIZES = (5, 7), ((4, 4), (3, 5)), (((4, 4), (2, 3)), ((3, 5),))


def edit_batch(seed: int = 0, references: bool = True):
    """(x_t, text, sigma, seq, refs, target): the adapters' fixed batch with clean references."""
    g = torch.Generator().manual_seed(seed)
    grids = [[torch.randn(CFG.in_channels, h, w, generator=g) for h, w in refs] for refs in REF_SIZES]
    refs, sizes = pack_references(grids)
    seq = PackedSeq.build(TEXT_LENS, IMG_SIZES, ref_sizes=sizes if references else None)
    n_img = sum(h * w for h, w in IMG_SIZES)
    x0 = torch.randn(n_img, CFG.in_channels, generator=g)
    text = torch.randn(sum(TEXT_LENS), CFG.text_dim, generator=g)
    sigma = torch.rand(2, generator=g) * 0.8 + 0.1
    ft = make_flow_target(x0, sigma, seq.img_token_sample, torch.randn(n_img, CFG.in_channels, generator=g))
    return ft.x_t, text, sigma, seq, (refs if references else None), ft.target


def edit_loss(model, batch) -> torch.Tensor:
    x_t, text, sigma, seq, refs, target = batch
    extra = {} if refs is None else {"refs": refs}
    return flow_matching_loss(model(x_t, text, sigma, seq, **extra), target, sigma, seq.img_token_sample)


def _train(model, net, loss_fn, lr: float, steps: int = 4) -> list[float]:
    opt = torch.optim.AdamW(adapter_param_groups(net, lr))
    losses = []
    for _ in range(steps):
        loss = loss_fn(model)
        opt.zero_grad()
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in net.parameters() if p.grad is not None)
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("algo", sorted(ALGOS))
def test_every_algorithm_trains_on_the_edit_layout(monkeypatch, algo):
    monkeypatch.setattr("lycoris.modules.tlora.gc.collect", lambda *a: 0)  # seconds per module otherwise
    batch = edit_batch()
    model = tiny_model()
    net = build_adapter(model, algo, rank=8, alpha=4, preset="attn", **ARGS.get(algo, {}))
    losses = _train(model, net, lambda m: edit_loss(m, batch), LR.get(algo, 1e-2))
    assert losses[-1] < losses[0] * 0.995, losses


def test_the_references_reach_the_adapters_gradients():
    model = tiny_model()
    net = build_adapter(model, "lora", rank=4, alpha=4, preset="attn")
    with torch.no_grad():  # non-zero ups, so every LoRA factor gets a gradient
        for p in net.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.02)
    grads = []
    for references in (True, False):
        net.zero_grad()
        edit_loss(model, edit_batch(references=references)).backward()
        grads.append(torch.cat([p.grad.flatten() for p in net.parameters()]))
    assert (grads[0] - grads[1]).norm() > 1e-3 * grads[1].norm()


@pytest.mark.parametrize("algo", ["lora", "loha", "lokr"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "published"])
def test_comfy_export_of_an_edit_adapter_has_the_text_to_image_layout(monkeypatch, algo, fused):
    exports = []
    for loss_fn in (lambda m: edit_loss(m, edit_batch()), lambda m: t2i_loss(m, flow_batch())):
        model = tiny_model()
        net = build_adapter(model, algo, rank=8, alpha=4, preset="attn-mlp", **ARGS.get(algo, {}))
        _train(model, net, loss_fn, LR.get(algo, 1e-2), steps=2)
        exports.append(to_comfy_adapter(model, net, fused=fused))
    edit, t2i = exports
    assert {k: v.shape for k, v in edit.tensors.items()} == {k: v.shape for k, v in t2i.tensors.items()}
    assert edit.formats == t2i.formats
    assert any(not torch.equal(edit.tensors[k], t2i.tensors[k]) for k in edit.tensors)  # trained apart

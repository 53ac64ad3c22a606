"""Masked loss and dataset loss weights: from the host batch to the loss, eager and CUDA-graphed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kohakumoss.diffusion import flow_matching_loss
from kohakumoss.model import PackedSeq
from kohakumoss.train.step import DeviceBatch, flow_loss, host_ready, ready_to_device
from kohakumoss_data.batch import HostBatch

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _parts(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    seq = PackedSeq.build([3, 2], [(2, 2), (1, 3)])
    pred, target = torch.randn(7, 8, generator=g), torch.randn(7, 8, generator=g)
    return pred, target, torch.rand(2, generator=g), seq


@pytest.mark.parametrize("reduction", ["token", "sample"])
def test_a_weight_scales_each_tokens_error_before_the_mean(reduction):
    pred, target, sigma, seq = _parts()
    ts = seq.img_token_sample
    plain = flow_matching_loss(pred, target, sigma, ts, "min_snr", reduction)
    ones = flow_matching_loss(pred, target, sigma, ts, "min_snr", reduction, weight=torch.ones(7))
    assert torch.equal(plain, ones)
    weight = torch.tensor([1.0, 0.0, 0.5, 1.0, 2.0, 0.0, 1.0])
    got = flow_matching_loss(pred, target, sigma, ts, "min_snr", reduction, weight=weight)
    # the same loss with the masked tokens' error made zero and the others' scaled
    scaled = target + (pred - target) * weight.sqrt()[:, None]
    assert torch.allclose(got, flow_matching_loss(scaled, target, sigma, ts, "min_snr", reduction))


def test_masked_tokens_give_no_gradient_through_the_step_path():
    """HostBatch masks and loss weights -> host_ready -> DeviceBatch.weight -> flow_loss."""
    sizes = [(32, 32), (48, 16)]  # image token grids 2x2 and 1x3
    masks = [torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([[0.0, 1.0, 1.0]])]
    host = HostBatch(
        0,
        ["a", "b"],
        ["", ""],
        sizes,
        latents=[torch.randn(32, h // 8, w // 8) for w, h in sizes],
        text_hidden=torch.randn(5, 16),
        text_lengths=torch.tensor([3, 2]),
        masks=masks,
        loss_weights=[1.0, 0.5],
    )
    batch = ready_to_device(host_ready(host, torch.float32), torch.device("cpu"))
    expected = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.5, 0.5])
    assert torch.equal(batch.weight, expected)
    scale = torch.ones(7, 128, requires_grad=True)

    def model(x_t, text, sigma, seq):  # token-wise: a token's prediction depends on that token only
        return x_t * scale

    loss = flow_loss(model, batch, torch.tensor([0.3, 0.7]), torch.randn(7, 128), torch.float32)
    loss.backward()
    touched = scale.grad.abs().sum(dim=1) > 0
    assert torch.equal(touched, expected > 0)


@pytest.mark.gpu
@cuda
def test_graphed_steps_copy_each_batchs_weights():
    """The weight is a static input of the captured graph: replays with other weights match eager."""
    from kohakumoss.train.graphs import StepGraphs

    gpu = torch.device("cuda")
    scale = torch.nn.Parameter(torch.ones(7, 16, device=gpu))

    def loss_fn(b, s, n):
        return flow_loss(lambda x, t, sg, sq: x * scale, b, s, n, torch.float32)

    graphs = StepGraphs(loss_fn, [scale])
    seq = PackedSeq.build([3, 2], [(2, 2), (1, 3)], gpu)
    for i in range(4):
        g = torch.Generator(device=gpu).manual_seed(i)
        x0 = torch.randn(7, 16, device=gpu, generator=g)
        weight = (torch.rand(7, device=gpu, generator=g) > 0.5).float()
        batch = DeviceBatch(x0, torch.randn(5, 8, device=gpu, generator=g), seq, weight)
        sigma, noise = torch.rand(2, device=gpu, generator=g), torch.randn(7, 16, device=gpu, generator=g)
        eager = graphs._eager(batch, sigma, noise).item()
        eager_grad = scale.grad.clone()
        scale.grad = None
        graphed = graphs.run(batch, sigma, noise).item()
        assert abs(graphed - eager) <= 1e-6 * max(1.0, abs(eager)), (i, graphed, eager)
        torch.testing.assert_close(scale.grad, eager_grad)
        scale.grad.zero_()
    assert graphs.failed is None and graphs.replays >= 2


def test_a_run_with_a_masked_dataset_and_reg_images(train_world, tmp_path, monkeypatch):
    """End to end on the CPU: two datasets, one masked by its alpha channel, one as weighted reg images."""
    import json

    from PIL import Image

    from kohakumoss.train.loop import train

    from .conftest import tiny_knobs

    cut = tmp_path / "cut" / "1_cut"
    cut.mkdir(parents=True)
    for png in sorted((Path(train_world["DATASET"]["path"]) / "2_style").glob("*.png")):
        rgba = Image.open(png).convert("RGBA")
        rgba.putalpha(Image.linear_gradient("L").resize(rgba.size))  # top transparent, bottom solid
        rgba.save(cut / png.name)
        (cut / png.with_suffix(".txt").name).write_text(png.with_suffix(".txt").read_text())
    dataset = [
        {"kind": "kohya", "path": str(tmp_path / "cut"), "mask": "alpha"},
        {**train_world["DATASET"], "reg": True, "loss_weight": 0.5},
    ]
    from kohakumoss.train import step

    seen = []

    def spy(*args, weight=None, **kwargs):
        seen.append(None if weight is None else sorted({round(float(w), 2) for w in weight}))
        return flow_matching_loss(*args, weight=weight, **kwargs)

    monkeypatch.setattr(step, "flow_matching_loss", spy)
    run = train(tiny_knobs({**train_world, "DATASET": dataset}, "masked", STEPS=3))
    values = {v for s in seen if s for v in s}
    assert seen and None not in seen  # every step is weighted (masked or reg images in each)
    assert 0.5 in values and any(0 < v < 1 and v != 0.5 for v in values)  # reg weight, partial mask
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if "loss" in r]
    assert len(losses) == 3 and all(0 < x < 10 for x in losses)

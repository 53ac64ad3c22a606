"""The training step with reference images: the batch's references reach the model packed after the
text, clean; the loss covers the target tokens alone; the CUDA graphs' static inputs carry them."""

from __future__ import annotations

import torch

from kohakumoss.encoders.latents import patchify
from kohakumoss.train.graphs import _optional, _static_batch, batch_signature
from kohakumoss.train.step import flow_loss, host_ready, ready_to_device
from kohakumoss_data.batch import HostBatch

from ..adapters.helpers import tiny_model


def host_batch(references: bool = True, seed: int = 0) -> HostBatch:
    g = torch.Generator().manual_seed(seed)
    latents = [torch.randn(32, 8, 6, generator=g), torch.randn(32, 4, 4, generator=g)]
    batch = HostBatch(1, ["a", "b"], ["x", "y"], [(48, 64), (32, 32)], latents=latents)
    batch.text_hidden, batch.text_lengths = torch.randn(9, 32, generator=g), torch.tensor([4, 5])
    if references:  # sample 0: two references of other sizes; sample 1: one
        batch.references = [
            [torch.randn(32, 6, 8, generator=g), torch.randn(32, 4, 2, generator=g)],
            [torch.randn(32, 4, 4, generator=g)],
        ]
    return batch


def test_references_reach_the_device_batch_packed_in_order():
    batch = host_batch()
    device = ready_to_device(host_ready(batch, torch.float32, pad_to=8), torch.device("cpu"))
    assert device.seq.ref_sizes == (((3, 4), (2, 1)), ((2, 2),))
    expected = torch.cat([patchify(r) for refs in batch.references for r in refs])
    assert torch.equal(device.refs, expected)
    assert device.x0.shape[0] == 12 + 4 and device.seq.text_pad == 7  # the targets alone in x0
    plain = ready_to_device(host_ready(host_batch(references=False), torch.float32), torch.device("cpu"))
    assert plain.refs is None and not plain.seq.has_references


def test_the_loss_covers_the_target_tokens_alone():
    model = tiny_model()
    device = ready_to_device(host_ready(host_batch(), torch.float32), torch.device("cpu"))
    sigma, noise = (
        torch.tensor([0.3, 0.7]),
        torch.randn(device.x0.shape, generator=torch.Generator().manual_seed(1)),
    )
    outputs = []
    hook = model.register_forward_hook(lambda m, args, out: outputs.append(out))
    loss = flow_loss(model, device, sigma, noise, torch.float32)
    hook.remove()
    (pred,) = outputs
    assert pred.shape == device.x0.shape  # one prediction per target token, none for a reference token
    s = sigma[device.seq.img_token_sample][:, None]
    target = noise - device.x0  # the velocity of the target's own noising: references are never noised
    x_t = (1 - s) * device.x0 + s * noise
    with torch.no_grad():
        again = model(x_t, device.text, sigma, device.seq, refs=device.refs)
    torch.testing.assert_close(loss, ((again - target) ** 2).mean())
    # the references condition the prediction (they enter the sequence) but are not predicted
    device.refs = device.refs + 1.0
    assert not torch.allclose(flow_loss(model, device, sigma, noise, torch.float32), loss)


def test_graph_inputs_carry_the_references():
    with_refs = ready_to_device(host_ready(host_batch(), torch.float32), torch.device("cpu"))
    plain = ready_to_device(host_ready(host_batch(references=False), torch.float32), torch.device("cpu"))
    sigma, noise = torch.zeros(2), torch.zeros_like(with_refs.x0)
    assert batch_signature(with_refs, sigma, noise) != batch_signature(plain, sigma, noise)
    inputs = (with_refs.x0, with_refs.text, sigma, noise, *_optional(with_refs))
    copies = tuple(t.clone() for t in inputs)
    static = _static_batch(with_refs, copies)
    assert static.refs is copies[4] and static.weight is None and static.seq is with_refs.seq
    assert _optional(plain) == ()

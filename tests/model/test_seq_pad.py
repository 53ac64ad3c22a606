"""The text pad segment (`PackedSeq.build(pad_to=...)`): same shapes for other captions, same outputs."""

from __future__ import annotations

import pytest
import torch

from kohakumoss.model import PackedSeq, get_preset
from kohakumoss_kernels import OpSet

from .helpers import random_batch, random_model


def test_pad_makes_the_text_a_multiple_and_keeps_the_real_layout():
    plain = PackedSeq.build([5, 3], [(4, 4), (2, 6)])
    padded = PackedSeq.build([5, 3], [(4, 4), (2, 6)], pad_to=16)
    assert padded.text_pad == 8 and (8 + padded.text_pad) % 16 == 0
    assert padded.text_lens == plain.text_lens and padded.total_tokens == plain.total_tokens
    assert padded.cu_seqlens.tolist() == [*plain.cu_seqlens.tolist(), plain.total_tokens + 8]
    assert padded.text_cu_seqlens.tolist() == [0, 5, 8, 16]
    assert padded.max_seqlen == 32 and padded.text_max_seqlen == 16  # bounds rounded up to 16
    n = plain.total_tokens
    assert torch.equal(padded.img_index, plain.img_index) and torch.equal(
        padded.text_index[:8], plain.text_index
    )
    assert padded.text_index[8:].tolist() == list(range(n, n + 8))
    assert torch.equal(padded.img_token_sample, plain.img_token_sample)
    # an exact multiple still gets a pad token: every padded batch has the pad segment, so one shape
    assert PackedSeq.build([8, 8], [(2, 2), (2, 3)], pad_to=16).text_pad == 16


def test_one_image_size_gets_equal_slots():
    """[image, text, pad] per sample, every slot `stride` tokens; the pad rows of the text come last."""
    seq = PackedSeq.build([3, 5], [(2, 2), (2, 2)], pad_to=16)  # text rounded to 16 / 2 = 8 per slot
    assert seq.slots == (12, 4) and seq.max_seqlen == 12 and seq.text_pad == 8
    assert seq.cu_seqlens.tolist() == [0, 7, 12, 21, 24]  # sample 0, its pad, sample 1, its pad
    assert seq.text_cu_seqlens.tolist() == [0, 3, 8, 13, 16]  # the refiner's: texts, then each pad
    assert seq.img_index.tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert seq.text_index.tolist() == [4, 5, 6, 16, 17, 18, 19, 20, 7, 8, 9, 10, 11, 21, 22, 23]
    assert seq.token_sample.tolist() == [0] * 12 + [1] * 12
    assert seq.total_tokens == 8 + 8  # the real ones
    full = PackedSeq.build([8, 2], [(2, 2), (2, 2)], pad_to=16)  # a caption filling its slot
    assert full.cu_seqlens.tolist() == [0, 12, 12, 18, 24] and full.text_pad == 6


def test_other_captions_pad_to_the_same_shapes():
    a = PackedSeq.build([5, 3], [(4, 4), (2, 6)], pad_to=16)
    b = PackedSeq.build([1, 12], [(4, 4), (2, 6)], pad_to=16)
    assert [t.shape for t in a.tensors()] == [t.shape for t in b.tensors()]
    assert (a.max_seqlen, a.text_max_seqlen) == (b.max_seqlen, b.text_max_seqlen)
    assert a.text_lens != b.text_lens


@pytest.mark.parametrize(
    "text_lens, img_sizes", [([5, 3], [(4, 4), (2, 6)]), ([7], [(3, 5)]), ([5, 3, 8], [(2, 3)] * 3)]
)
def test_padded_forward_equals_the_unpadded_one(text_lens, img_sizes):
    """Pad tokens attend among themselves: the image tokens' velocity is the unpadded batch's."""
    cfg = get_preset("tiny")
    model = random_model(cfg)
    model.ops = OpSet("eager")
    imgs, texts, sigma, seq = random_batch(cfg, text_lens, img_sizes)
    padded = PackedSeq.build(text_lens, img_sizes, pad_to=16)
    text = torch.cat(texts)
    padded_text = torch.cat([text, torch.randn(padded.text_pad, cfg.text_dim)])  # any pad values
    with torch.no_grad():
        ref = model(torch.cat(imgs), text, sigma, seq)
        out = model(torch.cat(imgs), padded_text, sigma, padded)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("sizes", [[(4, 4), (2, 6)], [(4, 4), (4, 4)]], ids=["one_pad_segment", "slots"])
def test_pad_tokens_get_no_gradient_into_the_weights(sizes):
    """Their outputs reach no loss: the weights' gradients equal the unpadded batch's."""
    cfg = get_preset("tiny")
    grads = []
    for pad_to in (0, 16):
        model = random_model(cfg)
        model.ops = OpSet("eager")
        imgs, texts, sigma, _ = random_batch(cfg, [5, 3], sizes)
        seq = PackedSeq.build([5, 3], sizes, pad_to=pad_to)
        assert (seq.slots is not None) == (pad_to > 0 and sizes[0] == sizes[1])
        text = torch.cat([torch.cat(texts), torch.ones(seq.text_pad, cfg.text_dim)])
        model(torch.cat(imgs), text, sigma, seq).square().mean().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-7)


def test_the_model_runs_sdpa_slots_on_slotted_batches(monkeypatch):
    """OpSet 'sdpa_slots,eager': the joint attention takes sdpa_slots, the text refiner's (no slots) the
    reference; outputs and weight gradients equal the reference model's."""
    from kohakumoss_kernels.ops.varlen_attention import sdpa_slots

    calls = []
    (img_fwd, img_bwd), rest = sdpa_slots.KERNELS["cpu"]
    monkeypatch.setitem(
        sdpa_slots.KERNELS, "cpu", ((lambda *a: calls.append(1) or img_fwd(*a), img_bwd), rest)
    )
    cfg = get_preset("tiny")
    text_lens, sizes = [5, 3, 7], [(2, 3)] * 3
    imgs, texts, sigma, _ = random_batch(cfg, text_lens, sizes)
    seq = PackedSeq.build(text_lens, sizes, pad_to=16)
    text = torch.cat([torch.cat(texts), torch.zeros(seq.text_pad, cfg.text_dim)])
    results = []
    for backend in ("eager", "sdpa_slots,eager"):
        model = random_model(cfg)
        model.ops = OpSet(backend, tune="off")
        out = model(torch.cat(imgs), text, sigma, seq)
        out.square().mean().backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        results.append((out.detach(), grads))
    assert len(calls) == cfg.depth
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(results[1][1], results[0][1], rtol=1e-4, atol=1e-6)

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
    # an exact multiple gets an empty pad segment: every padded batch has the segment, so one shape, and
    # captions that fill the multiple (the step benchmark's 256 tokens) pay no pad token
    exact = PackedSeq.build([8, 8], [(2, 2), (2, 2)], pad_to=16)
    assert exact.text_pad == 0 and exact.cu_seqlens.tolist() == [0, 12, 24, 24]
    assert exact.text_cu_seqlens.tolist() == [0, 8, 16, 16] and exact.text_index.numel() == 16
    other = PackedSeq.build([5, 3], [(2, 2), (2, 2)], pad_to=16)  # 8 pad tokens
    assert [t.shape for t in exact.tensors()] == [t.shape for t in other.tensors()]


def test_other_captions_pad_to_the_same_shapes():
    a = PackedSeq.build([5, 3], [(4, 4), (2, 6)], pad_to=16)
    b = PackedSeq.build([1, 12], [(4, 4), (2, 6)], pad_to=16)
    assert [t.shape for t in a.tensors()] == [t.shape for t in b.tensors()]
    assert (a.max_seqlen, a.text_max_seqlen) == (b.max_seqlen, b.text_max_seqlen)
    assert a.text_lens != b.text_lens


# the last: the text an exact multiple, so an empty pad segment
@pytest.mark.parametrize(
    "text_lens, img_sizes", [([5, 3], [(4, 4), (2, 6)]), ([7], [(3, 5)]), ([8, 8], [(2, 2), (2, 3)])]
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


def test_pad_tokens_get_no_gradient_into_the_weights():
    """Their outputs reach no loss: the weights' gradients equal the unpadded batch's."""
    cfg = get_preset("tiny")
    grads = []
    for pad_to in (0, 16):
        model = random_model(cfg)
        model.ops = OpSet("eager")
        imgs, texts, sigma, _ = random_batch(cfg, [5, 3], [(4, 4), (2, 6)])
        seq = PackedSeq.build([5, 3], [(4, 4), (2, 6)], pad_to=pad_to)
        text = torch.cat([torch.cat(texts), torch.ones(seq.text_pad, cfg.text_dim)])
        model(torch.cat(imgs), text, sigma, seq).square().mean().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-7)

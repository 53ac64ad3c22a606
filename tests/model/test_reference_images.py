"""Reference images (edit training) on the packed path against the padded reference forward:
[target | text | references], r = 1..M, t = 0 modulation, reference queries see references alone
(../shared/spec/moss-image-edit-facts.md 1.3)."""

from __future__ import annotations

import pytest
import torch

from kohakumoss.model import PackedSeq, get_preset, pack_references
from kohakumoss.model.reference import reference_forward

from .helpers import random_model
from .test_parity import rel_err

TEXT_LENS = [3, 7, 5]
IMG_SIZES = [(3, 5), (2, 2), (4, 3)]
# two references of other sizes, one, none (a text-to-image sample in an edit batch)
REF_SIZES = [[(2, 3), (4, 4)], [(3, 2)], []]


def edit_batch(cfg, seed: int = 0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    texts = [torch.randn(n, cfg.text_dim, generator=g, dtype=dtype) for n in TEXT_LENS]
    imgs = [torch.randn(h * w, cfg.in_channels, generator=g, dtype=dtype) for h, w in IMG_SIZES]
    grids = [[torch.randn(cfg.in_channels, h, w, generator=g, dtype=dtype) for h, w in s] for s in REF_SIZES]
    sigma = torch.rand(len(TEXT_LENS), generator=g, dtype=dtype)
    return imgs, texts, grids, sigma


def per_sample_refs(grids):
    return [[r.flatten(1).t() for r in refs] for refs in grids]


def packed(model, imgs, texts, grids, sigma, pad_to: int = 0, **kw):
    refs, sizes = pack_references(grids)
    seq = PackedSeq.build(TEXT_LENS, IMG_SIZES, pad_to=pad_to, ref_sizes=sizes)
    text = torch.cat(texts)
    if seq.text_pad:
        text = torch.cat([text, text.new_zeros(seq.text_pad, text.shape[1])])
    return model(torch.cat(imgs), text, sigma, seq, refs=refs, **kw), seq


def test_layout_positions_and_modulation_rows():
    seq = PackedSeq.build(TEXT_LENS, IMG_SIZES, ref_sizes=REF_SIZES)
    assert seq.ref_lens == (22, 6, 0) and seq.seq_lens == (40, 17, 17)
    pos = seq.positions[seq.ref_index]
    # sample 0: reference 1 (2 x 3) then reference 2 (4 x 4), f = its text length, h / w centred
    assert pos[:6, 0].eq(1).all() and pos[6:22, 0].eq(2).all() and pos[:22, 1].eq(3).all()
    assert pos[:6, 2].tolist() == [-0.5] * 3 + [0.5] * 3 and pos[:3, 3].tolist() == [-1.0, 0.0, 1.0]
    assert pos[6:22, 2].unique().tolist() == [-1.5, -0.5, 0.5, 1.5]
    assert pos[22:, 0].eq(1).all() and pos[22:, 1].eq(7).all()
    assert seq.positions[seq.img_index][:, 0].eq(0).all()  # target and text keep r = 0
    assert seq.token_sample[seq.ref_index].eq(3).all()  # row B: the t = 0 modulation
    assert seq.token_sample[seq.img_index].lt(3).all() and seq.token_sample[seq.text_index].lt(3).all()
    # no reference anywhere is the text-to-image layout, field for field
    plain, empty = (
        PackedSeq.build(TEXT_LENS, IMG_SIZES),
        PackedSeq.build(TEXT_LENS, IMG_SIZES, ref_sizes=[[]] * 3),
    )
    assert not empty.has_references and empty.ref_sizes == ()
    for a, b in zip(plain.tensors(), empty.tensors(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("pad_to", [0, 16])
def test_packed_equals_padded_reference_with_references(pad_to):
    cfg = get_preset("tiny")
    model = random_model(cfg)
    imgs, texts, grids, sigma = edit_batch(cfg)
    with torch.no_grad():
        out, seq = packed(model, imgs, texts, grids, sigma, pad_to)
    ref = reference_forward(
        random_model(cfg).double(),
        [i.double() for i in imgs],
        [t.double() for t in texts],
        IMG_SIZES,
        sigma.double(),
        refs=[[r.double() for r in rs] for rs in per_sample_refs(grids)],
        ref_sizes=REF_SIZES,
    )
    errors = [rel_err(p, r) for p, r in zip(torch.split(out, list(seq.img_lens)), ref)]
    assert max(errors) <= 1e-5, errors
    # the references matter: without them (or with other ones) sample 0's output moves
    plain = reference_forward(
        random_model(cfg).double(), [i.double() for i in imgs], [t.double() for t in texts], IMG_SIZES,
        sigma.double(),
    )  # fmt: skip
    assert rel_err(plain[0], ref[0]) > 1e-3 and rel_err(plain[2], ref[2]) < 1e-12


def test_packed_equals_padded_reference_gradients():
    cfg = get_preset("tiny")
    model, ref_model = random_model(cfg).double(), random_model(cfg).double()
    imgs, texts, grids, sigma = edit_batch(cfg, seed=1, dtype=torch.float64)
    g = torch.Generator().manual_seed(5)
    weights = [torch.randn(i.shape, generator=g, dtype=torch.float64) for i in imgs]

    leaves = [t.clone().requires_grad_(True) for t in (*imgs, *texts, *[r for rs in grids for r in rs])]
    p_imgs, p_texts, rest = leaves[:3], leaves[3:6], leaves[6:]
    p_grids = [rest[:2], rest[2:3], []]
    out, seq = packed(model, p_imgs, p_texts, p_grids, sigma)
    sum((o * w).sum() for o, w in zip(torch.split(out, list(seq.img_lens)), weights)).backward()

    r_leaves = [t.clone().requires_grad_(True) for t in (*imgs, *texts, *[r for rs in grids for r in rs])]
    r_refs = [[r.flatten(1).t() for r in r_leaves[6:8]], [r_leaves[8].flatten(1).t()], []]
    outs = reference_forward(
        ref_model, r_leaves[:3], r_leaves[3:6], IMG_SIZES, sigma, refs=r_refs, ref_sizes=REF_SIZES, grad=True
    )
    sum((o * w).sum() for o, w in zip(outs, weights)).backward()

    for i, (a, b) in enumerate(zip(leaves, r_leaves)):
        assert rel_err(a.grad, b.grad) <= 1e-5, i  # the packed path rounds rope and scales in float32
    assert leaves[6].grad.abs().sum() > 0  # the references receive a gradient (they condition the target)
    params = dict(ref_model.named_parameters())
    for name, p in model.named_parameters():
        if p.grad is None:
            assert params[name].grad is None or params[name].grad.abs().max() == 0, name
            continue
        assert rel_err(p.grad, params[name].grad) <= 1e-5, name


def _reference_states(model, imgs, texts, grids, sigma):
    """The residual stream of the reference tokens after the last block."""
    states = {}

    def keep(module, args, output):
        states["x"] = output

    handle = model.layers[-1].register_forward_hook(keep)
    with torch.no_grad():
        _, seq = packed(model, imgs, texts, grids, sigma)
    handle.remove()
    return states["x"][seq.ref_index]


def test_reference_queries_see_references_alone_at_t0():
    cfg = get_preset("tiny")
    model = random_model(cfg)
    imgs, texts, grids, sigma = edit_batch(cfg)
    base = _reference_states(model, imgs, texts, grids, sigma)
    other_target = [i + 1.0 for i in imgs]
    other_text = [t * 2.0 for t in texts]  # same lengths: f = text length stays
    for changed in (
        _reference_states(model, other_target, texts, grids, sigma),
        _reference_states(model, imgs, other_text, grids, sigma),
        _reference_states(
            model, imgs, texts, grids, torch.rand(3, generator=torch.Generator().manual_seed(9))
        ),
    ):
        torch.testing.assert_close(changed, base, atol=1e-6, rtol=1e-6)
    # a reference does see the sample's other references, and nothing of another sample
    grids2 = [[grids[0][0] + 1.0, grids[0][1]], grids[1], grids[2]]
    moved = _reference_states(model, imgs, texts, grids2, sigma)
    assert not torch.allclose(moved[6:22], base[6:22])
    torch.testing.assert_close(moved[22:], base[22:], atol=1e-6, rtol=1e-6)


def test_keep_lead_with_references():
    """The sampler's conditional branch packed before its skip-layer-guided unconditional one."""
    cfg = get_preset("tiny")
    model = random_model(cfg)
    imgs, texts, grids, sigma = edit_batch(cfg)
    refs, sizes = pack_references(grids[:1] * 2)
    lead = PackedSeq.build(TEXT_LENS[:1], IMG_SIZES[:1], ref_sizes=sizes[:1])
    both = PackedSeq.build(TEXT_LENS[:1] * 2, IMG_SIZES[:1] * 2, ref_sizes=sizes)
    img, text = torch.cat([imgs[0]] * 2), torch.cat([texts[0]] * 2)
    with torch.no_grad():
        out = model(img, text, sigma[:1].repeat(2), both, skip_layers={1}, keep_lead=lead, refs=refs)
        full = model(imgs[0], texts[0], sigma[:1], lead, refs=refs[: lead.ref_tokens])
        skipped = model(imgs[0], texts[0], sigma[:1], lead, skip_layers={1}, refs=refs[: lead.ref_tokens])
    n = imgs[0].shape[0]
    torch.testing.assert_close(out[:n], full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[n:], skipped, atol=1e-5, rtol=1e-5)


def test_refs_must_match_the_layout():
    cfg = get_preset("tiny")
    model = random_model(cfg)
    imgs, texts, grids, sigma = edit_batch(cfg)
    refs, sizes = pack_references(grids)
    seq = PackedSeq.build(TEXT_LENS, IMG_SIZES, ref_sizes=sizes)
    with pytest.raises(ValueError, match="no refs"):
        model(torch.cat(imgs), torch.cat(texts), sigma, seq)
    with pytest.raises(ValueError, match="ref_sizes"):
        model(torch.cat(imgs), torch.cat(texts), sigma, seq, refs=refs[:-1])

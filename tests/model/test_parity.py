"""Packed forward vs the padded reference forward, per sample (DESIGN.md section 4)."""

from __future__ import annotations

import torch

from kohakumoss.model import get_preset
from kohakumoss.model.reference import reference_forward

from .helpers import random_batch, random_model

# mixed sizes: non-square grids, a 1-token caption, a 1-token image, a long caption
TEXT_LENS = [1, 7, 300, 33]
IMG_SIZES = [(3, 5), (1, 1), (6, 4), (8, 8)]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def packed_vs_reference(cfg, dtype=torch.float32, seed=0, skip_layers=()):
    model = random_model(cfg, seed).to(dtype)
    imgs, texts, sigma, seq = random_batch(cfg, TEXT_LENS, IMG_SIZES, seed, dtype)
    with torch.no_grad():
        packed = model(torch.cat(imgs), torch.cat(texts), sigma, seq, skip_layers=skip_layers)
    ref_model = random_model(cfg, seed).double()
    ref = reference_forward(
        ref_model,
        [i.double() for i in imgs],
        [t.double() for t in texts],
        IMG_SIZES,
        sigma.double(),
        skip_layers=skip_layers,
    )
    splits = torch.split(packed, list(seq.img_lens))
    return [rel_err(p, r) for p, r in zip(splits, ref)]


def test_parity_packed_vs_padded_reference_fp32():
    cfg = get_preset("tiny")
    errors = packed_vs_reference(cfg)
    assert len(errors) == len(TEXT_LENS)
    assert max(errors) <= 1e-5, errors


def test_parity_with_skipped_layers_and_skipping_changes_the_output():
    cfg = get_preset("tiny")
    assert max(packed_vs_reference(cfg, skip_layers={1, 2})) <= 1e-5
    model = random_model(cfg)
    imgs, texts, sigma, seq = random_batch(cfg, TEXT_LENS, IMG_SIZES)
    with torch.no_grad():
        full = model(torch.cat(imgs), torch.cat(texts), sigma, seq)
        skipped = model(torch.cat(imgs), torch.cat(texts), sigma, seq, skip_layers={2})
    assert rel_err(skipped, full) > 1e-3


def test_parity_reference_in_fp32_matches_fp64():
    cfg = get_preset("tiny")
    model = random_model(cfg)
    imgs, texts, sigma, _ = random_batch(cfg, TEXT_LENS, IMG_SIZES)
    ref32 = reference_forward(model, imgs, texts, IMG_SIZES, sigma)
    ref64 = reference_forward(
        random_model(cfg).double(),
        [i.double() for i in imgs],
        [t.double() for t in texts],
        IMG_SIZES,
        sigma.double(),
    )
    assert max(rel_err(a, b) for a, b in zip(ref32, ref64)) <= 1e-5


def test_parity_samples_do_not_see_each_other():
    cfg = get_preset("tiny")
    model = random_model(cfg)
    imgs, texts, sigma, seq = random_batch(cfg, TEXT_LENS, IMG_SIZES)
    with torch.no_grad():
        full = torch.split(model(torch.cat(imgs), torch.cat(texts), sigma, seq), list(seq.img_lens))
        texts[0] = texts[0] + 1.0  # change sample 0 only
        changed = torch.split(model(torch.cat(imgs), torch.cat(texts), sigma, seq), list(seq.img_lens))
    assert not torch.allclose(full[0], changed[0])
    for b in range(1, len(TEXT_LENS)):
        assert torch.equal(full[b], changed[b])


def test_parity_bf16_error_against_fp32_reference(record_property):
    """bf16 packed forward vs the fp64 reference: reported, and bounded loosely."""
    errors = packed_vs_reference(get_preset("tiny"), dtype=torch.bfloat16)
    record_property("bf16_rel_err_max", max(errors))
    print(f"bf16 packed vs fp64 reference, rel err per sample: {[f'{e:.2e}' for e in errors]}")
    assert max(errors) < 5e-2

"""The model's FLOP count (memory/flops.py): the formula written out for moss-image-5b, and the
multiply-adds per token are the model's linears' (each weight read once per token)."""

from __future__ import annotations

import pytest
import torch

from kohakumoss.memory.flops import block_macs, refiner_macs, step_flops
from kohakumoss.model import MossBackbone, get_preset

MOSS = get_preset("moss-image-5b")


def test_macs_per_token_are_the_linears_weights():
    with torch.device("meta"):
        model = MossBackbone(MOSS)
    block = model.layers[0]
    assert block_macs(MOSS) == sum(m.weight.numel() for m in block.proj.values())
    refiner = model.text_embedder.blocks[0]
    linears = [m for m in refiner.modules() if isinstance(m, torch.nn.Linear)]
    assert refiner_macs(MOSS) == sum(m.weight.numel() for m in linears) == block_macs(MOSS)


def test_step_flops_of_the_5b_preset():
    d, h, c, L, R = 3072, 8192, 128, 42, 2
    img, txt = [4096, 4096], [256, 256]
    block = 4 * d * d + 3 * d * h  # 113,246,208
    assert block_macs(MOSS) == block == 113_246_208

    def expect(full: bool, outside: bool) -> float:
        grad = 2 if full else 1  # backward passes of a linear with an input gradient
        emb = 1 if full else 0  # of an embedder (weight gradient only)
        out_grad, out_emb = (grad, emb) if outside else (0, 0)
        f = 2 * L * block * 8704 * (1 + grad) + (4 + 10) * L * d * 2 * 4352**2
        f += 2 * d * c * 8192 * (1 + grad) + 2 * c * d * 8192 * (1 + emb)  # head, video_embedder
        f += 2 * R * block * 512 * (1 + out_grad) + (4 + (10 if outside else 0)) * R * d * 2 * 256**2
        f += 2 * 4096 * d * 512 * (1 + out_emb)  # text_embedder.proj
        f += 2 * 2 * 256 * d * (1 + out_emb) + 2 * 2 * 9 * d * d * (1 + out_grad)  # time, modulations
        return f

    for full, outside in ((False, False), (False, True), (True, True)):
        assert step_flops(MOSS, img, txt, full, outside) == pytest.approx(expect(full, outside), rel=1e-12)
    assert step_flops(MOSS, img, txt, True, False) == step_flops(MOSS, img, txt, True, True)  # all trains
    # the blocks dominate: the refiner, embedders and modulations are ~1% of a 2 x 1 MP step
    blocks_only = 2 * L * block * 8704 * 2 + 14 * L * d * 2 * 4352**2
    assert blocks_only < step_flops(MOSS, img, txt, False, True) < 1.02 * blocks_only


def test_step_flops_with_reference_images():
    """An edit step: the blocks and video_embedder see the reference tokens too; their queries score
    the references alone, the target and text queries the whole sample; the head reads the target only."""
    d, c, L = 3072, 128, 42
    img, txt, refs = [4096, 4096], [256, 256], [4096, 1024]
    plain = step_flops(MOSS, img, txt, False, False)
    assert step_flops(MOSS, img, txt, False, False, ref_lens=[0, 0]) == plain
    block = block_macs(MOSS)
    extra = 2 * L * block * sum(refs) * 2  # forward and input gradient
    extra += (4 + 10) * L * d * sum(4352 * r + r * r for r in refs)  # scores added by the references
    extra += 2 * c * d * sum(refs)  # video_embedder, forward only (no gradient into the data)
    assert step_flops(MOSS, img, txt, False, False, ref_lens=refs) == pytest.approx(plain + extra, rel=1e-12)

"""Sampling with reference images on the tiny backbone: the reference K/V cache (each kind of step's
first forward records the references' keys and values, the others run the live tokens alone) gives
the uncached sampler's latents, with batched CFG or not, across a skip-layer window; the references
change the result; a live-only forward with the cache equals the full forward."""

from __future__ import annotations

import pytest
import torch

from kohakumoss.diffusion import SamplerConfig, SamplerSpeed, euler_sample
from kohakumoss.model import PackedSeq, get_preset, pack_references
from kohakumoss.model.reference_kv import recording, replaying

from ..model.helpers import random_model

CFG = get_preset("tiny")
SIZES = [(2, 3), (3, 3)]
SEEDS = [11, 12]
SLG = SamplerConfig(steps=4, cfg_scale=4.0, uncond_skip_layers=(1,), slg_start=0.25, slg_stop=0.75)


def texts(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    cond = [torch.randn(5, CFG.text_dim, generator=g), torch.randn(2, CFG.text_dim, generator=g)]
    uncond = [torch.randn(1, CFG.text_dim, generator=g), torch.randn(3, CFG.text_dim, generator=g)]
    return cond, uncond


def references(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    grid = lambda h, w: torch.randn(CFG.in_channels, h, w, generator=g)  # noqa: E731
    return [[grid(2, 2), grid(3, 2)], [grid(2, 3)]]  # two references, then one


@pytest.fixture(scope="module")
def model():
    return random_model(CFG)


def sample(model, speed: SamplerSpeed, refs=None, config=SLG):
    cond, uncond = texts()
    return euler_sample(
        model, cond, uncond, SIZES, SEEDS, config, CFG.in_channels, speed=speed, references=refs
    )


@pytest.mark.parametrize("batch_cfg", [True, False])
def test_reference_cache_gives_the_uncached_latents(model, batch_cfg):
    refs = references()
    plain = sample(model, SamplerSpeed(batch_cfg=batch_cfg, cuda_graphs="off", reference_cache=False), refs)
    full_layouts = []
    forward = model.forward
    model.forward = lambda *a, **kw: full_layouts.append(a[3].has_references) or forward(*a, **kw)
    try:
        cached = sample(
            model, SamplerSpeed(batch_cfg=batch_cfg, cuda_graphs="off", reference_cache=True), refs
        )
    finally:
        del model.forward
    # steps: no skip, skip, skip, no skip: each kind's first forward runs the references, no other does
    # (unbatched: cond, uncond per step; the conditional branch never skips)
    assert full_layouts == (
        [True, True, False, False] if batch_cfg else [True, True, False, True, False, False, False, False]
    )
    for got, want in zip(cached, plain, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    without = sample(model, SamplerSpeed(batch_cfg=batch_cfg, cuda_graphs="off"))
    assert not torch.allclose(without[0], plain[0], atol=1e-4)  # the references reach the result
    unguided = SamplerConfig(steps=3, cfg_scale=1.0, uncond_skip_layers=())
    a = sample(model, SamplerSpeed(cuda_graphs="off", reference_cache=False), refs, unguided)
    b = sample(model, SamplerSpeed(cuda_graphs="off"), refs, unguided)
    torch.testing.assert_close(a[1], b[1], rtol=1e-5, atol=1e-5)


def test_live_forward_on_cached_reference_kv_equals_the_full_forward(model):
    g = torch.Generator().manual_seed(3)
    cond, _ = texts()
    tokens, sizes = pack_references(references())
    img = torch.randn(sum(h * w for h, w in SIZES), CFG.in_channels, generator=g)
    text = torch.cat(cond)
    full = PackedSeq.build([5, 2], SIZES, ref_sizes=sizes)
    with torch.no_grad():
        want = model(img, text, torch.tensor([0.7, 0.3]), full, refs=tokens)
        record = recording(full)
        first = model(img, text, torch.tensor([0.7, 0.3]), record, refs=tokens)
        live = replaying(record)
        assert not live.has_references and live.total_tokens == img.shape[0] + text.shape[0]
        other = torch.randn(img.shape, generator=g)  # another step: other noise, other sigma
        got = model(other, text, torch.tensor([0.2, 0.9]), live)
        again = model(other, text, torch.tensor([0.2, 0.9]), full, refs=tokens)
    torch.testing.assert_close(first, want)  # recording changes nothing
    torch.testing.assert_close(got, again, rtol=1e-5, atol=1e-5)
    assert record.reference_kv.nbytes > 0 and len(record.reference_kv.kv) == CFG.depth


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graphed_steps_with_cached_reference_kv_replay_the_eager_sampler(monkeypatch):
    """CUDA graphs kept: each kind's first step records the references eagerly, its second is captured
    on the live layout; the graphed run equals the eager uncached one."""
    import kohakumoss.diffusion.sampler as sampler

    made = []

    class Spy(sampler._Steps):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(sampler, "_Steps", Spy)
    device = torch.device("cuda")
    model = random_model(CFG).to(device)
    model.ops.set_timing("device")
    config = SamplerConfig(steps=8, cfg_scale=4.0, uncond_skip_layers=(1,), slg_start=0.25, slg_stop=0.75)
    cond, uncond = texts()
    refs = references()

    def run(speed):
        return euler_sample(
            model, cond, uncond, SIZES, SEEDS, config, CFG.in_channels, device, speed=speed, references=refs
        )

    graphed = run(SamplerSpeed(cuda_graphs="on"))
    assert len(made[0].captured) == 2 and made[0].replays == 8 - 4 and made[0].failed is None
    eager = run(SamplerSpeed(cuda_graphs="off", reference_cache=False))
    for got, want in zip(graphed, eager, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)

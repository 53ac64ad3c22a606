"""The released sampler: Euler on v = noise - x0, CFG in float32, skip-layer guidance on the uncond
branch (block 22, SLG window), the released pipeline's seeded noise, skip indices checked."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from kohakumoss.diffusion import SamplerConfig, euler_sample, initial_noise, released_sigmas
from kohakumoss.diffusion.sampler import SamplerSpeed, released_uncond_skip_layers
from kohakumoss.model import get_preset
from kohakumoss_common.errors import ConfigError

from ..model.helpers import random_model

C = 128
SIZES = [(2, 3), (3, 2)]
SEEDS = [11, 12]


@dataclass
class Depth:
    depth: int


class FakeBackbone:
    """Records each call; v per image token = 0.5 x + the mean of its sample's text (+0.25 where the
    skip applies: every sample, or those after keep_lead's leading ones)."""

    def __init__(self, depth: int = 42):
        self.config = Depth(depth)
        self.calls: list[tuple[int, frozenset | None, list[float], int]] = []

    def __call__(self, img, text, sigma, seq, **kw):
        skip, lead = kw.get("skip_layers"), kw.get("keep_lead")
        kept = lead.num_samples if lead is not None else 0
        self.calls.append((seq.num_samples, None if skip is None else frozenset(skip), sigma.tolist(), kept))
        means = torch.stack([t.mean() for t in torch.split(text, list(seq.text_lens))])
        skipped = (torch.arange(seq.num_samples) >= kept).float() * (0.25 if skip else 0.0)
        return 0.5 * img + (means + skipped)[seq.img_token_sample][:, None]


UNBATCHED = SamplerSpeed(batch_cfg=False)


def texts(value: float, lens=(3, 2)) -> list[torch.Tensor]:
    return [torch.full((n, 8), value) for n in lens]


def released(config: SamplerConfig, cond: float, uncond: float) -> list[torch.Tensor]:
    """The released loop written out per image, float32: uncond + g (cond - uncond), x += dt v."""
    sigmas = released_sigmas(config.steps, config.shift)
    n = len(sigmas) - 1
    out = []
    for size, seed in zip(SIZES, SEEDS):
        x = initial_noise(size, seed, C)
        for i in range(n):
            skipped = config.slg_start <= i / n < config.slg_stop and bool(config.uncond_skip_layers)
            c = 0.5 * x + cond
            u = 0.5 * x + uncond + (0.25 if skipped else 0.0)
            x = x + (sigmas[i + 1] - sigmas[i]) * (u + config.cfg_scale * (c - u))
        out.append(x)
    return out


def pattern(fake: FakeBackbone) -> list[tuple[int, frozenset | None, int]]:
    return [(n, skip, kept) for n, skip, _, kept in fake.calls]


def test_uncond_branch_skips_block_22_at_every_step_by_default():
    config = SamplerConfig(steps=4)
    assert config.uncond_skip_layers == (22,) and config.cfg_scale == 3.0 and config.shift == 5.0
    assert SamplerConfig().steps == 50
    fake = FakeBackbone()
    out = euler_sample(fake, texts(1.0), texts(-1.0), SIZES, SEEDS, config, C, speed=UNBATCHED)
    assert pattern(fake) == [(2, None, 0), (2, frozenset({22}), 0)] * 4
    sigmas = released_sigmas(4)
    assert [s for _, _, s, _ in fake.calls[::2]] == [[float(sigmas[i])] * 2 for i in range(4)]
    for got, want in zip(out, released(config, 1.0, -1.0)):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_batched_cfg_is_one_forward_per_step_the_cond_samples_keeping_the_skipped_block():
    config = SamplerConfig(steps=4)
    fake = FakeBackbone()
    out = euler_sample(fake, texts(1.0), texts(-1.0), SIZES, SEEDS, config, C)
    assert pattern(fake) == [(4, frozenset({22}), 2)] * 4
    sigmas = released_sigmas(4)
    assert [s for _, _, s, _ in fake.calls] == [[float(sigmas[i])] * 4 for i in range(4)]
    for got, want in zip(out, released(config, 1.0, -1.0)):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_slg_window_uses_start_inclusive_stop_exclusive():
    config = SamplerConfig(steps=4, cfg_scale=4.5, slg_start=0.25, slg_stop=0.75)
    fake = FakeBackbone()
    out = euler_sample(fake, texts(0.5), texts(0.0), SIZES, SEEDS, config, C, speed=UNBATCHED)
    # i/n = 0 and 0.75 are outside [0.25, 0.75): there the uncond branch runs every block
    skip = frozenset({22})
    plain, skipped = [(2, None, 0), (2, None, 0)], [(2, None, 0), (2, skip, 0)]
    assert pattern(fake) == plain + skipped + skipped + plain
    for got, want in zip(out, released(config, 0.5, 0.0)):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    fake = FakeBackbone()
    batched = euler_sample(fake, texts(0.5), texts(0.0), SIZES, SEEDS, config, C)
    assert pattern(fake) == [(4, None, 0), (4, skip, 2), (4, skip, 2), (4, None, 0)]
    for got, want in zip(batched, out):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_cfg_one_runs_the_conditional_branch_alone_and_no_skip_packs_both():
    fake = FakeBackbone()
    euler_sample(fake, texts(1.0), texts(-1.0), SIZES, SEEDS, SamplerConfig(steps=3, cfg_scale=1.0), C)
    assert pattern(fake) == [(2, None, 0)] * 3
    fake = FakeBackbone()
    config = SamplerConfig(steps=3, uncond_skip_layers=())
    out = euler_sample(fake, texts(1.0), texts(-1.0), SIZES, SEEDS, config, C)
    assert pattern(fake) == [(4, None, 0)] * 3
    for got, want in zip(out, released(config, 1.0, -1.0)):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_seed_gives_the_released_noise_in_token_layout():
    fake = lambda img, text, sigma, seq, **kw: torch.zeros_like(img)  # noqa: E731
    out = euler_sample(fake, texts(0.0), None, SIZES, SEEDS, SamplerConfig(steps=2, cfg_scale=1.0), C)
    for (h, w), seed, tokens in zip(SIZES, SEEDS, out):
        z = torch.randn(1, C, h, w, generator=torch.Generator("cpu").manual_seed(seed), dtype=torch.float32)
        assert tokens.shape == (h * w, C) and tokens.dtype == torch.float32
        for r in range(h):
            for c in range(w):  # token r * w + c carries the 128 channels at (r, c)
                assert torch.equal(tokens[r * w + c], z[0, :, r, c])
    assert torch.equal(initial_noise((2, 3), 11, C), out[0])
    assert not torch.equal(initial_noise((2, 3), 12, C), out[0])


def test_skip_index_beyond_the_model_is_an_error_naming_the_knob():
    fake = FakeBackbone(depth=4)
    with pytest.raises(ConfigError, match="UNCOND_SKIP_LAYERS") as e:
        euler_sample(fake, texts(1.0), texts(0.0), SIZES, SEEDS, SamplerConfig(steps=2), C)
    assert "4-block" in str(e.value) and fake.calls == []
    euler_sample(
        fake, texts(1.0), texts(0.0), SIZES, SEEDS, SamplerConfig(steps=2, uncond_skip_layers=(3,)), C
    )
    assert [c[1] for c in fake.calls] == [frozenset({3})] * 2
    assert released_uncond_skip_layers(42) == (22,) and released_uncond_skip_layers(4) == ()


@pytest.mark.parametrize(
    "kw, knob",
    [
        ({"uncond_skip_layers": (-1,)}, "UNCOND_SKIP_LAYERS"),
        ({"uncond_skip_layers": (True,)}, "UNCOND_SKIP_LAYERS"),
        ({"slg_start": 0.8, "slg_stop": 0.5}, "SLG_START"),
        ({"steps": 0}, "STEPS"),
        ({"cfg_scale": float("nan")}, "CFG"),
        ({"shift": -1.0}, "SHIFT"),
    ],
)
def test_bad_settings_named(kw, knob):
    with pytest.raises(ConfigError, match=knob):
        SamplerConfig(**kw)


def test_real_backbone_honours_the_skip_and_the_seed():
    cfg = get_preset("tiny")
    model = random_model(cfg)
    g = torch.Generator().manual_seed(0)
    cond = [torch.randn(5, cfg.text_dim, generator=g), torch.randn(2, cfg.text_dim, generator=g)]
    uncond = [torch.randn(1, cfg.text_dim, generator=g)] * 2
    skip = SamplerConfig(steps=3, cfg_scale=4.0, uncond_skip_layers=(1,))
    out = euler_sample(model, cond, uncond, [(2, 3), (3, 3)], [11, 12], skip, cfg.in_channels)
    assert [o.shape for o in out] == [(6, cfg.in_channels), (9, cfg.in_channels)]
    alone = euler_sample(model, cond[:1], uncond[:1], [(2, 3)], [11], skip, cfg.in_channels)
    torch.testing.assert_close(alone[0], out[0], rtol=1e-5, atol=1e-5)  # batch-independent
    plain = SamplerConfig(steps=3, cfg_scale=4.0, uncond_skip_layers=())
    no_skip = euler_sample(model, cond[:1], uncond[:1], [(2, 3)], [11], plain, cfg.in_channels)
    assert not torch.allclose(no_skip[0], out[0], atol=1e-4)
    other = euler_sample(model, cond[:1], uncond[:1], [(2, 3)], [99], skip, cfg.in_channels)
    assert not torch.allclose(other[0], out[0], atol=1e-4)
    with pytest.raises(ConfigError, match="UNCOND_SKIP_LAYERS"):  # the default needs 23 blocks
        euler_sample(model, cond, uncond, [(2, 3), (3, 3)], [11, 12], SamplerConfig(steps=2), cfg.in_channels)

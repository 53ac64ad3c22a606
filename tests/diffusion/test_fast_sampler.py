"""The sampler's fast path against its plain one on the real (tiny) backbone: batched CFG with the skipped
block kept for the conditional samples, the kernel registry's ops, CUDA graphs (GPU) and streamed weights."""

from __future__ import annotations

import pytest
import torch

from kohakumoss.diffusion import SamplerConfig, SamplerSpeed, euler_sample
from kohakumoss.diffusion.sampler import graph_refusal
from kohakumoss.memory.install import install_memory_plan
from kohakumoss.memory.plan import MemoryPlan
from kohakumoss.model import PackedSeq, get_preset
from kohakumoss_common.errors import ConfigError
from kohakumoss_kernels import OpSet

from ..model.helpers import random_batch, random_model

CFG = get_preset("tiny")
SIZES = [(2, 3), (3, 3)]
SEEDS = [11, 12]
# skip block 1 of 4 in the middle half of the steps: steps with and without the skip in one run
SLG = SamplerConfig(steps=4, cfg_scale=4.0, uncond_skip_layers=(1,), slg_start=0.25, slg_stop=0.75)
PLAIN = SamplerSpeed(batch_cfg=False, cuda_graphs="off")
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def texts(seed: int = 0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    cond = [torch.randn(5, CFG.text_dim, generator=g), torch.randn(2, CFG.text_dim, generator=g)]
    uncond = [torch.randn(1, CFG.text_dim, generator=g), torch.randn(3, CFG.text_dim, generator=g)]
    return [t.to(dtype) for t in cond], [t.to(dtype) for t in uncond]


def sample(model, speed: SamplerSpeed, config=SLG, device="cpu", dtype=torch.float32):
    cond, uncond = texts(dtype=dtype)
    return euler_sample(
        model, cond, uncond, SIZES, SEEDS, config, CFG.in_channels, device, dtype, speed=speed
    )


def assert_all_close(got, want, tol: float) -> None:
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=tol, atol=tol)


def test_keep_lead_runs_the_skipped_block_on_the_leading_samples_alone():
    model = random_model(CFG)
    imgs, txts, sigma, _ = random_batch(CFG, [3, 2, 4], [(2, 3), (3, 2), (2, 2)])
    lead = PackedSeq.build([3, 2], [(2, 3), (3, 2)])
    with torch.no_grad():
        both = model(
            torch.cat(imgs), torch.cat(txts), sigma, PackedSeq.build([3, 2, 4], [(2, 3), (3, 2), (2, 2)]),
            skip_layers={2}, keep_lead=lead,
        )  # fmt: skip
        kept = model(torch.cat(imgs[:2]), torch.cat(txts[:2]), sigma[:2], lead)
        skipped = model(imgs[2], txts[2], sigma[2:], PackedSeq.build([4], [(2, 2)]), skip_layers={2})
        every = model(imgs[2], txts[2], sigma[2:], PackedSeq.build([4], [(2, 2)]))
    torch.testing.assert_close(both[:12], kept, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(both[12:], skipped, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(both[12:], every, atol=1e-3)  # the skip really applies to the rest
    with pytest.raises(ValueError, match="prefix"):
        model(
            torch.cat(imgs), torch.cat(txts), sigma, PackedSeq.build([3, 2, 4], [(2, 3), (3, 2), (2, 2)]),
            skip_layers={2}, keep_lead=PackedSeq.build([2], [(3, 2)]),
        )  # fmt: skip


def test_batched_cfg_equals_one_forward_per_branch():
    model = random_model(CFG)
    plain = sample(model, PLAIN)
    batched = sample(model, SamplerSpeed(batch_cfg=True, cuda_graphs="off"))
    assert_all_close(batched, plain, 1e-5)
    no_skip = sample(model, PLAIN, SamplerConfig(steps=4, cfg_scale=4.0, uncond_skip_layers=()))
    assert not torch.allclose(no_skip[0], plain[0], atol=1e-3)  # the window's skip changed the images


def test_fast_path_equals_the_eager_reference_sampler():
    """The product's path (registry ops, batched CFG, graphs where allowed) against OpSet('eager') with
    one forward per branch: the plain sampler scripts/bench/sample.py times it against."""
    fast = random_model(CFG)
    eager = random_model(CFG)
    eager.ops = OpSet("eager")
    assert_all_close(sample(fast, SamplerSpeed()), sample(eager, PLAIN), 1e-5)


def test_streamed_weights_sample_what_resident_ones_do():
    resident = sample(random_model(CFG), SamplerSpeed())
    model = random_model(CFG)
    install_memory_plan(MemoryPlan(stream_blocks=-1, stream_slots=2), model, torch.device("cpu"))
    assert model.block_runner is not None and model.block_runner.streamer is not None
    assert_all_close(sample(model, SamplerSpeed()), resident, 1e-6)


def test_graph_modes_and_refusals_named():
    with pytest.raises(ConfigError, match="CUDA_GRAPHS"):
        SamplerSpeed(cuda_graphs="yes")
    model = random_model(CFG)
    assert "DEVICE" in graph_refusal(model, "cpu")
    with pytest.raises(ConfigError, match="CUDA_GRAPHS.*DEVICE"):
        sample(model, SamplerSpeed(cuda_graphs="on"))
    model.block_runner = lambda *a: None  # what a memory plan with streaming installs
    assert "STREAM_BLOCKS" in graph_refusal(model, "cuda")


def _cuda_model(dtype=torch.float32, stream: bool = False):
    device = torch.device("cuda")
    model = random_model(CFG)
    if stream:
        install_memory_plan(MemoryPlan(stream_blocks=-1, stream_slots=2), model, device)
    else:
        model.to(device)
    return model.to(dtype) if not stream else model, device


@pytest.mark.gpu
@gpu
def test_graphed_steps_replay_what_eager_steps_compute(monkeypatch):
    import kohakumoss.diffusion.sampler as sampler

    made = []

    class Spy(sampler._Steps):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(sampler, "_Steps", Spy)
    model, device = _cuda_model()
    model.ops.set_timing("device")  # as sample.py does for graphed steps: uncapturable backends drop out
    config = SamplerConfig(steps=8, cfg_scale=4.0, uncond_skip_layers=(1,), slg_start=0.25, slg_stop=0.75)
    graphed = sample(model, SamplerSpeed(cuda_graphs="on"), config, device)
    # two step kinds (with and without the skip), each eager once, captured on its second run
    assert len(made[0].captured) == 2 and made[0].replays == 8 - 4 and made[0].failed is None
    eager = sample(model, SamplerSpeed(cuda_graphs="off"), config, device)
    assert_all_close(graphed, eager, 1e-5)
    eager_ops = random_model(CFG).to(device)
    eager_ops.ops = OpSet("eager")
    reference = sample(eager_ops, PLAIN, config, device)
    assert_all_close(graphed, reference, 5e-4)  # registry kernels against the eager ops, fp32


@pytest.mark.gpu
@gpu
def test_graphed_bf16_sampling_tracks_the_eager_sampler():
    model, device = _cuda_model(torch.bfloat16)
    model.ops.set_timing("device")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        graphed = sample(model, SamplerSpeed(cuda_graphs="on"), device=device, dtype=torch.bfloat16)
    eager = random_model(CFG).to(device, torch.bfloat16)
    eager.ops = OpSet("eager")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        reference = sample(eager, PLAIN, device=device, dtype=torch.bfloat16)
    for g, r in zip(graphed, reference):
        assert torch.isfinite(g).all()
        assert (g - r).norm() / r.norm() < 0.05  # bf16 rounding over 4 steps, not a different image


@pytest.mark.gpu
@gpu
def test_streamed_sampling_on_the_gpu_equals_resident():
    resident_model, device = _cuda_model()
    resident = sample(resident_model, SamplerSpeed(cuda_graphs="off"), device=device)
    streamed_model, _ = _cuda_model(stream=True)
    streamed = sample(streamed_model, SamplerSpeed(), device=device)  # auto: graphs refused, eager
    assert_all_close(streamed, resident, 1e-6)


def test_trainer_grids_take_the_fast_path_graphs_off_where_the_run_says():
    from kohakumoss.train.samples import sampler_speed

    assert sampler_speed("auto", "lora") == SamplerSpeed()
    assert sampler_speed("off", "lora").cuda_graphs == "off"
    assert sampler_speed("on", "dylora").cuda_graphs == "off"  # a rank drawn per call
    assert sampler_speed("on", "lora").batch_cfg


def test_sample_script_graphs_off_with_a_dylora_adapter_and_on_refused():
    from kohakumoss.adapters import build_adapter
    from kohakumoss.diffusion.sample_run import sampler_speed

    lora = build_adapter(random_model(CFG), algo="lora", rank=4, alpha=4.0)
    dylora = build_adapter(random_model(CFG), algo="dylora", rank=4, alpha=4.0)
    assert sampler_speed("on", [lora]).cuda_graphs == "on"
    assert sampler_speed("auto", [dylora]).cuda_graphs == "off"
    with pytest.raises(ConfigError, match="CUDA_GRAPHS.*DyLoRA"):
        sampler_speed("on", [dylora])

"""PRECISION fp16: the DiT's residual streams in float32 (precision/fp16.py) keep a forward and a LoRA
backward finite where an fp16 stream overflows, and track the float32 model; tiny model, CPU autocast."""

from __future__ import annotations

import pytest
import torch

from kohakumoss.adapters import build_adapter
from kohakumoss.precision import fp32_residuals, wants_fp32_residuals
from kohakumoss_kernels import OpSet

from ..adapters.helpers import flow_batch, flow_loss, forward, tiny_model


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def _model(dtype: torch.dtype, residual32: bool, blow_up: float = 0.0):
    """The tiny model in `dtype`; blow_up: added to both gates' modulation bias, so every block adds
    ~blow_up times its branch to the stream (a stream past fp16's range; the branches' inputs are normed)."""
    model = tiny_model()
    model.ops = OpSet("eager", tune="off")
    if blow_up:
        d = model.config.dim
        with torch.no_grad():
            bias = model.shared_block_modulation.bias.view(6, d)
            bias[2] += blow_up  # gate_a
            bias[5] += blow_up  # gate_f
    fp32_residuals(model, residual32)
    return model.to(dtype)


def _forward(model, dtype):
    with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        return forward(model, flow_batch())


def test_fp32_residuals_only_for_fp16():
    assert wants_fp32_residuals("fp16") and not wants_fp32_residuals("bf16")
    assert not wants_fp32_residuals("fp32")


def test_fp16_stream_overflows_and_the_fp32_one_stays_finite():
    """The failure this fixes: the same weights in fp16 give inf/nan with an fp16 stream, a finite output
    close to the float32 model's with a float32 one."""
    ref = _forward(_model(torch.float32, False, blow_up=30000.0), torch.float32)
    assert torch.isfinite(ref).all()
    plain = _forward(_model(torch.float16, False, blow_up=30000.0), torch.float16)
    assert not torch.isfinite(plain).all()
    model = _model(torch.float16, True, blow_up=30000.0)
    fixed = _forward(model, torch.float16)
    assert fixed.dtype == torch.float16 and torch.isfinite(fixed).all()
    print(f"fp16, float32 stream, blown-up gates: {_rel(fixed, ref):.2e} from float32")
    assert _rel(fixed, ref) < 2e-2


def test_fp16_with_fp32_residuals_tracks_float32_and_bf16():
    """Without a blow-up: fp16 (float32 stream) against the float32 model, beside bf16's own error."""
    ref = _forward(_model(torch.float32, False), torch.float32)
    fp16 = _forward(_model(torch.float16, True), torch.float16)
    bf16 = _forward(_model(torch.bfloat16, False), torch.bfloat16)
    e16, eb = _rel(fp16, ref), _rel(bf16, ref)
    print(f"fp16 (float32 stream) {e16:.2e}, bf16 {eb:.2e} from float32")
    assert e16 < eb  # fp16's 10 mantissa bits against bf16's 7
    assert e16 < 1e-2


@pytest.mark.parametrize("residual32", [False, True])
def test_lora_backward_in_fp16_with_a_loss_scaler(residual32):
    """A LoRA step in fp16 through torch.amp.GradScaler: finite scaled gradients with the float32
    stream; the fp16 stream's loss is already non-finite."""
    model = _model(torch.float16, residual32, blow_up=30000.0).requires_grad_(False)
    net = build_adapter(model, rank=4, alpha=4.0, preset="attn-mlp", bypass=True)
    with torch.no_grad():
        for m in net.loras:
            m.lora_up.weight.normal_(0, 0.1, generator=torch.Generator().manual_seed(1))
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    with torch.autocast("cpu", dtype=torch.float16):
        loss = flow_loss(model, flow_batch())
    if not residual32:
        assert not torch.isfinite(loss)
        return
    assert torch.isfinite(loss)
    scaler.scale(loss).backward()
    grads = [p.grad for p in net.parameters()]
    assert all(g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads)
    assert all(g.abs().sum() > 0 for g in grads)
    before = [p.detach().clone() for p in net.parameters()]
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 2.0**10  # nothing overflowed: no step skipped, scale kept
    assert any(not torch.equal(p, b) for p, b in zip(net.parameters(), before, strict=True))


def test_encoder_precision_follows_fp16_and_its_knob():
    from kohakumoss.config.train import EncoderConfig
    from kohakumoss.train.components import encoder_dtype, text_encoder_config

    gpu, cpu = torch.device("cuda"), torch.device("cpu")
    auto, fp16 = EncoderConfig(), EncoderConfig(encoder_precision="fp16")
    assert encoder_dtype(auto, "fp16", gpu) == torch.float16
    assert encoder_dtype(auto, "bf16", gpu) == torch.bfloat16
    assert encoder_dtype(auto, "fp16", cpu) == torch.float32
    assert encoder_dtype(fp16, "bf16", gpu) == torch.float16
    te = EncoderConfig(text_encoder="te")
    assert text_encoder_config(te, cpu, gpu, "fp16").dtype == "float16"
    fp32 = EncoderConfig(text_encoder="te", encoder_precision="fp32")
    assert text_encoder_config(fp32, cpu, gpu, "fp16").dtype == "float32"


def _scaled_run(placement: str, poison_step: int = -1, steps: int = 3):
    """A few loss-scaled steps of the optimizer-placement tests' tiny model: 'gpu' through GradScaler
    itself (the reference), 'host' / 'stream' through placed_scaled_step."""
    from kohakumoss.precision import placed_scaled_step

    from ..memory.test_optimizer_placement import build, make_model, micro_loss, place

    model = make_model()
    po = place(build("adamw", model), model, placement)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2)
    norms = []
    for step in range(steps):
        scaler.scale(micro_loss(model, step, 0)).backward()
        if step == poison_step:
            next(model.parameters()).grad[0, 0] = float("inf")
        if placement == "gpu":
            for member in po.optimizers.values():
                scaler.unscale_(member)
            norms.append(float(po.clip_grad_norm_(1.0)))
            for member in po.optimizers.values():
                scaler.step(member)
            scaler.update()
        else:
            norms.append(float(placed_scaled_step(po, scaler, 1.0)))
        po.zero_grad(set_to_none=True)
    return {n: p.detach().clone() for n, p in model.named_parameters()}, norms, scaler.get_scale()


@pytest.mark.parametrize("placement", ["host", "stream"])
@pytest.mark.parametrize("poison_step", [-1, 1])
def test_loss_scaling_with_the_optimizer_off_the_gpu_equals_grad_scaler(placement, poison_step):
    """fp16's loss scale with placed masters: the same parameters, norms and scale schedule as GradScaler
    stepping the optimizer itself, an overflowing step skipped and the scale backed off."""
    ref, ref_norms, ref_scale = _scaled_run("gpu", poison_step)
    got, norms, scale = _scaled_run(placement, poison_step)
    assert scale == ref_scale
    assert scale == (
        2.0**8 * 0.5 if poison_step >= 0 else 2.0**9
    )  # growth after 2 clean steps, or a back-off
    for name, p in ref.items():
        torch.testing.assert_close(got[name], p, atol=1e-6, rtol=1e-5)
    clean = [i for i in range(3) if i != poison_step]
    torch.testing.assert_close(
        torch.tensor([norms[i] for i in clean]), torch.tensor([ref_norms[i] for i in clean])
    )


def test_encoders_in_fp16_track_float32(tmp_path):
    """ENCODER_PRECISION fp16: the tiny text encoder's last_hidden_state and the tiny VAE's round trip in
    fp16 against float32 (CPU)."""
    from kohakumoss.encoders import TextEncoder, TextEncoderConfig
    from kohakumoss.encoders.tiny import tiny_vae

    from ..encoders import conftest as enc

    folder = enc.write_hf_folder(tmp_path / "hf", enc.random_text_model())
    tok = enc.make_tokenizer(tmp_path / "tok")
    captions = ["a red cat sits on the mat", "the quick brown fox"]
    states = {
        d: TextEncoder.load(TextEncoderConfig(path=str(folder), tokenizer_path=str(tok), dtype=d)).encode(
            captions
        )[0]
        for d in ("float32", "float16")
    }
    assert states["float16"].dtype == torch.float16 and torch.isfinite(states["float16"]).all()
    e_text = _rel(states["float16"], states["float32"])
    pixels = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(0)) * 2 - 1
    decoded = {}
    for dtype in (torch.float32, torch.float16):
        vae = tiny_vae(dtype=dtype)
        decoded[dtype] = vae.decode(vae.encode(pixels)).float()
    assert torch.isfinite(decoded[torch.float16]).all()
    e_vae = _rel(decoded[torch.float16], decoded[torch.float32])
    print(f"fp16 encoders vs float32: text {e_text:.2e}, VAE round trip {e_vae:.2e}")
    assert e_text < 1e-2 and e_vae < 2e-2

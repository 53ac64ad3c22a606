"""Encoder placement (resident / streamed / off): same outputs as the plain encoder, weights moved in and
out of the device per call when streamed, a DataError naming the knob when 'off' is asked to encode."""

from __future__ import annotations

import pytest
import torch

from kohakumoss.encoders.random_weights import build_random_text_encoder, build_random_vae
from kohakumoss.encoders.synthetic import SyntheticTextEncoder, SyntheticVAE
from kohakumoss.encoders.tiny import load_tiny_text_encoder, tiny_vae
from kohakumoss.memory.engines.encoders import PlacedEncoder, encoder_tensors, place_encoder
from kohakumoss_common.errors import ConfigError, DataError

CAPTIONS = ["a red cat sits on the mat", "the quick brown fox", "a dog"]
PLACEMENTS = ("resident", "streamed", "off")


@pytest.fixture(scope="module")
def text_encoder(tmp_path_factory):
    return load_tiny_text_encoder(tmp_path_factory.mktemp("te"), CAPTIONS, seed=0)


@pytest.fixture(scope="module")
def vae():
    return tiny_vae(seed=0)


def pixels() -> torch.Tensor:
    return torch.rand(2, 3, 32, 48, generator=torch.Generator().manual_seed(0)) * 2 - 1


def run_encode(enc, kind: str):
    return enc.encode(CAPTIONS) if kind == "text" else enc.encode(pixels())


def encoders():
    return {
        "text": lambda te, _vae: te,
        "vae": lambda _te, vae: vae,
        "synthetic-text": lambda *_: SyntheticTextEncoder(16, seed=3),
        "synthetic-vae": lambda *_: SyntheticVAE(seed=3),
        "random-text": lambda *_: build_random_text_encoder("tiny", 3, "cpu", torch.float32),
        "random-vae": lambda *_: build_random_vae("tiny", 3, "cpu", torch.float32),
    }


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("which", list(encoders()))
def test_outputs_match_the_unwrapped_encoder(text_encoder, vae, which, placement):
    enc = encoders()[which](text_encoder, vae)
    kind = "text" if "text" in which else "vae"
    want = run_encode(enc, kind)
    placed = place_encoder(enc, placement, "cpu")
    try:
        with placed.on_device():
            got = run_encode(placed, kind)
        if placement != "off":
            assert all(torch.equal(a, b) for a, b in zip(run_encode(placed, kind), got))
        if kind == "text":
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        else:
            assert torch.equal(got, want)
            with placed.on_device():
                assert torch.equal(placed.decode(got), enc.decode(want))
    finally:
        place_encoder(enc, "resident", "cpu")  # give the module-scoped encoder back its plain state


def test_the_wrapper_forwards_what_the_data_code_reads(text_encoder, vae):
    placed_te = place_encoder(text_encoder, "streamed", "cpu")
    assert placed_te.identity == text_encoder.identity
    assert placed_te.template == text_encoder.template
    assert placed_te.layer_choice == text_encoder.layer_choice
    assert placed_te.hidden_size == text_encoder.hidden_size and placed_te.dtype == text_encoder.dtype
    assert placed_te.knob == "TEXT_ENCODER_PLACEMENT"
    placed_vae = place_encoder(vae, "off", "cpu")
    assert placed_vae.identity == vae.identity and placed_vae.latent_channels == vae.latent_channels
    assert placed_vae.knob == "VAE_PLACEMENT"
    assert place_encoder(None, "streamed", "cpu") is None
    again = place_encoder(placed_te, "resident", "cpu")  # re-placing wraps the encoder, not the wrapper
    assert isinstance(again, PlacedEncoder) and again.inner is text_encoder
    place_encoder(vae, "resident", "cpu")


@pytest.mark.parametrize(
    "which, knob, script",
    [
        ("text", "TEXT_ENCODER_PLACEMENT", "cache_text.py"),
        ("vae", "VAE_PLACEMENT", "cache_latents.py"),
        ("synthetic-text", "TEXT_ENCODER_PLACEMENT", "cache_text.py"),
        ("synthetic-vae", "VAE_PLACEMENT", "cache_latents.py"),
        ("random-text", "TEXT_ENCODER_PLACEMENT", "cache_text.py"),
        ("random-vae", "VAE_PLACEMENT", "cache_latents.py"),
    ],
)
def test_off_refuses_to_encode_outside_sampling(text_encoder, vae, which, knob, script):
    enc = encoders()[which](text_encoder, vae)
    kind = "text" if "text" in which else "vae"
    placed = place_encoder(enc, "off", "cpu")
    try:
        with pytest.raises(DataError, match=knob) as err:
            run_encode(placed, kind)
        assert script in str(err.value) and "'off'" in str(err.value)
        with placed.on_device():  # sampling / validation still work
            out = run_encode(placed, kind)
        if kind == "vae":
            with pytest.raises(DataError, match=knob):
                placed.decode(out)
    finally:
        place_encoder(enc, "resident", "cpu")


def test_a_bad_placement_names_its_knob(vae):
    with pytest.raises(ConfigError, match="VAE_PLACEMENT"):
        place_encoder(vae, "gpu", "cpu")


@pytest.mark.parametrize("which", ["text", "vae", "synthetic-vae", "random-text"])
def test_streamed_moves_the_weights_in_for_each_call_and_out_after(text_encoder, vae, which):
    """On the CPU the 'device' copy is a fresh buffer: inside a call the weights are other storage than
    the kept host copy, after it they are the host copy again, and one load happens per call."""
    enc = encoders()[which](text_encoder, vae)
    kind = "text" if "text" in which else "vae"
    placed = place_encoder(enc, "streamed", "cpu")
    tensors = encoder_tensors(enc)
    assert tensors
    host_ptrs = [t.data_ptr() for t in tensors]
    seen: list[list[int]] = []
    real = enc.encode

    def spy(*args, **kwargs):
        seen.append([t.data_ptr() for t in tensors])
        return real(*args, **kwargs)

    enc.encode = spy
    try:
        run_encode(placed, kind)
        run_encode(placed, kind)
        assert placed.loads == 2 and len(seen) == 2
        assert all(all(p != h for p, h in zip(ptrs, host_ptrs)) for ptrs in seen)
        assert [t.data_ptr() for t in tensors] == host_ptrs
        with placed.on_device():  # one span, two calls: one load
            run_encode(placed, kind)
            run_encode(placed, kind)
        assert placed.loads == 3
    finally:
        del enc.encode
        place_encoder(enc, "resident", "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("which", ["text", "vae"])
def test_streamed_gives_the_gpu_memory_back(tmp_path, which):
    cuda = torch.device("cuda")
    if which == "text":
        enc = load_tiny_text_encoder(tmp_path, CAPTIONS, seed=0)
    else:
        enc = tiny_vae(seed=0)
    want = run_encode(enc, which)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated(cuda)
    placed = place_encoder(enc, "streamed", cuda)
    assert all(t.device.type == "cpu" and t.is_pinned() for t in encoder_tensors(enc))
    assert torch.cuda.memory_allocated(cuda) == before
    run_encode(placed, which)  # warm-up: cuBLAS / cuDNN keep their workspaces in the allocator
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated(cuda)
    with placed.on_device():
        assert torch.cuda.memory_allocated(cuda) >= base + placed.weight_bytes
        assert all(t.device.type == "cuda" for t in encoder_tensors(enc))
    out = run_encode(placed, which)
    got = (out[0].cpu(), out[1].cpu()) if which == "text" else out.cpu()
    del out
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated(cuda) == base
    assert all(t.device.type == "cpu" for t in encoder_tensors(enc)) and placed.loads == 3
    tol = 1e-3 if which == "text" else 2e-2  # cuDNN convolutions may run in TF32
    if which == "text":
        torch.testing.assert_close(got[0], want[0], rtol=tol, atol=tol)
        assert torch.equal(got[1], want[1])
    else:
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)

"""ImageVAE on a tiny random FLUX.2-shaped VAE: shapes, loading layouts, the small decoder, identity."""

from __future__ import annotations

import pytest
import torch

from kohakumoss.encoders import ImageVAE
from kohakumoss.encoders.vae_config import infer_vae_config, tiny_vae_config
from kohakumoss.encoders.vae_layouts import count_up_levels, diffusers_to_bfl, to_bfl_tensor
from kohakumoss_common.errors import CheckpointError
from kohakumoss_common.io import save_safetensors

from .conftest import random_vae

PIXELS = torch.rand(2, 3, 32, 48) * 2 - 1


def bfl_state(vae: ImageVAE) -> dict[str, torch.Tensor]:
    state = vae.model.state_dict()
    n_up = len(vae.model.config.up_block_types)
    return {diffusers_to_bfl(k, n_up): to_bfl_tensor(k, v) for k, v in state.items()}


def same_outputs(a: ImageVAE, b: ImageVAE) -> None:
    za, zb = a.encode(PIXELS), b.encode(PIXELS)
    assert torch.equal(za, zb)
    assert torch.equal(a.decode(za), b.decode(zb))


def test_encode_decode_shapes(vae):
    z = vae.encode(PIXELS)
    assert z.shape == (2, 32, 4, 6) and z.dtype == torch.float32
    x = vae.decode(z)
    assert x.shape == (2, 3, 32, 48)
    assert x.min() >= -1 and x.max() <= 1


def test_encode_is_normalized_posterior_mean(vae):
    raw = vae.model.encode(PIXELS).latent_dist.mode()
    assert torch.equal(vae.encode(PIXELS), vae.normalize(raw))
    torch.testing.assert_close(vae.denormalize(vae.encode(PIXELS)), raw)


def test_bad_pixels():
    vae = random_vae()
    with pytest.raises(ValueError, match="multiples of 16"):
        vae.encode(torch.zeros(1, 3, 24, 32))


def test_folder_load_equals_model(tmp_path, vae):
    vae.model.save_pretrained(str(tmp_path / "vae"))
    loaded = ImageVAE.load(tmp_path / "vae", dtype=torch.float32)
    same_outputs(vae, loaded)


def test_single_file_bfl_equals_folder(tmp_path, vae):
    vae.model.save_pretrained(str(tmp_path / "vae"))
    save_safetensors(bfl_state(vae), tmp_path / "flux2-vae.safetensors")
    assert any(k.startswith("encoder.down.0.block.0.") for k in bfl_state(vae))
    folder = ImageVAE.load(tmp_path / "vae", dtype=torch.float32)
    single = ImageVAE.load(tmp_path / "flux2-vae.safetensors", dtype=torch.float32)
    same_outputs(folder, single)
    assert single.model.config.block_out_channels == folder.model.config.block_out_channels


def test_single_file_diffusers_names(tmp_path, vae):
    save_safetensors(vae.model.state_dict(), tmp_path / "vae.safetensors")
    same_outputs(vae, ImageVAE.load(tmp_path / "vae.safetensors", dtype=torch.float32))


def test_small_decoder_config_is_inferred(tmp_path):
    small = random_vae(small_decoder=True)
    save_safetensors(bfl_state(small), tmp_path / "flux2-vae_small.safetensors")
    loaded = ImageVAE.load(tmp_path / "flux2-vae_small.safetensors", dtype=torch.float32)
    assert list(loaded.model.config.decoder_block_out_channels) == [32, 32, 32, 32]
    same_outputs(small, loaded)


def test_small_decoder_from_second_file(tmp_path, vae):
    small = random_vae(small_decoder=True, seed=1)
    save_safetensors(bfl_state(vae), tmp_path / "full.safetensors")
    decoder = {k: v for k, v in bfl_state(small).items() if k.startswith("decoder.")}
    save_safetensors(decoder, tmp_path / "decoder_small.safetensors")
    loaded = ImageVAE.load(
        tmp_path / "full.safetensors",
        dtype=torch.float32,
        small_decoder=tmp_path / "decoder_small.safetensors",
    )
    assert torch.equal(loaded.encode(PIXELS), vae.encode(PIXELS))  # encoder and statistics from the full file
    z = vae.encode(PIXELS)
    want = small.model.decode(vae.denormalize(z)).sample.clamp(-1, 1)
    assert torch.equal(loaded.decode(z), want)


def test_bf16_load_keeps_stats_fp32(tmp_path, vae):
    save_safetensors(bfl_state(vae), tmp_path / "v.safetensors")
    loaded = ImageVAE.load(tmp_path / "v.safetensors")
    assert loaded.dtype == torch.bfloat16 and loaded.model.bn.running_var.dtype == torch.float32
    assert loaded.encode(PIXELS).shape == (2, 32, 4, 6)


def test_identity_follows_weights(tmp_path, vae):
    save_safetensors(bfl_state(vae), tmp_path / "a.safetensors")
    save_safetensors(bfl_state(random_vae(seed=3)), tmp_path / "b.safetensors")
    a = ImageVAE.load(tmp_path / "a.safetensors", dtype=torch.float32)
    assert a.identity == ImageVAE.load(tmp_path / "a.safetensors", dtype=torch.float32).identity
    assert a.identity != ImageVAE.load(tmp_path / "b.safetensors", dtype=torch.float32).identity


def test_inferred_config_equals_original():
    small = random_vae(small_decoder=True)
    shapes = {k: tuple(v.shape) for k, v in small.model.state_dict().items()}
    inferred = infer_vae_config(shapes)
    for key, value in tiny_vae_config(small_decoder=True).items():
        assert inferred[key] == value, key
    assert count_up_levels(list(bfl_state(small))) == 4


def test_bad_vae_file_is_named(tmp_path, vae):
    state = bfl_state(vae)
    del state["decoder.conv_out.bias"]
    state["encoder.mid.attn_1.q.weight"] = state["encoder.mid.attn_1.q.weight"][:8]
    save_safetensors(state, tmp_path / "bad.safetensors")
    with pytest.raises(CheckpointError) as err:
        ImageVAE.load(tmp_path / "bad.safetensors")
    assert "missing keys (1): decoder.conv_out.bias" in str(err.value)
    assert "shape mismatch at encoder.mid_block.attentions.0.to_q.weight: checkpoint [8, 64]" in str(
        err.value
    )


@pytest.mark.gpu
def test_cuda_bf16_close_to_cpu_fp32(tmp_path, vae):
    save_safetensors(bfl_state(vae), tmp_path / "v.safetensors")
    gpu = ImageVAE.load(tmp_path / "v.safetensors", device="cuda")
    z = gpu.encode(PIXELS)
    assert z.device.type == "cuda"
    ref = vae.encode(PIXELS)
    assert ((z.cpu() - ref).norm() / ref.norm()) < 3e-2
    assert gpu.decode(z).shape == (2, 3, 32, 48)


def test_random_identity_follows_weights():
    assert random_vae(seed=0).identity == random_vae(seed=0).identity
    assert random_vae(seed=0).identity != random_vae(seed=1).identity

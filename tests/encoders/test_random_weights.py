"""TEXT_ENCODER / VAE 'random': the real architectures with every tensor drawn from the seed, a word-hash
tokenizer into the config's vocabulary, and the size the estimate is given equal to what gets built."""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen3_5 import Qwen3_5TextModel

from kohakumoss.encoders.random_weights import (
    build_random_text_encoder,
    build_random_vae,
    fill_text_model,
    parameter_bytes,
    random_encoder_bytes,
    random_size,
    random_text_config,
)

CAPTIONS = ["a red cat sits on the mat", "the quick brown fox", "a red cat sits on the mat", ""]
CPU = torch.device("cpu")


def state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in module.state_dict().items()}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_random_text_encoder_is_a_function_of_its_seed():
    a = build_random_text_encoder("tiny", 7, CPU, torch.float32)
    b = build_random_text_encoder("tiny", 7, CPU, torch.float32)
    c = build_random_text_encoder("tiny", 8, CPU, torch.float32)
    assert same(state(a.model), state(b.model)) and not same(state(a.model), state(c.model))
    assert a.identity == b.identity != c.identity
    assert a.identity != build_random_text_encoder("tiny", 7, CPU, torch.bfloat16).identity
    (ha, la), (hb, lb) = a.encode(CAPTIONS), b.encode(CAPTIONS)
    assert torch.equal(ha, hb) and torch.equal(la, lb)
    assert la.tolist() == [7, 4, 7, 1] and ha.shape == (19, 32) and torch.isfinite(ha).all()
    assert torch.equal(ha[:7], ha[11:18])  # the same caption, the same rows
    assert not torch.equal(ha, c.encode(CAPTIONS)[0])
    assert isinstance(a.model, Qwen3_5TextModel) and a.model.rotary_emb.inv_freq.dtype == torch.float32
    assert torch.get_default_dtype() == torch.float32  # the global state is as it was


def test_the_build_draws_from_forked_generators():
    torch.manual_seed(123)
    want = torch.rand(4)
    torch.manual_seed(123)
    build_random_text_encoder("tiny", 0, CPU, torch.float32)
    build_random_vae("tiny", 0, CPU, torch.float32)
    assert torch.equal(torch.rand(4), want)


def test_every_text_model_tensor_is_drawn(monkeypatch):
    """Storage from to_empty poisoned with NaN: after the fill no tensor may keep it."""
    real = torch.empty_like
    monkeypatch.setattr(torch, "empty_like", lambda t, **kw: real(t, **kw).fill_(float("nan")))
    with torch.device("meta"):
        model = Qwen3_5TextModel(random_text_config("tiny"))
    fill_text_model(model, 0, CPU, CPU)
    bad = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if not torch.isfinite(t).all()]
    assert not bad


def test_word_hash_tokens():
    enc = build_random_text_encoder("tiny", 0, CPU, torch.float32, max_length=3)
    ids = enc.token_ids("Red  cat red")
    assert ids == enc.token_ids("red cat RED") and ids[0] == ids[2] and len(ids) == 3
    assert all(0 <= i < enc.vocab_size == 64 for i in enc.token_ids("one two three four five"))
    assert len(enc.token_ids("one two three four five")) == 3  # max_length
    assert len(enc.token_ids("")) == 1
    hidden = enc.encode_ids(torch.tensor([ids, ids]))
    assert hidden.shape == (6, 32) and torch.allclose(hidden[:3], hidden[3:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_priced_bytes_are_the_built_parameters(dtype):
    text = build_random_text_encoder("tiny", 0, CPU, dtype)
    vae = build_random_vae("tiny", 0, CPU, dtype)
    assert random_encoder_bytes("text", "tiny", dtype) == parameter_bytes(text.model) > 0
    assert random_encoder_bytes("vae", "tiny", dtype) == parameter_bytes(vae.model) > 0
    # the full ones are priced without a build: Qwen3.5-9B's text model, FLUX.2's VAE
    assert 14 < random_encoder_bytes("text", "full", torch.bfloat16) / 2**30 < 16
    assert 100 < random_encoder_bytes("vae", "full", torch.bfloat16) / 2**20 < 200


def test_the_random_vae_is_a_function_of_its_seed():
    a, b, c = (build_random_vae("tiny", s, CPU, torch.float32) for s in (3, 3, 4))
    assert same(state(a.model), state(b.model)) and not same(state(a.model), state(c.model))
    assert a.identity == b.identity != c.identity
    pixels = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(0)) * 2 - 1
    latents = a.encode(pixels)
    assert latents.shape == (1, 32, 4, 4) and torch.equal(latents, b.encode(pixels))


def test_sizes_follow_the_dit_preset():
    assert random_size("tiny") == "tiny"
    assert random_size("moss-image-5b") == random_size("") == "full"
    assert random_text_config("full").hidden_size == 4096 and random_text_config("tiny").hidden_size == 32
    with pytest.raises(ValueError, match="huge"):
        random_text_config("huge")

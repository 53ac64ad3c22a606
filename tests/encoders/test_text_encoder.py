"""TextEncoder on a tiny random Qwen3.5: the released prompt (chat template with thinking, every token
kept, 4096 cap, one prompt per forward), reference match, layers, layouts, identity."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from kohakumoss.encoders import MAX_TEXT_TOKENS, TextEncoder, TextEncoderConfig
from kohakumoss.encoders.tiny import write_word_tokenizer
from kohakumoss_common.errors import ConfigError

from . import conftest
from .conftest import TEMPLATE, WORDS, write_hf_folder

CAPTIONS = ["a red cat", "", "the quick brown fox jumps over the lazy dog", "cat"]
CHAT = ["<|im_start|>", "user", "<|im_end|>", "<|im_start|>", "assistant", "<think>"]  # around the caption


@pytest.fixture(autouse=True)
def _tokenizer(tokenizer_folder, monkeypatch):
    monkeypatch.setattr(conftest, "TOKENIZER", str(tokenizer_folder))


def load(folder, **kw) -> TextEncoder:
    return conftest.load_text_encoder(folder, **kw)


def tokens(encoder: TextEncoder, caption: str) -> list[str]:
    return encoder.prompts.tokenizer.convert_ids_to_tokens(encoder.prompts(caption))


def reference(model, ids: list[int], index: int) -> torch.Tensor:
    """HF's own `output_hidden_states` of one unpadded prompt."""
    out = model(input_ids=torch.tensor([ids]), output_hidden_states=True, use_cache=False)
    return out.hidden_states[index][0]


def test_defaults_are_the_released_prompt(hf_folder):
    config = TextEncoderConfig(path=str(hf_folder))
    assert config.template == "chat" and config.max_length == MAX_TEXT_TOKENS == 4096
    assert config.layers == (-1,)


def test_chat_template_with_thinking_and_every_token_kept(hf_folder):
    enc = load(hf_folder)
    assert enc.prompts.format("a red cat") == (
        "<|im_start|>user\na red cat<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )
    assert tokens(enc, "a red cat") == [*CHAT[:2], "a", "red", "cat", *CHAT[2:]]
    assert tokens(enc, "") == CHAT  # the empty negative prompt is the template alone
    hidden, lengths = enc.encode(CAPTIONS)
    assert lengths.tolist() == [9, 6, 15, 7]  # caption words + the 6 template tokens, none dropped
    assert hidden.shape == (37, 32) and hidden.dtype == torch.float32 and enc.hidden_size == 32


@pytest.mark.parametrize("layers", [-1, -2, 0, 2])
def test_matches_hf_hidden_states(hf_folder, text_model, layers):
    enc = load(hf_folder, layers=layers)
    hidden, _ = enc.encode(CAPTIONS)
    with torch.no_grad():
        want = torch.cat([reference(text_model, enc.prompts(c), layers) for c in CAPTIONS])
        if layers == -1:  # the final normed output is HF's last_hidden_state
            last = text_model(input_ids=torch.tensor([enc.prompts("cat")]), use_cache=False)
            torch.testing.assert_close(enc.encode(["cat"])[0], last.last_hidden_state[0])
    torch.testing.assert_close(hidden, want, rtol=1e-5, atol=1e-5)


def test_one_unpadded_prompt_per_forward(hf_folder):
    enc = load(hf_folder)
    shapes = []
    handle = enc.model.embed_tokens.register_forward_hook(lambda m, args, out: shapes.append(args[0].shape))
    try:
        hidden, lengths = enc.encode([*CAPTIONS, "a red cat", ""])
    finally:
        handle.remove()
    # one row per forward, exactly the prompt's tokens; repeated captions encoded once
    assert shapes == [(1, n) for n in lengths.tolist()[:4]]
    separately = [enc.encode([c])[0] for c in [*CAPTIONS, "a red cat", ""]]
    assert torch.equal(hidden, torch.cat(separately))


def test_cap_truncates_the_templated_prompt(hf_folder):
    full = load(hf_folder)
    capped = load(hf_folder, max_length=5)
    long = CAPTIONS[2]
    assert capped.prompts(long) == full.prompts(long)[:5]  # right truncation, template suffix lost
    hidden, lengths = capped.encode(CAPTIONS)
    assert lengths.tolist() == [5, 5, 5, 5]
    # the model is causal: the capped prompt's states are the full prompt's first rows
    torch.testing.assert_close(hidden[10:15], full.encode([long])[0][:5], rtol=1e-5, atol=1e-5)


def test_literal_template_keeps_its_tokens(hf_folder):
    literal = load(hf_folder, template=TEMPLATE)
    assert tokens(literal, "a red cat") == ["<|im_start|>", "user", "a", "red", "cat", "<|im_end|>"]
    bare = load(hf_folder, template="{caption}")
    hidden, lengths = bare.encode(["", "cat"])
    assert lengths.tolist() == [1, 1] and hidden.shape[0] == 2  # an empty prompt is one fallback token


def test_tokenizer_without_chat_template_is_named(hf_folder, tmp_path):
    folder = write_word_tokenizer(tmp_path / "tok", WORDS)
    (folder / "chat_template.jinja").unlink()
    with pytest.raises(ConfigError, match="template"):
        load(hf_folder, tokenizer_path=str(folder))
    assert load(hf_folder, tokenizer_path=str(folder), template=TEMPLATE).encode(["cat"])[1].tolist() == [4]


def test_released_layout_language_model_prefix_and_vision_tower(tmp_path, hf_folder, text_model):
    """The released text_encoder/ (Qwen3_5Model): keys `language_model.*`, a `visual.*` tower ignored."""
    folder = write_hf_folder(tmp_path / "released", text_model, prefix="language_model.")
    tensors = load_file(folder / "model.safetensors")
    tensors.pop("lm_head.weight")
    tensors["visual.patch_embed.proj.weight"] = torch.randn(8, 3, 2, 2)
    tensors["visual.blocks.0.attn.qkv.weight"] = torch.randn(24, 8)
    save_file(tensors, folder / "model.safetensors")
    released = load(folder)
    assert torch.equal(released.encode(CAPTIONS)[0], load(hf_folder).encode(CAPTIONS)[0])


def test_pruning_skips_unused_blocks(hf_folder):
    pruned = load(hf_folder, layers=-3)
    full = load(hf_folder, layers=-3, prune_unused_layers=False)
    assert len(pruned.model.layers) == 2 and len(full.model.layers) == 4
    torch.testing.assert_close(pruned.encode(CAPTIONS)[0], full.encode(CAPTIONS)[0])
    assert pruned.identity == full.identity


def test_layer_choice_changes_output(hf_folder):
    last, _ = load(hf_folder, layers=-1).encode(CAPTIONS)
    second, _ = load(hf_folder, layers=-2).encode(CAPTIONS)
    assert not torch.allclose(last, second)
    both, _ = load(hf_folder, layers=[-1, -2], combine="concat").encode(CAPTIONS)
    assert both.shape[1] == 64
    torch.testing.assert_close(both, torch.cat([last, second], dim=1))
    mean, _ = load(hf_folder, layers=[-1, -2]).encode(CAPTIONS)
    torch.testing.assert_close(mean, (last + second) / 2)


def test_deterministic_and_identity(hf_folder):
    a = load(hf_folder)
    assert torch.equal(a.encode(CAPTIONS)[0], a.encode(CAPTIONS)[0])
    assert a.identity == load(hf_folder).identity
    assert a.identity != load(hf_folder, layers=-2).identity
    assert a.identity != load(hf_folder, template="{caption}").identity
    assert a.identity != load(hf_folder, max_length=8).identity
    assert a.layer_choice == (-1,) and a.template == "chat"


@pytest.mark.parametrize(
    "kw, knob",
    [
        ({"template": "no placeholder"}, "template"),
        ({"combine": "sum"}, "combine"),
        ({"layers": []}, "layers"),
        ({"dtype": "int8"}, "dtype"),
        ({"max_length": 0}, "max_length"),
    ],
)
def test_bad_config_is_named(hf_folder, kw, knob):
    with pytest.raises(ConfigError, match=knob):
        TextEncoderConfig(path=str(hf_folder), **kw)


def test_layer_out_of_range(hf_folder):
    with pytest.raises(ConfigError, match="layers"):
        load(hf_folder, layers=9)


@pytest.mark.gpu
def test_cuda_bf16_close_to_cpu_fp32(hf_folder):
    cpu, _ = load(hf_folder).encode(CAPTIONS)
    gpu = load(hf_folder, device="cuda", dtype="bfloat16")
    hidden, lengths = gpu.encode(CAPTIONS)
    assert hidden.device.type == "cuda" and hidden.dtype == torch.bfloat16
    err = (hidden.float().cpu() - cpu).norm() / cpu.norm()
    assert err < 3e-2, err

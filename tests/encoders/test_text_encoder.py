"""TextEncoder on a tiny random Qwen3.5: packing, reference match, layers, template, identity."""

from __future__ import annotations

import pytest
import torch

from kohakumoss.encoders import TextEncoder, TextEncoderConfig
from kohakumoss_common.errors import ConfigError

from . import conftest
from .conftest import TEMPLATE

CAPTIONS = ["a red cat", "", "the quick brown fox jumps over the lazy dog", "cat"]


@pytest.fixture(autouse=True)
def _tokenizer(tokenizer_folder, monkeypatch):
    monkeypatch.setattr(conftest, "TOKENIZER", str(tokenizer_folder))


def load(folder, **kw) -> TextEncoder:
    return conftest.load_text_encoder(folder, **kw)


def reference(model, encoder: TextEncoder, caption: str, index: int) -> torch.Tensor:
    """The caption's rows of HF's own `output_hidden_states`, one unpadded prompt at a time."""
    p = encoder.prompts(caption)
    out = model(input_ids=torch.tensor([p.ids]), output_hidden_states=True, use_cache=False)
    return out.hidden_states[index][0, p.start : p.end]


def test_packed_shapes_and_lengths(hf_folder):
    enc = load(hf_folder)
    hidden, lengths = enc.encode(CAPTIONS)
    assert lengths.tolist() == [3, 1, 9, 1]
    assert lengths.dtype == torch.long
    assert hidden.shape == (14, 32) and hidden.dtype == torch.float32
    assert enc.hidden_size == 32


@pytest.mark.parametrize("layers", [-1, -2, 0, 2])
def test_matches_hf_hidden_states(hf_folder, text_model, layers):
    enc = load(hf_folder, layers=layers)
    hidden, lengths = enc.encode(CAPTIONS)
    with torch.no_grad():
        want = torch.cat([reference(text_model, enc, c, layers) for c in CAPTIONS])
    torch.testing.assert_close(hidden, want, rtol=1e-5, atol=1e-5)


def test_batch_equals_one_by_one(hf_folder):
    enc = load(hf_folder, micro_batch=3)
    hidden, _ = enc.encode(CAPTIONS)
    single = torch.cat([enc.encode([c])[0] for c in CAPTIONS])
    torch.testing.assert_close(hidden, single, rtol=1e-5, atol=1e-5)


def test_deterministic(hf_folder):
    enc = load(hf_folder)
    a, _ = enc.encode(CAPTIONS)
    b, _ = enc.encode(CAPTIONS)
    assert torch.equal(a, b)


def test_layer_choice_changes_output(hf_folder):
    last, _ = load(hf_folder, layers=-1).encode(CAPTIONS)
    second, _ = load(hf_folder, layers=-2).encode(CAPTIONS)
    assert not torch.allclose(last, second)
    both, _ = load(hf_folder, layers=[-1, -2], combine="concat").encode(CAPTIONS)
    assert both.shape[1] == 64
    torch.testing.assert_close(both, torch.cat([last, second], dim=1))
    mean, _ = load(hf_folder, layers=[-1, -2]).encode(CAPTIONS)
    torch.testing.assert_close(mean, (last + second) / 2)


def test_pruning_skips_unused_blocks(hf_folder):
    pruned = load(hf_folder, layers=-3)
    full = load(hf_folder, layers=-3, prune_unused_layers=False)
    assert len(pruned.model.layers) == 2 and len(full.model.layers) == 4
    torch.testing.assert_close(pruned.encode(CAPTIONS)[0], full.encode(CAPTIONS)[0])
    assert pruned.identity == full.identity


def test_template_tokens_dropped_or_kept(hf_folder):
    dropped = load(hf_folder)
    kept = load(hf_folder, keep_template_tokens=True)
    assert dropped.encode(["a red cat"])[1].tolist() == [3]
    assert kept.encode(["a red cat"])[1].tolist() == [6]  # <|im_start|> user a red cat <|im_end|>
    no_template = load(hf_folder, template="{caption}")
    hidden, lengths = no_template.encode(["", "cat"])
    assert lengths.tolist() == [1, 1] and hidden.shape[0] == 2


def test_max_length_truncates_caption(hf_folder):
    _, lengths = load(hf_folder, max_length=4).encode(CAPTIONS)
    assert lengths.tolist() == [3, 1, 4, 1]


def test_identity(hf_folder):
    a = load(hf_folder)
    assert a.identity == load(hf_folder).identity
    assert a.identity != load(hf_folder, layers=-2).identity
    assert a.identity != load(hf_folder, template="{caption}").identity
    assert a.layer_choice == (-1,) and a.template == TEMPLATE


@pytest.mark.parametrize(
    "kw, knob",
    [
        ({"template": "no placeholder"}, "template"),
        ({"combine": "sum"}, "combine"),
        ({"layers": []}, "layers"),
        ({"dtype": "int8"}, "dtype"),
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

"""References in the text encoder's prompt (reference_prompt='picture'): the `Picture N:` prefix before
the caption, the vision tower's tokens at the `<|image_pad|>`s (against transformers' own
Qwen3_5ForConditionalGeneration), <= 384^2 px per reference, the identity, the refusals, 'none'."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from PIL import Image
from transformers.models.qwen3_5 import Qwen3_5ForConditionalGeneration

from kohakumoss.encoders import TextEncoder
from kohakumoss.encoders.text_vision import IMAGE_PAD, VISION_END, VISION_START, downscale
from kohakumoss.encoders.tiny import write_tiny_text_encoder
from kohakumoss_common.errors import ConfigError, DataError
from kohakumoss_data.cache_keys import text_key
from kohakumoss_data.encode import caption_embeddings

CAPTIONS = ["make the cat blue", "a red cat"]


def picture(h: int, w: int, seed: int = 0) -> Image.Image:
    return Image.fromarray(np.random.RandomState(seed).randint(0, 255, (h, w, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def vision_config(tmp_path_factory):
    """A tiny text-encoder checkpoint holding a vision tower (model.visual.*), references in the prompt."""
    config = write_tiny_text_encoder(tmp_path_factory.mktemp("te_vision"), CAPTIONS, vision=True)
    return dataclasses.replace(config, reference_prompt="picture")


@pytest.fixture(scope="module")
def encoder(vision_config) -> TextEncoder:
    return TextEncoder.load(vision_config)


def tokens(encoder: TextEncoder, ids) -> list[str]:
    return encoder.prompts.tokenizer.convert_ids_to_tokens(list(ids))


def test_picture_prefix_before_the_caption(encoder):
    pixel_values, grid, counts = encoder.vision.prepare([picture(64, 96), picture(32, 32, 1)])
    assert grid.tolist() == [[1, 4, 6], [1, 2, 2]] and counts == [6, 1]  # patch 16, merge 2
    text = encoder.prompts.format("x")
    assert text.startswith("<|im_start|>user\n")
    seen = []
    real = encoder._multimodal.forward

    def spy(**kw):
        seen.append(kw)
        return real(**kw)

    encoder._multimodal.forward = spy
    try:
        hidden, lengths = encoder.encode(["make the cat blue"], [[picture(64, 96), picture(32, 32, 1)]])
    finally:
        del encoder._multimodal.forward
    words = tokens(encoder, seen[0]["input_ids"][0])
    pads = [IMAGE_PAD] * 6
    prefix = ["picture", "1:", VISION_START, *pads, VISION_END, "picture", "2:", VISION_START, IMAGE_PAD]
    assert words[2:19] == [*prefix, VISION_END, "make", "the", "cat", "blue", "<|im_end|>"][:17]
    assert words[:2] == ["<|im_start|>", "user"] and words[-2:] == ["assistant", "<think>"]
    assert seen[0]["mm_token_type_ids"][0].tolist() == [int(w == IMAGE_PAD) for w in words]
    assert lengths.tolist() == [len(words)] and hidden.shape == (len(words), 32)


def test_hidden_states_are_transformers_own(encoder, vision_config):
    """The assembled Qwen3_5Model (M-RoPE positions, image features at the pads) against transformers'
    own model loaded from the same folder."""
    refs = [picture(64, 96), picture(48, 80, 2)]
    hidden, _ = encoder.encode(["make the cat blue"], [refs])
    pixel_values, grid, counts = encoder.vision.prepare(refs)
    from kohakumoss.encoders.text_vision import reference_prefix

    text = encoder.prompts.format(reference_prefix(counts) + "make the cat blue")
    ids = torch.tensor([encoder.prompts.tokenizer(text)["input_ids"]])
    pad = encoder.vision.token_ids[IMAGE_PAD]
    hf = Qwen3_5ForConditionalGeneration.from_pretrained(vision_config.path, dtype=torch.float32).eval()
    hf.config.image_token_id = hf.model.config.image_token_id = pad
    with torch.no_grad():
        out = hf.model(
            input_ids=ids,
            pixel_values=pixel_values,
            image_grid_thw=grid,
            mm_token_type_ids=(ids == pad).int(),
            use_cache=False,
        )
    torch.testing.assert_close(hidden, out.last_hidden_state[0], rtol=1e-4, atol=1e-4)


def test_references_change_the_caption_tokens_and_equal_images_share_one_forward(encoder):
    plain, plain_len = encoder.encode(["a red cat"])
    with_ref, lengths = encoder.encode(
        ["a red cat", "a red cat", "a red cat"], [[picture(64, 64)], [], [picture(64, 64, 5)]]
    )
    a, b, c = torch.split(with_ref, lengths.tolist())
    torch.testing.assert_close(b, plain)  # no references: the text-to-image prompt
    assert a.shape[0] == plain_len.item() + 2 + 2 + 4  # "picture 1:", vision start / end, 4 tokens
    assert not torch.allclose(a[-4:], c[-4:])  # another picture: other caption states
    calls = []
    real = encoder._with_references
    encoder._with_references = lambda *a: calls.append(a) or real(*a)
    try:
        encoder.encode(["a red cat"] * 2, [[picture(64, 64)], [picture(64, 64)]])
    finally:
        del encoder._with_references
    assert len(calls) == 1


def test_references_downscaled_to_384_squared_never_up():
    big = downscale(picture(1000, 600), 384 * 384)
    assert big.size[0] * big.size[1] <= 384 * 384 and abs(big.size[0] / big.size[1] - 0.6) < 0.01
    assert downscale(picture(64, 96), 384 * 384).size == (96, 64)


def test_identity_names_the_reference_settings(vision_config, encoder):
    plain = TextEncoder.load(dataclasses.replace(vision_config, reference_prompt="none"))
    assert plain.vision is None and not plain.references_in_prompt
    assert plain.identity != encoder.identity  # picture-mode keys never collide with text-only ones
    smaller = TextEncoder.load(dataclasses.replace(vision_config, reference_max_pixels=128 * 128))
    assert smaller.identity != encoder.identity
    # 'none' (ComfyUI's Moss-Image-Edit LoRA format): the references are not read
    hidden, _ = plain.encode(["a red cat"], [[picture(64, 64)]])
    torch.testing.assert_close(hidden, plain.encode(["a red cat"])[0])


def test_no_vision_tower_refused_by_name(tmp_path):
    config = write_tiny_text_encoder(tmp_path, CAPTIONS)  # text model only
    with pytest.raises(ConfigError, match=r"text_encoder.reference_prompt.*model.*no vision tower"):
        TextEncoder.load(dataclasses.replace(config, reference_prompt="picture"))
    with pytest.raises(ConfigError, match="reference_prompt"):
        dataclasses.replace(config, reference_prompt="bare")


def test_vision_tokens_over_the_cap_refused(vision_config):
    encoder = TextEncoder.load(dataclasses.replace(vision_config, max_length=12))
    with pytest.raises(ConfigError, match="max_length.*reference images take"):
        encoder.encode(["a red cat"], [[picture(128, 128)]])
    hidden, lengths = encoder.encode(["a red cat"], [[picture(32, 32)]])  # the caption is cut, not a picture
    assert lengths.tolist() == [12]


class _Cache(dict):
    def get(self, key):  # TensorCache's get / put
        return super().get(key)

    def put(self, key, value):
        self[key] = value


def test_text_cache_keyed_by_the_references_in_the_prompt(encoder):
    reads = []

    def ref(digest: str, seed: int):
        return (digest, lambda: reads.append(digest) or picture(64, 64, seed))

    cache = _Cache()
    captions = ["a red cat"] * 3
    hidden, lengths, hits = caption_embeddings(
        captions, encoder, cache, references=[[ref("h1", 1)], [ref("h2", 2)], [ref("h1", 1)]]
    )
    assert hits == 0 and len(cache) == 2 and reads == ["h1", "h2"]  # one entry per distinct reference
    a, b, c = torch.split(hidden, lengths.tolist())
    torch.testing.assert_close(a, c)
    assert not torch.allclose(a, b)
    again, lengths, hits = caption_embeddings(
        captions, encoder, cache, references=[[ref("h1", 1)], [ref("h2", 2)], []]
    )
    assert hits == 2 and reads == ["h1", "h2"]  # a hit never reads its image
    assert len(cache) == 3  # no references: the text-to-image prompt, an entry of its own
    torch.testing.assert_close(torch.split(again, lengths.tolist())[2], encoder.encode(["a red cat"])[0])
    with pytest.raises(DataError, match="puts reference images in the prompt"):
        caption_embeddings(captions, encoder, cache)  # an edit run's batch must hand them over


def test_text_only_keys_unchanged():
    """Existing text caches stay valid: no references, the key of before."""
    from kohakumoss_common.hashing import sha256_json

    old = sha256_json({"caption": "c", "template": "t", "encoder": "e", "layer": [-1]})
    assert text_key("c", "t", "e", [-1]) == text_key("c", "t", "e", [-1], ()) == old
    assert text_key("c", "t", "e", [-1], ["h"]) != old


def test_token_count_and_span_without_reading_the_images(encoder):
    """The processor's counts from sizes alone (large ones downscaled to 384^2 first), and the prompt
    span the encoder refuses past MAX_TEXT_TOKENS: what the trainer checks before its first step."""
    sizes = [(64, 96), (1000, 600), (33, 47), (384, 384)]
    _, _, counts = encoder.vision.prepare([picture(h, w) for w, h in sizes])
    assert [encoder.vision.token_count(w, h) for w, h in sizes] == counts
    assert counts[3] == 144  # patch 16, merge 2: 12 x 12
    seen = []
    real = encoder._multimodal.forward
    encoder._multimodal.forward = lambda **kw: seen.append(kw["input_ids"][0].tolist()) or real(**kw)
    try:
        encoder.encode(["a red cat"], [[picture(96, 64), picture(47, 33)]])
    finally:
        del encoder._multimodal.forward
    pad = encoder.vision.token_ids[IMAGE_PAD]
    last = max(i for i, t in enumerate(seen[0]) if t == pad)
    assert encoder.reference_span([(64, 96), (33, 47)]) == last + 1


def test_the_plan_counts_the_rows_the_references_add(vision_config, encoder):
    """`reference_prompt_tokens` (what the plan budgets, from sizes alone) is exactly the rows the
    references add to an encoded caption; the trainer takes it from the encoder (CacheOnly too), and
    none from an encoder whose prompt shows no references."""
    from kohakumoss.train.data import reference_prompt_counter

    images = [picture(64, 96), picture(600, 1000, 1), picture(47, 33, 2)]
    sizes = tuple(im.size for im in images)
    for caption in ("a red cat", "make the cat blue", ""):
        _, plain = encoder.encode([caption])
        _, shown = encoder.encode([caption], [images])
        assert encoder.reference_prompt_tokens(sizes) == int(shown[0] - plain[0]) > 3 * 4
    count = reference_prompt_counter(type("CacheOnly", (), {"encoder": encoder})())
    assert count is not None and count(sizes) == encoder.reference_prompt_tokens(sizes)
    plain = TextEncoder.load(dataclasses.replace(vision_config, reference_prompt="none"))
    assert plain.reference_prompt_tokens(sizes) == 0 and reference_prompt_counter(plain) is None
    assert reference_prompt_counter(None) is None

"""The loader with the project's real encoder classes (tiny random weights, no hub): the protocol fits."""

from __future__ import annotations

import pytest
import torch

from kohakumoss_data import (
    Loader,
    LoaderKnobs,
    PlanKnobs,
    ScanKnobs,
    build_plan,
    make_source,
    open_caches,
    scan,
)

encoders = pytest.importorskip("kohakumoss.encoders", reason="kohakumoss.encoders is not importable")
helpers = pytest.importorskip("tests.encoders.conftest", reason="the encoder test helpers are not importable")


@pytest.fixture(scope="module")
def real_encoders(tmp_path_factory):
    root = tmp_path_factory.mktemp("real_encoders")
    folder = helpers.write_hf_folder(root / "qwen", helpers.random_text_model())
    tokenizer = helpers.make_tokenizer(root / "tokenizer")

    def text(template: str = helpers.TEMPLATE):
        config = encoders.TextEncoderConfig(
            path=str(folder), tokenizer_path=str(tokenizer), template=template, dtype="float32"
        )
        return encoders.TextEncoder.load(config)

    return helpers.random_vae(), text


def test_loader_with_real_encoder_classes(kohya_dir, tmp_path, real_encoders):
    vae, make_text = real_encoders
    text = make_text()
    source = make_source({"kind": "kohya", "path": str(kohya_dir)})
    catalog = scan(source, ScanKnobs(workers=2), cache_dir=tmp_path / "catalogs")
    plan = build_plan(catalog, 0, PlanKnobs(area=64 * 64, tokens_per_step=80, epochs=1))
    latents, texts = open_caches(str(tmp_path / "cache"), vae, text)
    first = list(Loader(plan, catalog, source, vae, text, latents, texts, LoaderKnobs(workers=1)))
    for batch in first:
        for latent, (w, h) in zip(batch.latents, batch.sizes):
            assert latent.shape[1:] == (h // 8, w // 8) and torch.isfinite(latent).all()
        assert batch.text_hidden.shape[0] == int(batch.text_lengths.sum())
    latents, texts = open_caches(str(tmp_path / "cache"), vae, text)
    again = list(Loader(plan, catalog, source, vae, text, latents, texts, LoaderKnobs(workers=1)))
    assert all(b.hits["latent"] == len(b.keys) and b.hits["text"] == len(b.keys) for b in again)
    other = make_text("<|im_start|>assistant {caption}<|im_end|>")
    encoded: list[str] = []
    real_encode = other.encode
    other.encode = lambda captions: (encoded.extend(captions), real_encode(captions))[1]
    _, other_texts = open_caches(str(tmp_path / "cache"), vae, other)
    third = list(Loader(plan, catalog, source, vae, other, latents, other_texts, LoaderKnobs(workers=1)))
    assert sorted(encoded) == sorted({c for b in third for c in b.captions})  # each once, none reused

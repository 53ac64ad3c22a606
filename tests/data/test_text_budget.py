"""The text token budget: the plan counts the template's tokens, the loader keeps at most MAX_TEXT_TOKENS."""

from __future__ import annotations

import dataclasses

import torch

from kohakumoss_data import Loader, LoaderKnobs, PlanKnobs, ScanKnobs, build_plan, make_source, scan
from kohakumoss_data.encode import caption_embeddings

from .fakes import FakeTextEncoder

KNOBS = PlanKnobs(area=64 * 64, tokens_per_step=400, epochs=1)


def test_the_plan_counts_the_template_tokens(kohya_dir, tmp_path):
    source = make_source({"kind": "kohya", "path": str(kohya_dir)})
    catalog = scan(source, ScanKnobs(workers=1), cache_dir=tmp_path / "c")
    plain = build_plan(catalog, 1, dataclasses.replace(KNOBS, max_text_tokens=512))
    templated = build_plan(catalog, 1, dataclasses.replace(KNOBS, max_text_tokens=512, template_tokens=9))
    pairs = [(a, b) for s, t in zip(plain.steps, templated.steps) for a, b in zip(s, t)]
    assert pairs and all(b.text_tokens == a.text_tokens + 9 for a, b in pairs)
    capped = build_plan(catalog, 1, dataclasses.replace(KNOBS, max_text_tokens=4, template_tokens=9))
    assert {it.text_tokens for step in capped.steps for it in step} == {4}


def test_the_loader_keeps_at_most_max_text_tokens(kohya_dir, tmp_path):
    source = make_source({"kind": "kohya", "path": str(kohya_dir)})
    catalog = scan(source, ScanKnobs(workers=1), cache_dir=tmp_path / "c")
    plan = build_plan(catalog, 1, dataclasses.replace(KNOBS, max_text_tokens=5))
    text = FakeTextEncoder()  # returns up to 12 rows: more than the budget
    batches = list(Loader(plan, catalog, source, text_encoder=text, knobs=LoaderKnobs(workers=0)))
    full, lengths, _ = caption_embeddings(batches[0].captions, text, None)
    assert int(lengths.max()) > 5  # the encoder alone exceeds the budget
    for batch in batches:
        assert int(batch.text_lengths.max()) <= 5
        assert batch.text_hidden.shape[0] == int(batch.text_lengths.sum())
    cut = torch.cat([h[:5] for h in torch.split(full, lengths.tolist())])
    assert torch.equal(batches[0].text_hidden, cut)  # the first rows, as a right-truncating tokenizer keeps


def test_the_trainer_counts_its_templates_tokens(tmp_path):
    from kohakumoss.encoders import TextEncoderConfig
    from kohakumoss.encoders.text import load_prompt_tokenizer
    from kohakumoss.encoders.tiny import write_word_tokenizer
    from kohakumoss.train.data import template_token_count

    folder = write_word_tokenizer(tmp_path / "tok", ["a cat"])
    config = TextEncoderConfig(
        path=str(tmp_path), tokenizer_path=str(folder), template="photo of {caption} here"
    )

    class Stub:  # what template_token_count reads of a loaded encoder (and of CacheOnly's .encoder)
        prompts = load_prompt_tokenizer(config)

    n = template_token_count(Stub())
    assert n == len(Stub.prompts("")) == len(Stub.prompts("a cat")) - 2 > 0
    assert template_token_count(type("CacheOnly", (), {"encoder": Stub()})()) == n
    assert template_token_count(None) == 0 and template_token_count(FakeTextEncoder()) == 0

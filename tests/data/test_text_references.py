"""An edit run's text encoder that puts reference images in its prompt: the loader and the offline fill
hand it each caption's whole reference images (read only on a cache miss), and key each entry by their
hashes, so both fill and read the same entries."""

from __future__ import annotations

import dataclasses

import torch

from kohakumoss_data import Loader, LoaderKnobs, build_plan, open_caches
from kohakumoss_data.offline import fill_text_cache, planned_prompts

from .test_references import KNOBS, kohya_refs, scanned  # noqa: F401  (kohya_refs: the fixture)


class PictureEncoder:
    """Stands in for TextEncoder(reference_prompt='picture'): one row per caption word and per reference,
    each reference row its (width, height)."""

    references_in_prompt = True
    identity, template, layer_choice = "picture-encoder", "{caption}", (-1,)

    def __init__(self):
        self.calls: list[list[tuple[str, list[tuple[int, int]]]]] = []

    def encode(self, captions, references=None):
        refs = references or [[] for _ in captions]
        self.calls.append([(c, [im.size for im in r]) for c, r in zip(captions, refs)])
        rows = [
            [torch.full((2,), float(len(w))) for w in c.split()]
            + [torch.tensor([*im.size], dtype=torch.float) for im in r]
            for c, r in zip(captions, refs)
        ]
        return torch.stack([v for r in rows for v in r]), torch.tensor([len(r) for r in rows])


def test_loader_and_fill_hand_over_the_references_and_key_by_them(kohya_refs, tmp_path):  # noqa: F811
    root, refs = kohya_refs
    source, catalog = scanned({"kind": "kohya", "path": str(root), "references": str(refs)}, tmp_path)
    plan = build_plan(catalog, 3, dataclasses.replace(KNOBS, epochs=1))
    sizes = {it.key: [(r["width"], r["height"]) for r in it.references] for it in catalog.usable}

    online = PictureEncoder()
    batches = list(Loader(plan, catalog, source, text_encoder=online, knobs=LoaderKnobs(workers=0)))
    seen = dict((c, s) for call in online.calls for c, s in call)
    for batch in batches:
        for caption, key in zip(batch.captions, batch.keys):
            assert seen[caption] == sizes[key]  # the whole images, in order, not the planned crops
    assert seen["make it a"] == [(80, 64), (64, 96), (64, 64)]

    filler = PictureEncoder()
    _, cache = open_caches(str(tmp_path / "cache"), None, filler)
    captions, references = planned_prompts(plan, catalog, source)
    report = fill_text_cache(captions, filler, cache, progress=False, references=references)
    assert report.encoded == len(seen) and filler.calls

    reader = PictureEncoder()
    _, cached = open_caches(str(tmp_path / "cache"), None, reader)
    again = list(
        Loader(plan, catalog, source, text_encoder=reader, text_cache=cached, knobs=LoaderKnobs(workers=0))
    )
    assert reader.calls == []  # every entry the fill wrote is the one the loader reads
    for a, b in zip(batches, again):
        torch.testing.assert_close(a.text_hidden, b.text_hidden)
        assert b.hits["text"] == len(b.captions)

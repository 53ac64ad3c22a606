"""Run the passed-in encoders on cache misses only, grouping same-size images into one call."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import torch

from kohakumoss_common.errors import DataError

from .cache import TensorCache
from .cache_keys import text_key
from .decode import open_image, to_rgb
from .protocols import ImageEncoder, TextEncoder
from .transform import to_model_range

WRITE_BACK = True  # a miss encoded in the step is stored (LoaderKnobs.write_back's default)


@torch.no_grad()
def encode_images(
    encoder: ImageEncoder, pixels: list[torch.Tensor], max_batch: int = 16
) -> list[torch.Tensor]:
    """uint8 [3,H,W] images (any mix of sizes) -> one latent per image, on the CPU, in order."""
    groups: dict[tuple[int, ...], list[int]] = defaultdict(list)
    for i, p in enumerate(pixels):
        groups[tuple(p.shape)].append(i)
    out: list[torch.Tensor | None] = [None] * len(pixels)
    for indices in groups.values():
        for start in range(0, len(indices), max_batch):
            chunk = indices[start : start + max_batch]
            latents = encoder.encode(to_model_range(torch.stack([pixels[i] for i in chunk])))
            for i, latent in zip(chunk, latents.to("cpu")):
                out[i] = latent.clone()
    return out  # type: ignore[return-value]


# a reference image the text encoder may put in its prompt: (its content hash, a reader of its pixels
# called only when the prompt is encoded: a cache hit never decodes the image)
PromptReference = tuple[str, Callable[[], Any]]


def references_in_prompt(encoder: TextEncoder) -> bool:
    """Whether `encoder` puts reference images before the caption (then they are part of each key)."""
    return bool(getattr(encoder, "references_in_prompt", False))


def prompt_text_key(caption: str, encoder: TextEncoder, reference_hashes: Sequence[str] = ()) -> str:
    """The text-cache key of a caption as `encoder` encodes it: with its references' hashes when the
    encoder puts them in the prompt."""
    refs = list(reference_hashes) if references_in_prompt(encoder) else []
    return text_key(caption, encoder.template, encoder.identity, encoder.layer_choice, refs)


def reference_reader(source: Any, locator: Any) -> Callable[[], Any]:
    """A reader of one whole reference image (upright RGB) from its dataset's source."""
    return lambda: to_rgb(open_image(source.read_reference(locator)))


@torch.no_grad()
def encode_texts(
    encoder: TextEncoder, captions: list[str], references: Sequence[Sequence[Any]] | None = None
) -> list[torch.Tensor]:
    """Captions (with each one's reference images, when given) -> one [len, D] hidden-state tensor per
    caption, on the CPU."""
    if not captions:
        return []
    if references is None:
        hidden, lengths = encoder.encode(captions)
    else:
        hidden, lengths = encoder.encode(captions, references)
    return [h.clone() for h in torch.split(hidden.to("cpu"), [int(n) for n in lengths.tolist()])]


def caption_embeddings(
    captions: list[str],
    encoder: TextEncoder,
    cache: TensorCache | None,
    write_back: bool = WRITE_BACK,
    max_tokens: int | None = None,
    references: Sequence[Sequence[PromptReference]] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Packed (hidden [sum_len, D], lengths [B]) for `captions`, reading the cache first; returns hits too.

    Each caption keeps at most `max_tokens` rows (the plan's max_text_tokens), whatever the encoder
    returned: for a causal encoder the first n hidden states are those of the first n tokens, so this
    is the tokenizer's right truncation, applied to encoders and cache entries that did not cut.
    references: per caption, its reference images (`PromptReference`); an encoder that puts them in
    its prompt keys each entry by their hashes too, and must be given them."""
    in_prompt = references_in_prompt(encoder)
    if in_prompt and references is None:
        raise DataError(
            "the text encoder puts reference images in the prompt, but the batch passed none "
            "(an edit run's loader hands each caption's references)"
        )
    refs = [list(r) for r in references] if in_prompt and references is not None else [[] for _ in captions]
    keys = [prompt_text_key(c, encoder, [h for h, _ in r]) for c, r in zip(captions, refs, strict=True)]
    found: dict[str, torch.Tensor] = {}
    if cache is not None:
        for k in set(keys):
            hit = cache.get(k)
            if hit is not None:
                found[k] = hit
    hits = sum(1 for k in keys if k in found)
    missing = list({k: (k, c, r) for k, c, r in zip(keys, captions, refs) if k not in found}.values())
    images = [[read() for _, read in r] for _, _, r in missing] if in_prompt else None
    for (k, _, _), hidden in zip(missing, encode_texts(encoder, [c for _, c, _ in missing], images)):
        found[k] = hidden
        if cache is not None and write_back:
            cache.put(k, hidden)
    parts = [found[k] if max_tokens is None else found[k][:max_tokens] for k in keys]
    lengths = torch.tensor([p.shape[0] for p in parts], dtype=torch.long)
    return torch.cat(parts, 0), lengths, hits

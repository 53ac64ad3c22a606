"""Fill the latent and text caches ahead of training: resumable, skipping what is already cached."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, replace

from kohakumoss_common.progress import Progress

from .cache import TensorCache
from .cache_keys import latent_key
from .catalog import Catalog
from .encode import (
    PromptReference,
    encode_images,
    encode_texts,
    prompt_text_key,
    reference_reader,
    references_in_prompt,
)
from .loader import stop_pool, worker_pool
from .ordered_map import bounded_map
from .plan import Plan, PlannedItem, item_where, reference_item
from .protocols import ImageEncoder, TextEncoder
from .sources.base import Source
from .transform import to_chw
from .worker import ItemTask, run_task

LATENT_BATCH = 8  # images per VAE call (the trainer's; the data scripts' BATCH_SIZE knob's default)


@dataclass
class FillReport:
    total: int
    skipped: int
    encoded: int

    def summary(self, kind: str) -> str:
        return f"{kind}: {self.total} planned, {self.skipped} already cached, {self.encoded} encoded"


def planned_latents(plan: Plan, vae_identity: str) -> dict[str, tuple[PlannedItem, int | None]]:
    """Every distinct latent the plan asks for, by cache key, in plan order: (the planned image, None) for
    an item, (the reference as an image, its place in the item's references) for a reference."""
    out: dict[str, tuple[PlannedItem, int | None]] = {}
    for step in plan.steps:
        for item in step:
            out.setdefault(latent_key(item, vae_identity), (item, None))
            for k, ref in enumerate(item.references):
                as_item = reference_item(item, ref)
                out.setdefault(latent_key(as_item, vae_identity), (as_item, k))
    return out


def _run(task: ItemTask, source: Source | None = None) -> tuple[ItemTask, object]:
    return task, run_task(task, source, None).pixels


def fill_latent_cache(
    plan: Plan,
    catalog: Catalog,
    source: Source,
    encoder: ImageEncoder,
    cache: TensorCache,
    workers: int,
    batch_size: int = LATENT_BATCH,
    progress: bool = True,
) -> FillReport:
    """Encode every planned latent not yet in `cache`; shards are written as they fill (resumable)."""
    wanted = planned_latents(plan, encoder.identity)
    todo = [(k, it, ref) for k, (it, ref) in wanted.items() if k not in cache]
    by_key = {it.key: it for it in catalog.usable}

    def locator(key: str, ref: int | None) -> object:
        return by_key[key].locator if ref is None else by_key[key].references[ref]["locator"]

    # the latents only: loss masks are the trainer's, so a cache fill neither reads nor needs them
    tasks = [
        ItemTask(locator(it.key, ref), replace(it, mask=""), k, reference=ref is not None)
        for k, it, ref in todo
    ]
    pool = worker_pool(workers, source, None)
    pending: dict[tuple[int, int], list[tuple[str, object]]] = defaultdict(list)
    results: Iterator = (
        bounded_map(pool, _run, tasks, 4 * max(1, workers)) if pool else (_run(t, source) for t in tasks)
    )
    bar = Progress(len(tasks) if progress else 0, "latents", "img")
    try:
        for task, pixels in results:
            bar.update(1)
            group = pending[task.item.target]
            group.append((task.latent_key, pixels))
            if len(group) >= batch_size:
                _encode_group(group, encoder, cache)
        for group in pending.values():
            _encode_group(group, encoder, cache)
    finally:
        bar.close()
        cache.flush()
        if pool is not None:
            stop_pool(pool)  # a worker stuck in a read cannot hang Ctrl-C or an error
    return FillReport(len(wanted), len(wanted) - len(todo), len(todo))


def _encode_group(group: list[tuple[str, object]], encoder: ImageEncoder, cache: TensorCache) -> None:
    if not group:
        return
    latents = encode_images(encoder, [to_chw(p) for _, p in group], max_batch=len(group))
    for (key, _), latent in zip(group, latents):
        cache.put(key, latent)
    group.clear()


def captions_by_item(plan: Plan, catalog: Catalog) -> Iterator[tuple[str, str]]:
    """(the item as an error names it, its caption) of every planned occurrence."""
    several = catalog.source.get("kind") == "concat"
    where: dict[str, str] = {}
    for step in plan.steps:
        for it in step:
            if it.key not in where:
                where[it.key] = item_where(catalog, it.key, several)
            yield where[it.key], it.caption


def planned_captions(plan: Plan) -> list[str]:
    return list(dict.fromkeys(it.caption for step in plan.steps for it in step))


def planned_prompts(
    plan: Plan, catalog: Catalog, source: Source
) -> tuple[list[str], list[list[PromptReference]]]:
    """Every distinct (caption, references) of the plan, in plan order: the prompts a text encoder that
    puts references in its prompt encodes (each reference with a reader of its image)."""
    locators = {it.key: [r["locator"] for r in it.references] for it in catalog.usable}
    out: dict[tuple[str, tuple[str, ...]], list[PromptReference]] = {}
    for step in plan.steps:
        for it in step:
            key = (it.caption, tuple(r.hash for r in it.references))
            if key not in out:
                pairs = zip(it.references, locators.get(it.key, []))
                out[key] = [(r.hash, reference_reader(source, loc)) for r, loc in pairs]
    return [caption for caption, _ in out], list(out.values())


def fill_text_cache(
    captions: list[str],
    encoder: TextEncoder,
    cache: TensorCache,
    batch_size: int = 16,
    progress: bool = True,
    references: list[list[PromptReference]] | None = None,
) -> FillReport:
    """Encode every caption whose (caption, template, encoder, layer) key is not in `cache` yet;
    references: per caption (`planned_prompts`), put in the prompt and the key by an encoder that
    takes them."""
    in_prompt = references_in_prompt(encoder) and references is not None
    refs = references if in_prompt else [[] for _ in captions]
    keyed = {prompt_text_key(c, encoder, [h for h, _ in r]): (c, r) for c, r in zip(captions, refs)}
    todo = [(k, c, r) for k, (c, r) in keyed.items() if k not in cache]
    bar = Progress(len(todo) if progress else 0, "text", "caption")
    try:
        for start in range(0, len(todo), batch_size):
            chunk = todo[start : start + batch_size]
            images = [[read() for _, read in r] for _, _, r in chunk] if in_prompt else None
            for (key, _, _), hidden in zip(chunk, encode_texts(encoder, [c for _, c, _ in chunk], images)):
                cache.put(key, hidden)
            bar.update(len(chunk))
    finally:
        bar.close()
        cache.flush()
    return FillReport(len(keyed), len(keyed) - len(todo), len(todo))

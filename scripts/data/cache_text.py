"""Encode every planned caption with the text encoder into the text cache (safetensors shards).

    kogine run scripts/data/cache_text.py --config my_data.py --set TEXT_KWARGS='{"path": "models/qwen"}'

Resumable and skips what exists. Keyed by (caption, template, encoder identity, layer choice), so a
changed template or layer choice encodes again. TEXT_FACTORY ('module:callable') is called with
TEXT_KWARGS; the default builds kohakumoss.encoders.TextEncoder from a TextEncoderConfig, cut at
MAX_TEXT_TOKENS like the training run's (the data config `kohakumoss-config new train` writes hands it
the training config's own encoder settings; `kohakumoss-config check` names any difference). The knobs
are the fields of kohakumoss.config.data_scripts.CacheTextConfig (docs/guides/data-knobs.md).
"""

from __future__ import annotations

import sys
import typing
from typing import Any

from kohakumoss.config.data_scripts import call_factory
from kohakumoss.data_knobs import load_factory, open_dataset, plan_dataset
from kohakumoss.encoders.text_cap import cut_captions, report_cut_captions
from kohakumoss_data.loader import open_caches
from kohakumoss_data.offline import captions_by_item, fill_text_cache, planned_prompts

if typing.TYPE_CHECKING:  # a module-level TYPE_CHECKING would read as a knob
    from kohakumoss.config.data_scripts import CacheTextConfig

DATASET = {"kind": "kohya", "path": "data/train"}
CATALOG_DIR = None  # None: the catalog cache sits beside the dataset
MIN_SIDE = 64
MAX_PIXELS = 178_956_970
MISSING_CAPTION = "empty"  # error | empty | filename
SCAN_WORKERS = 4
SEED = 0  # SEED and the plan knobs below: the training run's values (the same plan, the same cache keys)
AREA = 1024 * 1024
MIN_ASPECT = 0.25
MAX_ASPECT = 4.0
NO_UPSCALE = False
CROP = "center"  # center | random
BUCKETS = None  # None | "kohya" | [[w, h], ...]
TOKENS_PER_STEP = 8192  # token budget per step (image, text and reference-image tokens)
MAX_TEXT_TOKENS = 256
FLIP_PROB = 0.0
CAPTION_DROPOUT = 0.0
SHUFFLE_CAPTION = False
KEEP_TOKENS = 0
TAG_DROPOUT = 0.0
CAPTION_FORMAT = "plain"  # plain | auto-json | json
EPOCHS = 1
MICRO_STEPS = 0  # the training run's STEPS x GRAD_ACCUM: at least the epochs they span (0: EPOCHS alone)
CACHE_DIR = "cache"  # the training run's CACHE_DIR
SHARD_ITEMS = 512
BATCH_SIZE = 8
TEXT_FACTORY = ""  # '' : the real Qwen3.5 encoder below
TEXT_KWARGS = {"path": "models/text_encoder", "device": "cuda"}


def real_text_encoder(kwargs: dict[str, Any], max_text_tokens: int) -> Any:
    """kohakumoss.encoders.TextEncoder from TextEncoderConfig fields (TEXT_KWARGS), cut at MAX_TEXT_TOKENS
    as the training run cuts it (train/cache_identity.py: the settings both sides build from)."""
    from kohakumoss.encoders import TextEncoder
    from kohakumoss.train.cache_identity import data_text_settings

    return TextEncoder.load(data_text_settings(kwargs, max_text_tokens))


def run(cfg: CacheTextConfig) -> None:
    source, catalog = open_dataset(
        cfg.dataset, cfg.scan
    )  # the dataset, scan and plan knobs as the data settings
    plan = plan_dataset(cfg.plan, cfg.dataset.dataset, catalog)
    ref = cfg.text.text_factory
    if ref:
        encoder = call_factory(load_factory(ref, "TEXT_FACTORY"), cfg.text.text_kwargs, "TEXT_KWARGS")
    else:
        encoder = real_text_encoder(cfg.text.text_kwargs, cfg.plan.max_text_tokens)
    prompts = getattr(encoder, "prompts", None)  # a TEXT_FACTORY encoder may have no tokenizer to count with
    if prompts is not None:  # a caption whose prompt is over the cap: named (an error with JSON captions)
        cap = min(int(prompts.max_length), cfg.plan.max_text_tokens)
        cuts = cut_captions(prompts, captions_by_item(plan, catalog), cap)
        report_cut_captions(cuts, "MAX_TEXT_TOKENS", cfg.plan.caption_format)
    _, cache = open_caches(cfg.cache.cache_dir, None, encoder, cfg.cache.shard_items)  # as the trainer does
    # an edit run's encoder reads the reference images it puts in the prompt
    captions, references = planned_prompts(plan, catalog, source)
    report = fill_text_cache(captions, encoder, cache, cfg.cache.batch_size, references=references)
    print(report.summary("text"))
    print(f"cache {cache.dir}")


def main() -> None:
    """Check the knobs (unknown names with a did-you-mean, types, ranges) like the trainer, then run."""
    from kohakumoss.config.data_scripts import CacheTextConfig, run_data_script

    sys.exit(run_data_script(CacheTextConfig, globals(), run, "scripts/data/cache_text.py"))


if __name__ == "__main__":
    main()

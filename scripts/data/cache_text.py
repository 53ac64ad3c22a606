"""Encode every planned caption with the text encoder into the text cache (safetensors shards).

    kogine run scripts/data/cache_text.py --config my_data.py --set TEXT_KWARGS='{"path": "models/qwen"}'

Resumable and skips what exists. Keyed by (caption, template, encoder identity, layer choice), so a
changed template or layer choice encodes again. TEXT_FACTORY ('module:callable') is called with
TEXT_KWARGS; the default builds kohakumoss.encoders.TextEncoder from a TextEncoderConfig.
"""

from __future__ import annotations

import sys
from typing import Any

from kohakumoss.data_knobs import load_factory, open_dataset, plan_dataset
from kohakumoss_data.cache import TensorCache
from kohakumoss_data.cache_keys import text_cache_identity
from kohakumoss_data.offline import fill_text_cache, planned_captions

DATASET = {"kind": "kohya", "path": "data/train"}
CATALOG_DIR = None
MIN_SIDE = 64
MAX_PIXELS = 178_956_970
MISSING_CAPTION = "empty"
SCAN_WORKERS = 4
SEED = 0
AREA = 1024 * 1024
MIN_ASPECT = 0.25
MAX_ASPECT = 4.0
NO_UPSCALE = False
CROP = "center"
BUCKETS = None
TOKENS_PER_STEP = 8192  # token budget per step (image + text tokens); the training run's
MAX_TEXT_TOKENS = 256
FLIP_PROB = 0.0
CAPTION_DROPOUT = 0.0
SHUFFLE_CAPTION = False
KEEP_TOKENS = 0
TAG_DROPOUT = 0.0
EPOCHS = 1
CACHE_DIR = "cache"
SHARD_ITEMS = 512
BATCH_SIZE = 8
TEXT_FACTORY = ""  # '' : the real Qwen3.5 encoder below
TEXT_KWARGS = {"path": "models/text_encoder", "device": "cuda"}


def real_text_encoder(**kwargs: Any) -> Any:
    """kohakumoss.encoders.TextEncoder from TextEncoderConfig fields."""
    from kohakumoss.encoders import TextEncoder, TextEncoderConfig

    return TextEncoder.load(TextEncoderConfig(**kwargs))


def run(knobs: dict[str, Any]) -> None:
    _, catalog = open_dataset(knobs)
    plan = plan_dataset(knobs, catalog)
    factory = (
        load_factory(knobs["TEXT_FACTORY"], "TEXT_FACTORY") if knobs["TEXT_FACTORY"] else real_text_encoder
    )
    encoder = factory(**knobs["TEXT_KWARGS"])
    identity = text_cache_identity(encoder.identity, encoder.template, encoder.layer_choice)
    cache = TensorCache(knobs["CACHE_DIR"], identity, knobs["SHARD_ITEMS"])
    report = fill_text_cache(planned_captions(plan), encoder, cache, knobs["BATCH_SIZE"])
    print(report.summary("text"))
    print(f"cache {cache.dir}")


def main() -> None:
    """Check the knobs (unknown names with a did-you-mean, types, ranges) like the trainer, then run."""
    from kohakumoss.cli.config_data_schema import DATA_SCHEMA
    from kohakumoss.config.knobs import run_checked

    sys.exit(run_checked(DATA_SCHEMA, globals(), run, "scripts/data/cache_text.py"))


if __name__ == "__main__":
    main()

"""Encode every planned crop with the VAE into the latent cache (safetensors shards), ahead of training.

    kogine run scripts/data/cache_latents.py --config my_data.py --set VAE_KWARGS='{"path": "models/vae"}'

Resumable: shards are written as they fill, and a rerun skips every latent already cached. The
cache is keyed by (image hash, crop box, target size, flip, VAE identity), so use the same plan
knobs and SEED as the training run. VAE_FACTORY ('module:callable') returns the encoder; it is
called with VAE_KWARGS. The knobs are the fields of kohakumoss.config.data_scripts.CacheLatentsConfig
(docs/guides/data-knobs.md).
"""

from __future__ import annotations

import sys
import typing

from kohakumoss.config.data_scripts import call_factory
from kohakumoss.data_knobs import load_factory, open_dataset, plan_dataset
from kohakumoss_data.loader import open_caches
from kohakumoss_data.offline import fill_latent_cache

if typing.TYPE_CHECKING:  # a module-level TYPE_CHECKING would read as a knob
    from kohakumoss.config.data_scripts import CacheLatentsConfig

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
VAE_FACTORY = "kohakumoss.encoders.vae:ImageVAE.load"
VAE_KWARGS = {"path": "models/vae", "device": "cuda"}
WORKERS = 4  # image decode workers


def run(cfg: CacheLatentsConfig) -> None:
    source, catalog = open_dataset(
        cfg.dataset, cfg.scan
    )  # the dataset, scan and plan knobs as the data settings
    plan = plan_dataset(cfg.plan, cfg.dataset.dataset, catalog)
    vae = call_factory(load_factory(cfg.vae.vae_factory, "VAE_FACTORY"), cfg.vae.vae_kwargs, "VAE_KWARGS")
    cache, _ = open_caches(cfg.cache.cache_dir, vae, None, cfg.cache.shard_items)  # as the trainer does
    report = fill_latent_cache(plan, catalog, source, vae, cache, cfg.vae.workers, cfg.cache.batch_size)
    print(report.summary("latents"))
    print(f"cache {cache.dir}")


def main() -> None:
    """Check the knobs (unknown names with a did-you-mean, types, ranges) like the trainer, then run."""
    from kohakumoss.config.data_scripts import CacheLatentsConfig, run_data_script

    sys.exit(run_data_script(CacheLatentsConfig, globals(), run, "scripts/data/cache_latents.py"))


if __name__ == "__main__":
    main()

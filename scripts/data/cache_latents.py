"""Encode every planned crop with the VAE into the latent cache (safetensors shards), ahead of training.

    kogine run scripts/data/cache_latents.py --config my_data.py --set VAE_KWARGS='{"path": "models/vae"}'

Resumable: shards are written as they fill, and a rerun skips every latent already cached. The
cache is keyed by (image hash, crop box, target size, flip, VAE identity), so use the same plan
knobs and SEED as the training run. VAE_FACTORY ('module:callable') returns the encoder; it is
called with VAE_KWARGS.
"""

from __future__ import annotations

import sys
from typing import Any

from kohakumoss.data_knobs import load_factory, open_dataset, plan_dataset
from kohakumoss_data.cache import TensorCache
from kohakumoss_data.cache_keys import latent_cache_identity
from kohakumoss_data.offline import fill_latent_cache

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
WORKERS = 4
BATCH_SIZE = 8
VAE_FACTORY = "kohakumoss.encoders.vae:ImageVAE.load"
VAE_KWARGS = {"path": "models/vae", "device": "cuda"}


def run(knobs: dict[str, Any]) -> None:
    source, catalog = open_dataset(knobs)
    plan = plan_dataset(knobs, catalog)
    vae = load_factory(knobs["VAE_FACTORY"], "VAE_FACTORY")(**knobs["VAE_KWARGS"])
    cache = TensorCache(knobs["CACHE_DIR"], latent_cache_identity(vae.identity), knobs["SHARD_ITEMS"])
    report = fill_latent_cache(plan, catalog, source, vae, cache, knobs["WORKERS"], knobs["BATCH_SIZE"])
    print(report.summary("latents"))
    print(f"cache {cache.dir}")


def main() -> None:
    """Check the knobs (unknown names with a did-you-mean, types, ranges) like the trainer, then run."""
    from kohakumoss.cli.config_data_schema import DATA_SCHEMA
    from kohakumoss.config.knobs import run_checked

    sys.exit(run_checked(DATA_SCHEMA, globals(), run, "scripts/data/cache_latents.py"))


if __name__ == "__main__":
    main()

"""Knobs of the data scripts (scripts/data/*.py): the plan knobs they share with training, plus their own.

One data config serves inspect_data, cache_text, cache_latents and convert_shards (kogine injects
the knobs a script does not declare without harm), so this schema is their union. The shared plan
knobs must equal the training config's for the caches to hit: `kohakumoss-config new train` writes
a data config that reads them from the training config.
"""

from __future__ import annotations

from kohakumoss.config.knobs import Knob, Schema
from kohakumoss.config.train import TRAIN_SCHEMA

# plan and scan knobs the training run and the data scripts must agree on
SHARED = (
    "DATASET",
    "CATALOG_DIR",
    "MIN_SIDE",
    "MAX_PIXELS",
    "MISSING_CAPTION",
    "SCAN_WORKERS",
    "SEED",
    "AREA",
    "MIN_ASPECT",
    "MAX_ASPECT",
    "NO_UPSCALE",
    "CROP",
    "BUCKETS",
    "TOKENS_PER_STEP",
    "MAX_TEXT_TOKENS",
    "FLIP_PROB",
    "CAPTION_DROPOUT",
    "SHUFFLE_CAPTION",
    "KEEP_TOKENS",
    "TAG_DROPOUT",
    "CACHE_DIR",
)

DATA_ONLY = [
    Knob("EPOCHS", 1, "epochs of the plan to inspect or cache", min=1),
    Knob("RUN_DIR", "runs/inspect", "inspect_data: where report.txt and the figures go"),
    Knob("CONTACT_ITEMS", 12, "inspect_data: crops on the contact sheet", min=0),
    Knob("SHARD_ITEMS", 512, "cache scripts: items per cache shard", min=1),
    Knob("WORKERS", 4, "cache_latents: decode workers", min=0),
    Knob("BATCH_SIZE", 8, "cache scripts: encoder batch size", min=1),
    Knob(
        "VAE_FACTORY",
        "kohakumoss.encoders.vae:ImageVAE.load",
        "cache_latents: 'module:callable' that returns the VAE",
    ),
    Knob(
        "VAE_KWARGS",
        {"path": "models/vae", "device": "cuda"},
        "cache_latents: arguments of VAE_FACTORY",
        type=dict,
    ),
    Knob("TEXT_FACTORY", "", "cache_text: 'module:callable' ('' : the Qwen3.5 encoder)"),
    Knob(
        "TEXT_KWARGS",
        {"path": "models/text_encoder", "device": "cuda"},
        "cache_text: TextEncoderConfig fields",
        type=dict,
    ),
    Knob("OUT_DIR", "data/shards", "convert_shards: output folder"),
    Knob(
        "MAX_AREA",
        2048 * 2048,
        "convert_shards: shrink images above this area (None: keep)",
        type=(int, type(None)),
    ),
    Knob("ITEMS_PER_SHARD", 256, "convert_shards: images per shard", min=1),
]

DATA_SCHEMA = Schema([*(TRAIN_SCHEMA.knobs[n] for n in SHARED), *DATA_ONLY])

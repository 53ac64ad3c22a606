"""Convert any dataset into the project's shard format: decoded once, shrunk to MAX_AREA, fast to read.

    kogine run scripts/data/convert_shards.py --config my_data.py --set OUT_DIR=data/train_shards

Only usable items are written (the scan report says what was dropped and why). Train from the
result with DATASET = {"kind": "shards", "path": OUT_DIR}. The knobs are the fields of
kohakumoss.config.data_scripts.ConvertShardsConfig (docs/guides/data-knobs.md).
"""

from __future__ import annotations

import sys
import typing

from kohakumoss.data_knobs import open_dataset
from kohakumoss_data.sources.convert import convert_to_shards

if typing.TYPE_CHECKING:  # a module-level TYPE_CHECKING would read as a knob
    from kohakumoss.config.data_scripts import ConvertShardsConfig

DATASET = {"kind": "kohya", "path": "data/train"}
CATALOG_DIR = None  # None: the catalog cache sits beside the dataset
MIN_SIDE = 64
MAX_PIXELS = 178_956_970
MISSING_CAPTION = "empty"  # error | empty | filename
SCAN_WORKERS = 4
OUT_DIR = "data/shards"
MAX_AREA = 2048 * 2048  # keeps enough pixels for any AREA up to 4 MP; None keeps the original size
ITEMS_PER_SHARD = 256


def run(cfg: ConvertShardsConfig) -> None:
    source, catalog = open_dataset(cfg.dataset, cfg.scan)  # DATASET and the scan knobs, as the data settings
    out = cfg.shards.out_dir
    paths = convert_to_shards(source, catalog, out, cfg.shards.max_area, cfg.shards.items_per_shard)
    print(f"wrote {len(catalog.usable)} images into {len(paths)} shards under {out}")


def main() -> None:
    """Check the knobs (unknown names with a did-you-mean, types, ranges) like the trainer, then run."""
    from kohakumoss.config.data_scripts import ConvertShardsConfig, run_data_script

    sys.exit(run_data_script(ConvertShardsConfig, globals(), run, "scripts/data/convert_shards.py"))


if __name__ == "__main__":
    main()

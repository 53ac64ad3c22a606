"""Convert any dataset into the project's shard format: decoded once, shrunk to MAX_AREA, fast to read.

    kogine run scripts/data/convert_shards.py --config my_data.py --set OUT_DIR=data/train_shards

Only usable items are written (the scan report says what was dropped and why). Train from the
result with DATASET = {"kind": "shards", "path": OUT_DIR}.
"""

from __future__ import annotations

import sys
from typing import Any

from kohakumoss.data_knobs import open_dataset
from kohakumoss_data.sources.convert import convert_to_shards

DATASET = {"kind": "kohya", "path": "data/train"}
CATALOG_DIR = None
MIN_SIDE = 64
MAX_PIXELS = 178_956_970
MISSING_CAPTION = "empty"
SCAN_WORKERS = 4
OUT_DIR = "data/shards"
MAX_AREA = 2048 * 2048  # keeps enough pixels for any AREA up to 4 MP; None keeps the original size
ITEMS_PER_SHARD = 256


def run(knobs: dict[str, Any]) -> None:
    source, catalog = open_dataset(knobs)
    out = knobs["OUT_DIR"]
    paths = convert_to_shards(source, catalog, out, knobs["MAX_AREA"], knobs["ITEMS_PER_SHARD"])
    print(f"wrote {len(catalog.usable)} images into {len(paths)} shards under {out}")


def main() -> None:
    """Check the knobs (unknown names with a did-you-mean, types, ranges) like the trainer, then run."""
    from kohakumoss.cli.config_data_schema import DATA_SCHEMA
    from kohakumoss.config.knobs import run_checked

    sys.exit(run_checked(DATA_SCHEMA, globals(), run, "scripts/data/convert_shards.py"))


if __name__ == "__main__":
    main()

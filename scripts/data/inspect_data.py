"""Look at a dataset before training: what was kept or dropped, sizes, tokens per step, the plan hash.

    kogine run scripts/data/inspect_data.py --config my_data.py [--set RUN_DIR=runs/inspect]

Prints items kept and dropped per reason, the aspect and planned-resolution histograms, tokens per
step (min / median / max), steps per epoch and a line `plan sha256 <hex>`; writes report.txt,
histogram.png, contact_sheet.png (the first planned crops) and dropped.jsonl (path, status, reason
of each dropped file) into RUN_DIR. The knobs are the fields of
kohakumoss.config.data_scripts.InspectDataConfig (docs/guides/data-knobs.md).
"""

from __future__ import annotations

import sys
import typing
from pathlib import Path

from PIL import Image

from kohakumoss.data_knobs import open_dataset, plan_dataset
from kohakumoss_common.io import atomic_write_text, save_image
from kohakumoss_data.figures import contact_sheet, histogram_png
from kohakumoss_data.report import aspect_histogram, report_lines, resolution_histogram, write_dropped
from kohakumoss_data.transform import planned_pixels

if typing.TYPE_CHECKING:  # a module-level TYPE_CHECKING would read as a knob
    from kohakumoss.config.data_scripts import InspectDataConfig

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
RUN_DIR = "runs/inspect"
CONTACT_ITEMS = 12  # planned crops on the contact sheet


def run(cfg: InspectDataConfig) -> None:
    source, catalog = open_dataset(
        cfg.dataset, cfg.scan
    )  # the dataset, scan and plan knobs as the data settings
    plan = plan_dataset(cfg.plan, cfg.dataset.dataset, catalog)
    lines = report_lines(catalog, plan)
    print("\n".join(lines))
    out = Path(cfg.report.run_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "report.txt", "\n".join(lines) + "\n")
    write_dropped(out / "dropped.jsonl", catalog)
    aspect = histogram_png("aspect ratio (w/h) of usable items", aspect_histogram(catalog))
    sizes = histogram_png("planned resolution, epoch 0", resolution_histogram(plan))
    figure = Image.new("RGB", (aspect.width, aspect.height + sizes.height), "white")
    figure.paste(aspect, (0, 0))
    figure.paste(sizes, (0, aspect.height))
    save_image(figure, out / "histogram.png")
    locators = {it.key: it.locator for it in catalog.usable}
    first = [it for step in plan.steps for it in step][: cfg.report.contact_items]
    tiles = [
        (
            Image.fromarray(planned_pixels(source.read(locators[it.key]), it)),
            f"{it.target[0]}x{it.target[1]} {it.key}",
        )
        for it in first
    ]
    save_image(contact_sheet(tiles), out / "contact_sheet.png")
    print(f"wrote {out / 'report.txt'}, {out / 'histogram.png'}, {out / 'contact_sheet.png'}")


def main() -> None:
    """Check the knobs (unknown names with a did-you-mean, types, ranges) like the trainer, then run."""
    from kohakumoss.config.data_scripts import InspectDataConfig, run_data_script

    sys.exit(run_data_script(InspectDataConfig, globals(), run, "scripts/data/inspect_data.py"))


if __name__ == "__main__":
    main()

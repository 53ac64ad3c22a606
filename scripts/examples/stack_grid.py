"""Stack the sample folders of several checkpoints into one grid: a row per folder, a column per image.

    python scripts/examples/stack_grid.py OUT.png ROW_DIR [ROW_DIR ...]

Each ROW_DIR is an OUT_DIR of scripts/sample/sample.py (NNNN_seedS.png files); the row is labelled
with the folder's name (base, step_00000010, ...), the columns with the seeds of the first row.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from PIL import Image

_SAMPLE = re.compile(r"^(\d{4})_seed(-?\d+)\.png$")


def row_images(folder: Path) -> list[tuple[int, Path]]:
    """(seed, path) of the sample PNGs of `folder`, in the order sample.py wrote them."""
    found = [(m.group(1), int(m.group(2)), p) for p in folder.glob("*.png") if (m := _SAMPLE.match(p.name))]
    return [(seed, p) for _, seed, p in sorted(found)]


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    from kohakumoss.diffusion.grid import grid
    from kohakumoss_common.io import save_image

    out, folders = Path(argv[0]), [Path(a) for a in argv[1:]]
    rows, seeds = [], []
    for folder in folders:
        found = row_images(folder)
        if not found:
            print(f"stack_grid: no NNNN_seedS.png samples in '{folder}'", file=sys.stderr)
            return 1
        seeds = seeds or [s for s, _ in found]
        rows.append((folder.name, [Image.open(p).convert("RGB") for _, p in found]))
    out.parent.mkdir(parents=True, exist_ok=True)
    save_image(grid(rows, [f"seed {s}" for s in seeds]), out)
    print(f"wrote {out} ({len(rows)} rows x {len(seeds)} columns)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

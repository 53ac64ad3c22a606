"""Random DiT weights written in the layouts users download, for benchmarks that load a file.

    python scripts/bench/write_weights.py OUT_DIR --preset moss-image-5b --layouts hf,comfy,convrot

The values are MODEL_PRESET's (the trainer's `build_backbone` with the same preset and seed, drawn on
--device), so a row loading one of these files trains the same function as a MODEL_PRESET row. Layouts:
- `hf`: OUT_DIR/transformer/ (the MOSS-Image-Base repository's folder: shards, index, config.json);
- `comfy`: OUT_DIR/moss_image_base_bf16.safetensors (Comfy-Org's bf16 file: q, k, v fused);
- `convrot`: OUT_DIR/moss_image_base_int8_convrot.safetensors (Comfy-Org's int8 file: the block matrices
  ConvRot int8, `kohakumoss.model.convrot_file`).
A file already there is kept (the folder is reused across rows and calls).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

LAYOUT_FILES = {
    "hf": "transformer",
    "comfy": "moss_image_base_bf16.safetensors",
    "convrot": "moss_image_base_int8_convrot.safetensors",
}


def layout_path(out: Path, layout: str) -> Path:
    """Where `layout`'s weights go under `out` (a folder for hf, a file otherwise)."""
    return Path(out) / LAYOUT_FILES[layout]


def write(out: Path, preset: str, layouts: list[str], seed: int = 0, device: str = "cpu") -> dict[str, Path]:
    """Write the missing layouts of `preset`'s random weights (seed `seed`, drawn on `device`); returns
    layout -> path."""
    from kohakumoss.config.train import ModelConfig
    from kohakumoss.model.convrot_file import save_convrot_dit
    from kohakumoss.model.io import save_backbone
    from kohakumoss.train.components import build_backbone

    if unknown := sorted(set(layouts) - set(LAYOUT_FILES)):
        raise SystemExit(f"--layouts: unknown {unknown}; known {sorted(LAYOUT_FILES)}")
    paths = {name: layout_path(out, name) for name in layouts}
    todo = [name for name, p in paths.items() if not (p / "config.json" if name == "hf" else p).exists()]
    if not todo:
        return paths
    t0 = time.perf_counter()
    draw = torch.device(device)
    model = ModelConfig(model_preset=preset)
    # built on the host (a 5B model's two copies fit there, not beside a capped row), drawn on --device
    backbone = build_backbone(model, torch.device("cpu"), torch.bfloat16, False, seed=seed, draw=draw)
    for name in todo:
        if name == "convrot":
            save_convrot_dit(backbone, paths[name], device=draw)
        elif name == "hf":
            save_backbone(backbone, paths[name], layout="hf")
        else:
            save_backbone(backbone, paths[name], layout="comfy")
        print(f"wrote {name}: {paths[name]} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return paths


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--preset", default="moss-image-5b")
    p.add_argument(
        "--layouts", default="hf,comfy,convrot", help=f"comma-separated, of {sorted(LAYOUT_FILES)}"
    )
    p.add_argument("--seed", type=int, default=0, help="MODEL_PRESET's seed (the trainer's SEED)")
    p.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu", help="where values are drawn"
    )
    a = p.parse_args(argv)
    write(Path(a.out), a.preset, [s for s in a.layouts.split(",") if s], a.seed, a.device)


if __name__ == "__main__":
    main()

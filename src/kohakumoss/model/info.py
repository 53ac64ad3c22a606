"""Print the architecture summary of a preset or a checkpoint: `python -m kohakumoss.model.info <preset|path>`.

The last line is `params <N>`. Checkpoints are read from their headers only (no tensor data).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from pathlib import Path

import torch

from kohakumoss_common.errors import KohakuMossError

from .backbone import MossBackbone
from .config import MossConfig
from .presets import PRESETS, get_preset


def param_shapes(config: MossConfig) -> dict[str, tuple[int, ...]]:
    """Native key -> shape, from a model built on the meta device (no memory used)."""
    with torch.device("meta"):
        model = MossBackbone(config)
    return {k: tuple(p.shape) for k, p in model.named_parameters()}


def group_of(key: str) -> str:
    if key.startswith("blocks."):
        return "blocks." + key.split(".", 2)[2].rsplit(".", 1)[0]
    return key.rsplit(".", 1)[0]


def summarize(
    config: MossConfig, shapes: dict[str, tuple[int, ...]], source: str, layout: str | None = None
) -> str:
    groups: dict[str, int] = defaultdict(int)
    for key, shape in shapes.items():
        groups[group_of(key)] += math.prod(shape)
    total = sum(math.prod(s) for s in shapes.values())
    per_block = sum(math.prod(s) for k, s in shapes.items() if k.startswith("blocks.0."))
    lines = [f"MOSS-Image backbone: {source}" + (f" (layout: {layout})" if layout else "")]
    lines += [f"  {k:<14} {v}" for k, v in config.to_dict().items()]
    lines.append(f"  tokens: 1 token = 2x2 latent = 16x16 px; 1 MP = {1024 * 1024 // 256} image tokens")
    lines.append(f"  tensors: {len(shapes)}; per block {per_block:,} params x {config.depth} blocks")
    lines.append("  parameters by module (blocks summed over depth):")
    for name, n in sorted(groups.items(), key=lambda kv: -kv[1]):
        lines.append(f"    {name:<34} {n:>15,}")
    lines.append(f"params {total}")
    return "\n".join(lines)


def describe(target: str) -> str:
    if target in PRESETS:
        config = get_preset(target)
        return summarize(config, param_shapes(config), f"preset '{target}'")
    if not Path(target).exists():
        raise KohakuMossError(f"'{target}' is neither a preset ({sorted(PRESETS)}) nor an existing path")
    from .io import inspect_checkpoint

    layout, config, entries = inspect_checkpoint(target)
    shapes = {k: tuple(s) for k, s in layout.native_shapes({k: s for k, (_, s) in entries.items()}).items()}
    return summarize(config, shapes, target, layout.name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kohakumoss.model.info", description=__doc__.splitlines()[0]
    )
    parser.add_argument("target", help=f"a preset ({', '.join(sorted(PRESETS))}) or a checkpoint file/folder")
    args = parser.parse_args(argv)
    try:
        print(describe(args.target))
    except KohakuMossError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

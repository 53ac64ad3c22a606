"""Print the architecture summary of a preset or a checkpoint: `python -m kohakumoss.model.info <preset|path>`.

A checkpoint may be in any layout (HF tree or transformer/ folder, ComfyUI file, quantized or not); it
is read from its headers only (plus the few bytes of its quantization markers). The last line is
`params <N>` (parameters, the derived `rope.bands` buffer left out).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

import torch

from kohakumoss_common.errors import KohakuMossError

from .backbone import MossBackbone
from .config import MossConfig
from .presets import PRESETS, get_preset


def param_shapes(config: MossConfig) -> dict[str, tuple[int, ...]]:
    """Native key -> shape of every parameter, from a model built on the meta device (no memory used)."""
    with torch.device("meta"):
        model = MossBackbone(config)
    return {k: tuple(p.shape) for k, p in model.named_parameters()}


def group_of(key: str) -> str:
    """The module a key belongs to, block indices dropped (`layers.3.proj.q.weight` -> `layers.proj.q`)."""
    return re.sub(r"\.\d+\.", ".", key.rsplit(".", 1)[0] + ".").rstrip(".")


def summarize(
    config: MossConfig,
    shapes: dict[str, tuple[int, ...]],
    source: str,
    layout: str | None = None,
    extra: list[str] | None = None,
) -> str:
    shapes = {k: s for k, s in shapes.items() if k != "rope.bands"}
    groups: dict[str, int] = defaultdict(int)
    for key, shape in shapes.items():
        groups[group_of(key)] += math.prod(shape)
    total = sum(math.prod(s) for s in shapes.values())
    per_block = sum(math.prod(s) for k, s in shapes.items() if k.startswith("layers.0."))
    lines = [f"MOSS-Image backbone: {source}" + (f" (layout: {layout})" if layout else "")]
    lines += [f"  {line}" for line in extra or []]
    lines += [f"  {k:<14} {v}" for k, v in config.to_dict().items()]
    lines.append(f"  released config.json: {config.hf_config()}")
    lines.append(f"  tokens: 1 token = 2x2 latent = 16x16 px; 1 MP = {1024 * 1024 // 256} image tokens")
    lines.append(
        f"  parameter tensors: {len(shapes)}; per block {per_block:,} params x {config.depth} blocks"
    )
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
    from .io import read_checkpoint

    info = read_checkpoint(target)
    dtypes = Counter(dtype for dtype, _ in info.entries.values())
    files = info.files
    extra = [
        f"files: {len(files)} ({', '.join(f.name for f in files[:4])}{', ...' if len(files) > 4 else ''})",
        f"file tensors: {len(info.entries)} ({', '.join(f'{d} x{n}' for d, n in sorted(dtypes.items()))})"
        + (f" + {len(info.quant.dropped)} scale/marker tensors" if info.quant.dropped else ""),
        f"quantization: {info.quant.scheme}",
        f"rope.bands: {'in the file (recomputed at load)' if 'rope.bands' in info.native_shapes else 'absent (recomputed)'}",
    ]
    shapes = {k: tuple(s) for k, s in info.native_shapes.items()}
    return summarize(info.config, shapes, str(info.path), info.layout.name, extra)


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

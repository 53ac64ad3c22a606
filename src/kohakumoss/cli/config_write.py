"""Render the config files `kohakumoss-config` writes: Python source a person can read and edit."""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kohakumoss_common.knobs import Schema

from .config_layers import use_line


def knob_line(name: str, value: Any, schema: Schema | None, comment: str = "") -> str:
    """`NAME = value  # help` (`comment`, else the help from the schema, one line)."""
    help_ = schema.knobs[name].help if schema is not None and name in schema.knobs else ""
    help_ = comment or help_
    return f"{name} = {value!r}" + (f"  # {help_}" if help_ else "")


def header(title: str, usage: Iterable[str], body: Iterable[str] = ()) -> list[str]:
    today = datetime.date.today().isoformat()
    lines = [f'"""{title} (written by kohakumoss-config on {today}).', ""]
    lines += [f"    {u}" for u in usage]
    body = list(body)
    if body:
        lines += ["", *body]
    return [*lines, '"""', ""]


def render_layered(
    path: Path,
    title: str,
    usage: Iterable[str],
    body: Iterable[str],
    layers: Iterable[Path],
    metadata: dict[str, Any],
    knobs: dict[str, Any],
    schema: Schema | None,
    comments: dict[str, str] | None = None,
) -> str:
    """A config that composes `layers` with kogine's use_config, then sets its own knobs (`comments`
    replace the schema's help on the knobs they name)."""
    lines = header(title, usage, body)
    lines += ["from kohakuengine import use_config", ""]
    lines += [use_line(layer, path.parent) for layer in layers]
    lines += ["", f"_metadata = {metadata!r}  # not a knob: read by kohakumoss-config check", ""]
    lines += [knob_line(k, v, schema, (comments or {}).get(k, "")) for k, v in knobs.items()]
    return "\n".join(lines) + "\n"


def render_plain(
    title: str, usage: Iterable[str], metadata: dict[str, Any], knobs: dict[str, Any], schema: Schema | None
) -> str:
    lines = header(title, usage)
    lines += [f"_metadata = {metadata!r}  # not a knob: read by kohakumoss-config check", ""]
    lines += [knob_line(k, v, schema) for k, v in knobs.items()]
    return "\n".join(lines) + "\n"


def render_data(
    path: Path, title: str, usage: Iterable[str], sources: Iterable[Path], own: dict[str, Any], schema: Schema
) -> str:
    """A data-scripts config: plan knobs read from `sources` (the training config or layers), then `own`."""
    refs = []
    for s in sources:
        ref = use_line(s, path.parent).removeprefix('use_config("').removesuffix('")')
        refs.append(f'_here / "{ref}"')
    lines = header(
        title,
        usage,
        [
            "The plan knobs (DATASET, AREA, SEED, ...) are read from the files named in config_gen, so the",
            "caches these scripts fill are the ones the training run reads. Knobs below override them.",
        ],
    )
    lines += [
        "from pathlib import Path",
        "",
        "from kohakumoss.cli.config_layers import data_config",
        "",
        "_here = Path(__file__).resolve().parent",
        "_own = {",
    ]
    for k, v in own.items():
        help_ = schema.knobs[k].help if k in schema.knobs else ""
        lines.append(f"    {k!r}: {v!r}," + (f"  # {help_}" if help_ else ""))
    lines += [
        "}",
        "",
        "",
        "def config_gen():",
        f"    return data_config([{', '.join(refs)}], _own)",
    ]
    return "\n".join(lines) + "\n"

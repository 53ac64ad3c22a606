"""Prompt files in the kohya line format: `prompt --n negative --w 1024 --h 768 --d 42 --l 3.5 --s 30`.

Any subset of the flags, in any order; `#` lines and blank lines are skipped. A flag left out takes
the knobs' default (`None` here). `--ri path` gives the line a reference image (edit models), once per
reference, in order; a line without one takes the knobs' (REFERENCE_IMAGES).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from kohakumoss_common.errors import ConfigError

# flag -> (field, type); kohya's names
FLAGS = {"n": ("negative", str), "w": ("width", int), "h": ("height", int), "d": ("seed", int),
         "l": ("cfg", float), "s": ("steps", int), "ri": ("references", str)}  # fmt: skip
REPEATED = ("ri",)  # flags given once per value, their values kept in order
_SPLIT = re.compile(r"(?:^|\s)--(?=\S)")


@dataclass(frozen=True)
class PromptLine:
    """One prompt and the settings its line gives (None: the knob's default)."""

    prompt: str
    negative: str | None = None
    width: int | None = None
    height: int | None = None
    seed: int | None = None
    cfg: float | None = None
    steps: int | None = None
    references: tuple[str, ...] | None = None  # reference image paths (--ri, in order)

    def with_defaults(self, **defaults) -> PromptLine:
        """Fields the line left out set from `defaults` (same names)."""
        return replace(self, **{k: v for k, v in defaults.items() if getattr(self, k) is None})


def parse_prompt_line(text: str, where: str = "PROMPT", knob: str = "PROMPT") -> PromptLine:
    """One line; `where` (file:line) names it in errors, `knob` is the knob that pointed at it."""
    parts = _SPLIT.split(text.strip())
    prompt, fields = parts[0].strip(), {}
    for part in parts[1:]:
        flag, _, value = part.partition(" ")
        value = value.strip()
        if flag not in FLAGS:
            known = ", ".join(f"--{f}" for f in FLAGS)
            raise ConfigError(knob, f"{where}: unknown flag --{flag} (known: {known})")
        name, kind = FLAGS[flag]
        if kind is not str and not value:
            raise ConfigError(knob, f"{where}: --{flag} needs a value")
        if flag in REPEATED:
            if not value:
                raise ConfigError(knob, f"{where}: --{flag} needs a path")
            if not Path(value).expanduser().is_file():
                raise ConfigError(knob, f"{where}: --{flag} reference image '{value}' does not exist")
            fields[name] = (*fields.get(name, ()), value)
            continue
        try:
            fields[name] = kind(value)
        except ValueError:
            raise ConfigError(knob, f"{where}: --{flag} {value!r} is not a {kind.__name__}") from None
    line = PromptLine(prompt, **fields)
    for flag, v in (("w", line.width), ("h", line.height)):
        if v is not None and (v <= 0 or v % 16):
            raise ConfigError(knob, f"{where}: --{flag} {v} must be a positive multiple of 16 px")
    if line.steps is not None and line.steps < 1:
        raise ConfigError(knob, f"{where}: --s {line.steps} must be >= 1")
    if line.cfg is not None and line.cfg < 0:
        raise ConfigError(knob, f"{where}: --l {line.cfg} must be >= 0")
    if not prompt:
        raise ConfigError(knob, f"{where}: the line has flags but no prompt")
    return line


def read_prompt_file(path: str | Path, knob: str = "PROMPT_FILE") -> list[PromptLine]:
    """Every prompt line of `path`; plain lines are prompts with no flags."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(knob, f"prompt file '{path}' does not exist")
    out = []
    for n, text in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if text.strip() and not text.lstrip().startswith("#"):
            out.append(parse_prompt_line(text, f"{path}:{n}", knob))
    if not out:
        raise ConfigError(knob, f"prompt file '{path}' has no prompts")
    return out


def prompt_file_problem(path: str, knob: str) -> str | None:
    """For a Knob check: what is wrong with the prompt file at `path` (None: nothing; '' names no file)."""
    if not path:
        return None
    try:
        read_prompt_file(path, knob)
    except ConfigError as e:
        return str(e).removeprefix(f"{knob}: ")
    return None


def prompt_list_problem(prompts: list, knob: str) -> str | None:
    """For a Knob check: what is wrong with a list of prompt lines (None: nothing)."""
    try:
        for i, p in enumerate(prompts):
            if not isinstance(p, str):
                return f"{knob}[{i}] is not a string: {p!r}"
            parse_prompt_line(p, f"{knob}[{i}]", knob)
    except ConfigError as e:
        return str(e).removeprefix(f"{knob}: ")
    return None

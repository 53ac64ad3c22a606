"""The knob reference of a typed config as markdown: one table per section, generated, never hand-edited.

    python -m kohakumoss.config.reference > docs/guides/train-knobs.md

tests/config/test_typed_config.py fails when the committed page differs from what this prints.
"""

from __future__ import annotations

import dataclasses

from kohakumoss_common.knobs import Knob
from kohakumoss_common.typed_config import config_knobs, config_sections, resume_rules

HEADER = """# Training knobs (`scripts/train/moss.py`)

Every knob of the train script, by section of `kohakumoss.config.train.TrainConfig` (a frozen
dataclass per section, one field per knob: its type, default, bounds and help). This page is generated
from it: `python -m kohakumoss.config.reference > docs/guides/train-knobs.md`; the schema that checks
a config (`kohakumoss-config check`) and the configs `kohakumoss-config new` writes come from the same
fields. How configs are layered: [configs.md](configs.md).

The resume column is what a resumed run may do with a knob whose value differs from its checkpoint's
(each knob's `resume=` rule): `fixed` never (it decides the trained function or the data plan), `safe`
when `RESUME_ALLOW_CHANGES` names it, `length` as safe and without it under a constant schedule; a knob
without a mark is not compared.
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _types(k: Knob) -> str:
    names = ["None" if t is type(None) else t.__name__ for t in k.types]
    return " \\| ".join(n for n in names if not (n == "int" and "float" in names))  # float takes an int


def _allowed(k: Knob) -> str:
    parts = []
    if k.choices is not None:
        parts.append("one of " + ", ".join(f"`{c!r}`" for c in k.choices))
    if k.min is not None:
        parts.append(f">= {k.min}")
    if k.max is not None:
        parts.append(f"<= {k.max}")
    if k.path:
        parts.append(
            {"file": "an existing file", "dir": "an existing folder"}.get(k.path, "an existing path")
        )
    return _cell("; ".join(parts))


def section_table(cls: type, resume: bool = False) -> str:
    """The knob table of a section; `resume`: with each knob's resume rule (a training config's)."""
    own = {f.name.upper() for f in dataclasses.fields(cls)}
    rules = resume_rules(cls) if resume else {}
    head = ["knob", "type", "default", "allowed", *(["on resume"] if resume else []), "what it sets"]
    rows = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for k in config_knobs(cls):
        if k.name in own:
            rule = [f"{rules[k.name] or ''}"] if resume else []
            cells = [
                f"`{k.name}`",
                _types(k),
                f"`{_cell(repr(k.default))}`",
                _allowed(k),
                *rule,
                _cell(k.help),
            ]
            rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def reference(cls: type, header: str = HEADER, resume: bool = False) -> str:
    """The markdown page: the header, then per section its path, docstring and knob table."""
    out = [header]
    for path, section in config_sections(cls):
        out.append(f"## `{path}`: {section.__doc__.strip()}\n\n{section_table(section, resume)}\n")
    return "\n".join(out)


def main() -> None:
    from .train import TrainConfig

    print(reference(TrainConfig, resume=True), end="")


if __name__ == "__main__":
    main()

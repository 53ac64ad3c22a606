"""Typed configs: nested frozen dataclasses whose fields are a script's knobs.

A field of a section, `lr: float = knob(1e-4, "learning rate", resume="safe", min=0.0)`, is the knob `LR`
(the field's name upper-cased): its annotation is the types it accepts, `knob(...)` its one default, its
help, its resume rule (`RESUME_RULES`; `resume_rules` reads them) and its bounds. A config is a dataclass of sections (`section(OptimConfig)`). From it come the `Knob` list
(`config_knobs`: the schema that checks a script's globals and that `kohakumoss-config` writes and
documents), the typed value of a validated knob dict (`from_knobs`), the flat dict back (`to_knobs`) and a
config with some knobs changed (`with_knobs`, what the memory plan's suggestions try).
"""

from __future__ import annotations

import copy
import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any

from kohakumoss_common.knobs import Knob

_C = typing.TypeVar("_C", bound="ScriptConfig")
_T = typing.TypeVar("_T")
_KNOB = "kohakumoss.knob"  # the field metadata key that marks a knob (a field without it is a section)

# what a resumed run may do with a knob whose value differs from its checkpoint's (train/resume.py)
RESUME_RULES = {
    "fixed": "never changed: it decides the trained function or the data plan",
    "safe": "changed only when RESUME_ALLOW_CHANGES names it: the weights, optimizer state and data position stay valid",
    "length": "the run's length: as safe, and free under a schedule whose LR does not depend on it",
    None: "not compared: it changes speed, placement, logging or output, never what a step trains",
}
UNDECLARED = "undeclared"  # a knob of a script that never resumes (sampling, export, the data scripts)


def knob(default: Any, help: str, *, resume: str | None = UNDECLARED, **rules: Any) -> Any:
    """A knob field: its default, one line of help, its resume rule (a key of RESUME_RULES) and Knob's
    rules (choices, min, max, path, check)."""
    if "type" in rules:
        raise TypeError("a knob's types are its field's annotation, not a type= rule")
    if resume not in RESUME_RULES and resume != UNDECLARED:
        raise ValueError(f"resume={resume!r} is not one of {list(RESUME_RULES)}")
    metadata = {_KNOB: {"default": default, "help": help, "rules": rules, "resume": resume}}
    if isinstance(default, (list, dict)):  # each config gets its own copy; the schema keeps `default`
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def section(cls: type) -> Any:
    """A nested section field: a dataclass of knobs (or of further sections)."""
    return dataclasses.field(default_factory=cls)


def _accepted(annotation: Any) -> tuple[type, ...]:
    """The types a value of this annotation may have: `int | None` -> (int, NoneType); float takes an int."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return tuple(t for member in typing.get_args(annotation) for t in _accepted(member))
    if annotation is None or annotation is type(None):
        return (type(None),)
    origin = typing.get_origin(annotation) or annotation
    return (float, int) if origin is float else (origin,)


def _fields(cls: type) -> list[tuple[dataclasses.Field, Any]]:
    hints = typing.get_type_hints(cls)
    return [(f, hints[f.name]) for f in dataclasses.fields(cls)]


def _section_class(f: dataclasses.Field) -> type:
    if f.default_factory is dataclasses.MISSING or not dataclasses.is_dataclass(f.default_factory):
        raise TypeError(f"field {f.name!r} is neither a knob(...) nor a section(...)")
    return f.default_factory


def config_knobs(cls: type) -> list[Knob]:
    """Every knob of a config, in field order (sections in place): what a `Schema` is built from."""
    out = []
    for f, annotation in _fields(cls):
        if _KNOB not in f.metadata:
            out += config_knobs(_section_class(f))
            continue
        spec = f.metadata[_KNOB]
        out.append(
            Knob(f.name.upper(), spec["default"], spec["help"], type=_accepted(annotation), **spec["rules"])
        )
    return out


def resume_rules(cls: type) -> dict[str, str | None]:
    """{KNOB: its resume rule} of every knob of a config, in field order (UNDECLARED where knob() got none)."""
    out = {}
    for f, _ in _fields(cls):
        if _KNOB in f.metadata:
            out[f.name.upper()] = f.metadata[_KNOB]["resume"]
        else:
            out.update(resume_rules(_section_class(f)))
    return out


def resume_knobs(cls: type, *rules: str) -> tuple[str, ...]:
    """The knobs of a config whose resume rule is one of `rules`, in field order."""
    return tuple(name for name, rule in resume_rules(cls).items() if rule in rules)


def config_sections(cls: type, prefix: str = "") -> list[tuple[str, type]]:
    """(dotted field path, class) of every class that holds knobs itself, depth first: the docs' headings."""
    fields = dataclasses.fields(cls)
    out = [(prefix, cls)] if any(_KNOB in f.metadata for f in fields) else []
    for f in fields:
        if _KNOB not in f.metadata:
            out += config_sections(_section_class(f), f"{prefix}.{f.name}" if prefix else f.name)
    return out


class ScriptConfig:
    """Base of a script's whole config (its sections as fields): `from_knobs(k)` and `.knobs()`."""

    @classmethod
    def from_knobs(cls: type[_C], knobs: Mapping[str, Any]) -> _C:
        return from_knobs(cls, knobs)

    def knobs(self) -> dict[str, Any]:
        return to_knobs(self)


def from_knobs(cls: type, knobs: Mapping[str, Any]):
    """The typed config of a (validated) knob dict; a knob the dict lacks keeps its default."""
    values = {}
    for f, _ in _fields(cls):
        if _KNOB not in f.metadata:
            values[f.name] = from_knobs(_section_class(f), knobs)
        elif f.name.upper() in knobs:
            values[f.name] = knobs[f.name.upper()]
    return cls(**values)


def to_knobs(config: Any) -> dict[str, Any]:
    """The flat {KNOB: value} dict of a typed config (what the scripts' functions take)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if _KNOB in f.metadata:
            out[f.name.upper()] = value
        else:
            out.update(to_knobs(value))
    return out


def with_knobs(config: _T, changes: Mapping[str, Any]) -> _T:
    """`config` (a typed config or a section) with the knobs of `changes`, named as the flat dict names
    them (`{"RANK": 8}`), set: a new frozen value. A name no field of `config` has raises KeyError."""
    updated, found = _with_knobs(config, changes)
    if unknown := set(changes) - found:
        raise KeyError(f"not knobs of {type(config).__name__}: {sorted(unknown)}")
    return updated


def _with_knobs(config: Any, changes: Mapping[str, Any]) -> tuple[Any, set[str]]:
    updates, found = {}, set()
    for f in dataclasses.fields(config):
        if _KNOB in f.metadata:
            if f.name.upper() in changes:
                updates[f.name] = changes[f.name.upper()]
                found.add(f.name.upper())
            continue
        section, inner = _with_knobs(getattr(config, f.name), changes)
        if inner:
            updates[f.name], found = section, found | inner
    return (dataclasses.replace(config, **updates) if updates else config), found

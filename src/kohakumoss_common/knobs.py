"""Knob schemas and their validation.

A kogine script's settings are module-level UPPER_CASE globals. `Knob` describes one; `validate`
checks a globals dict against a schema before any work starts: unknown knobs (with a did-you-mean),
wrong types, values out of range or not among the choices, paths that do not exist. Every problem is
reported by name, all at once. A knob's name is upper case: a name spelled in another case (`--set steps=50`, `steps = 50` in a config)
is refused with the knob's spelling rather than ignored. A value typed on the command line (`kogine run ... --set STREAM_BLOCKS=3`)
arrives as text wherever the script's default does not tell kogine the type (None, or a count that may
also be a list); `Knob.from_text` reads such a knob's text as the Python literal it takes.
"""

from __future__ import annotations

import ast
import difflib
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from kohakumoss_common.errors import ConfigError
from kohakumoss_common.paths import folder_problem

_MISSING = object()


def script_knobs(namespace: Mapping[str, Any]) -> dict[str, Any]:
    """The UPPER_CASE module-level names of a kogine script (its knobs)."""
    return {k: v for k, v in namespace.items() if k.isupper() and not k.startswith("_")}


def _is_data(value: Any) -> bool:
    """A value a config or `--set` gives (not a module, class or function the script itself defines)."""
    return not (isinstance(value, (ModuleType, type)) or callable(value))


def _nonfinite(value: Any) -> bool:
    """A float that is inf or nan, at any depth of lists, tuples and dict values."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, (list, tuple)):
        return any(_nonfinite(v) for v in value)
    if isinstance(value, dict):
        return any(_nonfinite(v) for v in value.values())
    return False


@dataclass(frozen=True)
class Knob:
    name: str
    default: Any
    help: str
    type: type | tuple[type, ...] | None = None  # None: the default's type
    choices: tuple | None = None
    min: float | None = None
    max: float | None = None
    path: str | None = None  # "file", "dir" or "any": must exist when non-empty
    check: Callable[[Any], str | None] | None = None  # extra rule: returns a problem or None

    @property
    def types(self) -> tuple[type, ...]:
        if self.type is not None:
            return self.type if isinstance(self.type, tuple) else (self.type,)
        if isinstance(self.default, bool):
            return (bool,)
        if isinstance(self.default, float):
            return (float, int)
        if isinstance(self.default, int):
            return (int,)
        return (type(self.default),)

    @property
    def typed_from_text(self) -> bool:
        """Whether kogine hands `--set` text through untyped: the default is None, or it is one of several
        types the knob takes (a count that may be a list). Other knobs arrive typed, or their text is a
        mistake the type check names."""
        kinds = set(self.types) - {type(None)}
        return self.default is None or len(kinds - ({int} if float in kinds else set())) > 1

    def from_text(self, value: Any) -> Any:
        """`value` as the literal it spells when it is text the knob does not take as it is
        ('3', 'true', 'None', '[0, 1]'); anything else unchanged (its type check then names it)."""
        if not isinstance(value, str) or not self.typed_from_text:
            return value
        takes_text = str in self.types and not value.lstrip().startswith(("[", "{"))
        if takes_text and (self.choices is None or value in self.choices):
            return value  # 'none' stays the choice 'none'; a path stays a path
        words = {"true": True, "false": False, "none": None, "null": None}
        try:
            parsed = (
                words[value.strip().lower()] if value.strip().lower() in words else ast.literal_eval(value)
            )
        except (ValueError, SyntaxError):
            return value
        ok = isinstance(parsed, self.types) and (bool in self.types or not isinstance(parsed, bool))
        return parsed if ok or (parsed is None and type(None) in self.types) else value

    def problems(self, value: Any) -> list[str]:
        types = self.types
        if isinstance(value, bool) and bool not in types:
            return [f"expected {'/'.join(t.__name__ for t in types)}, got bool {value!r}"]
        if not isinstance(value, types):
            return [f"expected {'/'.join(t.__name__ for t in types)}, got {type(value).__name__} {value!r}"]
        out = []
        if _nonfinite(value):  # nan passes every bound (its comparisons are all False); inf trains NaN
            return [
                f"{value!r} is not a finite number"
                if isinstance(value, float)
                else f"{value!r} holds a non-finite number"
            ]
        if self.choices is not None and value not in self.choices:
            close = difflib.get_close_matches(str(value), [str(c) for c in self.choices], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            out.append(f"{value!r} is not one of {list(self.choices)}{hint}")
        if self.min is not None and isinstance(value, (int, float)) and value < self.min:
            out.append(f"{value} is below the minimum {self.min}")
        if self.max is not None and isinstance(value, (int, float)) and value > self.max:
            out.append(f"{value} is above the maximum {self.max}")
        if self.path and isinstance(value, str) and value:
            p = Path(value)
            if not p.exists():
                out.append(f"path '{value}' does not exist")
            elif self.path == "file" and not p.is_file():
                out.append(f"'{value}' is not a file")
            elif self.path == "dir" and not p.is_dir():
                out.append(f"'{value}' is not a folder")
        if self.check is not None and not out and (msg := self.check(value)):
            out.append(msg)
        return out


class Schema:
    """An ordered set of knobs for one script."""

    def __init__(self, knobs: Iterable[Knob]):
        self.knobs: dict[str, Knob] = {}
        for k in knobs:
            if k.name in self.knobs or not k.name.isupper():
                raise ValueError(f"bad or duplicate knob name {k.name!r}")
            self.knobs[k.name] = k

    def defaults(self) -> dict[str, Any]:
        return {n: k.default for n, k in self.knobs.items()}

    def suggest(self, name: str) -> str:
        close = difflib.get_close_matches(name, list(self.knobs), n=1, cutoff=0.6)
        return f" (did you mean {close[0]}?)" if close else ""

    def miscased(self, namespace: Mapping[str, Any]) -> dict[str, Any]:
        """The names in `namespace` (a script's globals, a config's) that spell a knob in another case
        (`steps` for STEPS): kogine sets them as given, where no knob would ever read them."""
        return {
            k: v
            for k, v in namespace.items()
            if not k.startswith("_") and k != k.upper() and k.upper() in self.knobs and _is_data(v)
        }

    def from_text(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """`values` with command-line text read as each knob's literal (`Knob.from_text`)."""
        return {k: self.knobs[k].from_text(v) if k in self.knobs else v for k, v in values.items()}

    def problems(self, values: Mapping[str, Any]) -> list[tuple[str, str]]:
        """(knob, problem) pairs for every unknown knob and every bad value."""
        values = self.from_text(values)
        out = []
        for name in values:
            if name.isupper() and not name.startswith("_") and name not in self.knobs:
                out.append((name, f"unknown knob{self.suggest(name)}"))
        for name in self.miscased(values):
            out.append((name, f"knob names are upper case: did you mean {name.upper()}?"))
        for name, knob in self.knobs.items():
            value = values.get(name, _MISSING)
            if value is _MISSING:
                continue
            out += [(name, p) for p in knob.problems(value)]
        return out

    def validate(self, values: Mapping[str, Any], source: str = "config") -> dict[str, Any]:
        """Defaults overlaid with `values`; raises ConfigError naming every bad knob."""
        values = self.from_text(values)  # `problems` reads the same text again: the values merged are typed
        problems = self.problems(values)
        if problems:
            lines = "\n".join(f"  {k}: {p}" for k, p in problems)
            raise ConfigError(problems[0][0], f"{len(problems)} problem(s) in {source}:\n{lines}")
        merged = self.defaults()
        merged.update({k: v for k, v in values.items() if k in self.knobs})
        return merged


# knobs naming a folder a script writes into: a file there, or a name too long, is refused before work
FOLDER_KNOBS = ("RUNS_DIR", "CACHE_DIR", "OUT", "OUT_DIR")


def check_folder_knobs(knobs: Mapping[str, Any]) -> None:
    """ConfigError naming the knob and the path when a FOLDER_KNOBS folder could not be made or used."""
    for name in FOLDER_KNOBS:
        if isinstance(knobs.get(name), str) and knobs[name] and (problem := folder_problem(knobs[name])):
            raise ConfigError(name, problem)


def knob_help(schema: Schema, script: str, names: Iterable[str] | None = None) -> str:
    """A script's `--help`: each knob (those of `names`, else all) with its type, default, rules and help."""
    lines = [
        f"{script}: knobs (set them in the script, a config file, or `kogine run {script} --set KNOB=VALUE`)",
        "",
    ]
    for name in names if names is not None else schema.knobs:
        k = schema.knobs[name]
        kinds = "|".join("None" if t is type(None) else t.__name__ for t in k.types)
        rules = [f"one of {list(k.choices)}"] if k.choices else []
        rules += [f">= {k.min}"] if k.min is not None else []
        rules += [f"<= {k.max}"] if k.max is not None else []
        rules += [f"an existing {'path' if k.path == 'any' else k.path}"] if k.path else []
        extra = f" [{'; '.join(rules)}]" if rules else ""
        lines.append(f"  {name} ({kinds}, default {k.default!r}){extra}")
        lines.append(f"      {k.help}")
    return "\n".join(lines) + "\n"


def wants_help(argv: list[str]) -> bool:
    """`python scripts/x.py --help` (kogine's own parser takes `--help` before the script sees it)."""
    return any(a in ("-h", "--help") for a in argv[1:])


def run_checked(
    schema: Schema,
    module_globals: Mapping[str, Any],
    fn: Callable[[dict], Any],
    script: str,
    help_knobs: Iterable[str] | None = None,
) -> int:
    """Validate a script's knobs, then run `fn(knobs)`; project errors print one clear line, exit status 2.
    With `--help` on the command line it lists the knobs (`help_knobs`, else the schema's) and runs nothing."""
    import sys

    from kohakumoss_common.errors import KohakuMossError

    if wants_help(sys.argv):
        print(knob_help(schema, script, help_knobs), end="")
        return 0
    try:
        given = {**script_knobs(module_globals), **schema.miscased(module_globals)}
        knobs = schema.validate(given, source=f"{script} knobs")
        check_folder_knobs(knobs)
        fn(knobs)
    except KohakuMossError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (the trainer's Terminated, with its signum)
        signum = getattr(e, "signum", 2)
        print("interrupted" if signum == 2 else "terminated", file=sys.stderr)
        return 128 + signum
    return 0

"""Write the small config files of the example scripts, and check one when kohakumoss-config is missing.

    python scripts/examples/write_config.py write OUT.py [--base BASE.py] [--weights DIR] [--data DIR [--source KIND]]
        [--str K=V] [--int K=V] [--float K=V] [--bool K=V] [--item K=V] [--ints K=1,2]
        [--prompts-from K=DATASET] [--adapter PATH [--multiplier M]] [--no-adapters] [--set K=LITERAL]
    python scripts/examples/write_config.py check FILE.py --script train|sample

`write` makes a kogine config: `use_config(BASE)` (the file kohakumoss-config wrote) and then the
given knobs, each value written with repr() so Windows paths and quotes survive. Without --base,
--weights and --data fill WEIGHTS / TEXT_ENCODER / VAE / DATASET from the folder layout (the plain
fallback). `check` validates a config against the script's knob schema (names, types, ranges, paths).
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path
from typing import Any

CAPTION_EXTENSIONS = (".txt", ".caption")


def pick_file(folder: Path, hints: tuple[str, ...]) -> Path | None:
    """The .safetensors file of `folder` whose name holds a hint (the first by name), else the first one."""
    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    for hint in hints:
        for f in files:
            if hint in f.name.lower():
                return f
    return files[0] if files else None


def find_tokenizer(folder: Path) -> Path | None:
    """A folder holding tokenizer.json or tokenizer_config.json up to 3 levels under `folder` (names with
    'tokenizer' first, then the shallowest): kohakumoss-config's rule (cli/config_weights.find_tokenizer)."""
    found = {
        marker.parent
        for level in (1, 2, 3)
        for name in ("tokenizer.json", "tokenizer_config.json")
        for marker in (folder.glob("/".join(["*"] * level) + "/" + name) if folder.is_dir() else ())
    }
    ranked = sorted(found, key=lambda p: ("tokenizer" not in p.name.lower(), len(p.parts), str(p)))
    return ranked[0] if ranked else None


def weights_knobs(root: Path) -> dict[str, str]:
    """WEIGHTS / TEXT_ENCODER / VAE (and TOKENIZER where one exists) from a ComfyUI or HF weights folder."""
    if (root / "diffusion_models").is_dir():  # ComfyUI/models
        found = {
            "WEIGHTS": pick_file(root / "diffusion_models", ("moss",)),
            "TEXT_ENCODER": pick_file(root / "text_encoders", ("qwen",)),
            "VAE": pick_file(root / "vae", ("flux2",)),
        }
        tokenizer = find_tokenizer(root / "text_encoders")
        if tokenizer is not None:  # a single-file text encoder needs one, as kohakumoss-config looks for it
            found["TOKENIZER"] = tokenizer
    elif (root / "transformer").is_dir():  # an HF snapshot (OpenMOSS-Team/MOSS-Image-Base)
        found = {k: root / sub for k, sub in (("WEIGHTS", "transformer"), ("TEXT_ENCODER", "text_encoder"))}
        found["VAE"] = root / "vae"
        if (root / "tokenizer").is_dir():
            found["TOKENIZER"] = root / "tokenizer"
    else:
        raise SystemExit(
            f"write_config: '{root}' is neither a ComfyUI models folder (diffusion_models/, text_encoders/, "
            "vae/) nor an HF snapshot (transformer/, text_encoder/, vae/)"
        )
    missing = [k for k, p in found.items() if p is None or not Path(p).exists()]
    if missing:
        raise SystemExit(f"write_config: no file for {', '.join(missing)} under '{root}'")
    return {k: str(p) for k, p in found.items()}


def first_captions(data: Path, n: int = 2) -> list[str]:
    """The first `n` non-empty captions of a dataset folder (sorted by path): default sample prompts."""
    out = []
    for f in sorted(p for p in data.rglob("*") if p.suffix in CAPTION_EXTENSIONS):
        text = f.read_text(encoding="utf-8", errors="replace").strip()
        if text:
            out.append(text.splitlines()[0])
        if len(out) == n:
            break
    return out


def _pairs(items: list[str], flag: str) -> list[tuple[str, str]]:
    out = []
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.isupper():
            raise SystemExit(f"write_config: {flag} wants KNOB=VALUE with an UPPER_CASE knob, got '{item}'")
        out.append((key, value))
    return out


def literal(value: str) -> Any:
    """A --set value: a Python literal where it parses as one (2e-4, True, [1, 2], {...}), else the text."""
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value


def collect_knobs(args: argparse.Namespace) -> dict[str, Any]:
    knobs: dict[str, Any] = {}
    if args.weights:
        knobs.update(weights_knobs(Path(args.weights)))
    if args.data:
        knobs["DATASET"] = {"kind": args.source or "kohya", "path": args.data}
    for key, value in _pairs(args.str, "--str"):
        knobs[key] = value
    for key, value in _pairs(args.int, "--int"):
        knobs[key] = int(value)
    for key, value in _pairs(args.float, "--float"):
        knobs[key] = float(value)
    for key, value in _pairs(args.bool, "--bool"):
        if value.lower() not in ("true", "false", "1", "0"):
            raise SystemExit(f"write_config: --bool {key} wants true or false, got '{value}'")
        knobs[key] = value.lower() in ("true", "1")
    for key, value in _pairs(args.item, "--item"):
        knobs.setdefault(key, []).append(value)
    for key, value in _pairs(args.ints, "--ints"):
        knobs[key] = [int(v) for v in value.split(",") if v.strip()]
    for key, value in _pairs(args.prompts_from, "--prompts-from"):
        if key not in knobs:  # explicit --item prompts win
            knobs[key] = first_captions(Path(value))
    if args.adapter:
        mults = args.multiplier or []
        knobs["ADAPTERS"] = [
            [path, float(mults[i])] if i < len(mults) else path for i, path in enumerate(args.adapter)
        ]
    if args.no_adapters:
        knobs["ADAPTERS"] = []
    for key, value in _pairs(args.set, "--set"):  # last, so it wins over every option above
        knobs[key] = literal(value)
    return knobs


def render(knobs: dict[str, Any], base: str | None, out: Path) -> str:
    lines = ["# Written by scripts/examples/write_config.py; rerunning the example script rewrites it."]
    if base:
        base_path = Path(base).resolve()
        rel = base_path.parent == out.resolve().parent
        lines += [
            "from kohakuengine import use_config",
            "",
            f"use_config({(base_path.name if rel else str(base_path))!r})",
        ]
    lines.append("")
    lines += [f"{key} = {value!r}" for key, value in knobs.items()]
    return "\n".join(lines) + "\n"


def cmd_write(args: argparse.Namespace) -> int:
    out = Path(args.out)
    text = render(collect_knobs(args), args.base, out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(out)
    print(f"wrote {out}")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from kohakuengine.config import load_config_file

    if args.script == "train":
        from kohakumoss.config.train import TRAIN_SCHEMA as schema
    else:
        from kohakumoss.config.sample import SAMPLE_SCHEMA as schema
    values = load_config_file(args.file).globals_dict
    problems = schema.problems({k: v for k, v in values.items() if k.isupper()})
    for knob, problem in problems:
        print(f"{args.file}: {knob}: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"{args.file}: ok ({args.script} knobs)")
    return 0


def cmd_needs_cache(args: argparse.Namespace) -> int:
    """0 (and the knobs that say so) when the config trains from the caches only, else 1."""
    from kohakuengine.config import load_config_file

    values = load_config_file(args.file).globals_dict
    cached = [f"{k}={values[k]!r}" for k in ("VAE_ENCODE", "TEXT_ENCODE") if values.get(k) == "cache"]
    if cached:
        print(", ".join(cached))
    return 0 if cached else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write", help="write a config file")
    w.add_argument("out")
    w.add_argument("--base", help="config to extend (use_config)")
    w.add_argument("--weights", help="plain fallback: a ComfyUI models folder or an HF snapshot")
    w.add_argument("--data", help="plain fallback: the dataset folder or file")
    w.add_argument("--source", help="plain fallback: the dataset kind (default kohya)")
    for flag in ("--str", "--int", "--float", "--bool", "--item", "--ints", "--prompts-from", "--set"):
        w.add_argument(flag, action="append", metavar="KNOB=VALUE")
    w.add_argument("--adapter", action="append", help="an ADAPTERS entry (repeatable)")
    w.add_argument("--multiplier", action="append", help="the multiplier of the n-th --adapter")
    w.add_argument("--no-adapters", action="store_true", help="ADAPTERS = [] (the base model)")
    c = sub.add_parser("check", help="validate a config against a script's knob schema")
    c.add_argument("file")
    c.add_argument("--script", choices=("train", "sample"), required=True)
    n = sub.add_parser("needs-cache", help="exit 0 when the config trains from the caches only")
    n.add_argument("file")
    args = parser.parse_args(argv)
    return {"write": cmd_write, "check": cmd_check, "needs-cache": cmd_needs_cache}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())

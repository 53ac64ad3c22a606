"""kohakumoss-config: write a checked config for your GPU and dataset, or check one.

    kohakumoss-config new train --weights ComfyUI/models --data path/to/dataset --name my-lora
    kohakumoss-config new sample --weights ComfyUI/models --adapter my-lora-comfy.safetensors --name my-sample
    kohakumoss-config new data --data path/to/dataset --name my-set
    kohakumoss-config new data --train configs/user/my-lora.py --name my-lora   (its caches' data config)
    kohakumoss-config new --from lora_24g_bf16 configs/user/my_run.py
    kohakumoss-config wizard
    kohakumoss-config check configs/user/my-lora.py
    kohakumoss-config profiles --gpu-mem 8 [--config configs/user/my-lora.py] [--all]

Configs compose preset layers from configs/moss/ (gpu -> algo -> data -> your knobs); see
docs/guides/configs.md.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kohakumoss_common.errors import KohakuMossError

from .config_layers import RESOLUTIONS, data_layer_name, layer_path, list_layers, source_kinds

SAMPLE_USAGE = "kogine run scripts/sample/sample.py --config {p} --set PROMPT='a lighthouse at dusk'"


@dataclass
class NewRequest:
    what: str  # train, sample or data
    name: str
    weights: str = ""
    data: str = ""
    references: str = ""  # edit training: the dataset's `references` (a folder, or a field name)
    source: str = "auto"
    resolution: str = "1mp"
    algo: str = "lora"
    gpu: str = "auto"
    adapter: str = ""
    train_config: str = ""  # new data: the training config whose caches to fill (instead of data)
    out_dir: str = "configs/user"
    force: bool = False
    no_check: bool = False
    said: list[str] = field(default_factory=list)


class Refused(Exception):
    """A request the tool will not write (its reasons are already printed)."""


def _say(req: NewRequest, line: str) -> None:
    req.said.append(line)
    print(line)


def _target(req: NewRequest, suffix: str = "") -> Path:
    path = Path(req.out_dir) / f"{req.name}{suffix}.py"
    if path.exists() and not req.force:
        raise Refused(f"{path} exists: pass --force to overwrite it")
    return path


def _write(path: Path, text: str) -> None:
    from kohakumoss_common.io import atomic_write_text

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text)
    print(f"wrote {path}")


def _problems(req: NewRequest, problems: list[tuple[str, str]]) -> None:
    for knob, msg in problems:
        print(f"  {knob}: {msg}", file=sys.stderr)
    if problems and not req.no_check:
        raise Refused(f"{len(problems)} problem(s): nothing written (--no-check writes the config anyway)")


def new_config(req: NewRequest) -> list[Path]:
    """Write the config(s) of `req`; returns the paths written. Raises Refused or a KohakuMossError."""
    from kohakumoss.adapters.config import ALGO_CHOICES
    from kohakumoss.config.data_scripts import DATA_SCHEMA
    from kohakumoss.config.sample import SAMPLE_SCHEMA
    from kohakumoss.config.train import TRAIN_SCHEMA

    from .config_dataset import check_dataset, dataset_captions, dataset_spec, guess_source
    from .config_gpu import resolve_gpu
    from .config_layers import load_file
    from .config_weights import WeightsFound, find_weights
    from .config_write import render_data, render_layered, render_plain

    if req.what not in ("train", "sample", "data"):
        raise Refused(f"new: say what to write: train, sample or data (got {req.what!r})")
    if req.algo not in ALGO_CHOICES:
        raise Refused(f"--algo {req.algo!r} is not one of {list(ALGO_CHOICES)}")
    if req.what in ("train", "sample") and not req.weights:
        raise Refused("--weights DIR is needed (a ComfyUI models folder, an HF folder or a DiT checkpoint)")
    if req.what == "data" and req.train_config:
        return [_data_for_training(req)]
    if req.what in ("train", "data") and not req.data:
        raise Refused("--data DIR is needed (the dataset folder or file)")
    gpu = resolve_gpu(req.gpu)
    if gpu.message:
        _say(req, gpu.message)
    _say(req, f"GPU: {gpu.description} -> layer gpu/{gpu.layer}")
    problems: list[tuple[str, str]] = []
    found = WeightsFound("none")
    given: dict[str, str] = {}
    if req.what in ("train", "sample"):
        if not req.weights:
            raise Refused(
                "--weights DIR is needed (a ComfyUI models folder, an HF folder or a DiT checkpoint)"
            )
        found = find_weights(req.weights)
        problems += found.problems
        given = given_knobs(found, req.weights)
        if found.dit_layout:
            _say(req, f"weights: {found.kind} folder, DiT {found.dit} ({found.dit_layout} layout)")
        for n in found.notes:
            _say(req, f"note: {n}")
    spec: dict[str, Any] = {}
    if req.what in ("train", "data"):
        source = guess_source(req.data) if req.source == "auto" else req.source
        if source not in source_kinds():
            raise Refused(f"--source {source!r} is not one of {list(source_kinds())}")
        spec = dataset_spec(req.data, source, req.references)
        if msg := check_dataset(spec):
            problems.append(("DATASET", msg))
        else:
            refs = f", references {spec['references']}" if "references" in spec else ""
            _say(req, f"data: {source} source at {spec['path']}{refs}")
    _problems(req, problems)

    metadata = {"kind": req.what, "card": gpu.description, "card_gb": gpu.card_gb}
    gpu_file = layer_path("gpu", gpu.layer)
    if req.what == "sample":
        path = _target(req)
        knobs = {**given, "ADAPTERS": [req.adapter] if req.adapter else []}
        knobs["PRECISION"] = load_file(gpu_file)[0].get("PRECISION", "bf16")
        knobs["OUT_DIR"] = f"samples/{req.name}"
        usage = [SAMPLE_USAGE.format(p=path.as_posix())]
        _write(path, render_plain(f"{req.name}: sampling config", usage, metadata, knobs, SAMPLE_SCHEMA))
        return [path]

    data_layer = layer_path("data", data_layer_name(spec["kind"], req.resolution))
    written = []
    data_path = _target(req, "_data")
    data_usage = [
        f"kogine run scripts/data/{s}.py --config {data_path.as_posix()}"
        for s in ("inspect_data", "cache_text", "cache_latents")
    ]
    own_data = {"DATASET": spec, "CACHE_DIR": f"cache/{req.name}", "RUN_DIR": f"runs/inspect/{req.name}"}
    if req.what == "data":
        _write(
            data_path,
            render_data(
                data_path, f"{req.name}: data-scripts config", data_usage, [data_layer], own_data, DATA_SCHEMA
            ),
        )
        return [data_path]

    path = _target(req)
    layers = [gpu_file, layer_path("algo", req.algo), data_layer]
    knobs = {**given, "DATASET": spec, "CACHE_DIR": f"cache/{req.name}", "RUN_NAME": req.name}
    comments = {}
    if prompts := dataset_captions(spec):  # so a first run draws a grid (base row above the run's)
        knobs["SAMPLE_PROMPTS"] = prompts
        comments["SAMPLE_PROMPTS"] = "the dataset's first captions: the sample grid's columns (samples/)"
        if "references" in spec:
            comments["SAMPLE_PROMPTS"] += "; --ri: each one's references, as the edit model sees them"
    else:
        _say(req, "note: no caption found in the dataset: set SAMPLE_PROMPTS to get sample grids")
    if choice := _memory_profile(found, layers, knobs, gpu.card_gb):
        knobs["MEMORY_PROFILE"], comments["MEMORY_PROFILE"] = choice
        _say(req, f"memory profile: {choice[0]} ({choice[1]})")
    body = [
        f"Layers, later overriding earlier: gpu/{gpu.layer} ({gpu.description}) -> algo/{req.algo} -> "
        f"data/{data_layer.stem} -> the knobs below.",
        f"Data first: {data_path.as_posix()} (inspect, then cache text and latents).",
        f"Check it: kohakumoss-config check {path.as_posix()}",
    ]
    usage = [f"kogine run scripts/train/moss.py --config {path.as_posix()}"]
    _write(
        path,
        render_layered(
            path, f"{req.name}: training config", usage, body, layers, metadata, knobs, TRAIN_SCHEMA, comments
        ),
    )
    written.append(path)
    own_data.pop("DATASET")
    own_data.pop("CACHE_DIR")
    _write(
        data_path,
        render_data(data_path, f"{req.name}: data-scripts config", data_usage, [path], own_data, DATA_SCHEMA),
    )
    written.append(data_path)
    _after_write(req, path)
    return written


def _data_for_training(req: NewRequest) -> Path:
    """`new data --train FILE`: a data config that reads every plan and encoder knob from FILE, so the
    caches it fills are the ones that training config reads (whatever FILE's own knobs and layers set)."""
    from kohakumoss.config.data_scripts import DATA_SCHEMA

    from .config_layers import load_file
    from .config_write import render_data

    train = Path(req.train_config)
    if not train.is_file():
        raise Refused(f"--train {train}: no such file")
    if load_file(train)[1].get("kind") != "train":
        raise Refused(f"--train {train}: not a training config (its _metadata says no kind 'train')")
    path = _target(req, "_data")
    usage = [
        f"kogine run scripts/data/{s}.py --config {path.as_posix()}"
        for s in ("inspect_data", "cache_text", "cache_latents")
    ]
    own = {"RUN_DIR": f"runs/inspect/{req.name}"}
    _write(path, render_data(path, f"{req.name}: data-scripts config", usage, [train], own, DATA_SCHEMA))
    return path


def given_knobs(found, weights: str) -> dict[str, str]:
    """The weight knobs to write: what was found, and the user's own --weights path where nothing was
    (a problem that --no-check lets through must not turn the path they gave into an empty knob)."""
    knobs = found.knobs()
    knobs["WEIGHTS"] = knobs["WEIGHTS"] or str(weights)
    return knobs


def _memory_profile(found, layers: list[Path], own: dict[str, Any], card_gb: float) -> tuple[str, str] | None:
    """MEMORY_PROFILE for the card: the fastest catalog entry that fits (None: the DiT's size is unknown)."""
    from kohakumoss.config.train import TRAIN_SCHEMA

    from .config_check import encoder_bytes
    from .config_layers import compose
    from .config_profiles import CatalogView, chosen_profile

    if found.dit_config is None:
        return None
    knobs = {**TRAIN_SCHEMA.defaults(), **compose(layers, own)}
    knobs.pop("MEMORY_PROFILE", None)  # the choice below replaces the layer's
    te, vae = encoder_bytes(knobs)
    view = CatalogView(knobs, found.dit_config, found.dit, found.dit_params, te, vae, card_gb, [])
    return chosen_profile(view)


def _after_write(req: NewRequest, path: Path) -> None:
    """Validate what was written; a memory estimate above the card is said (the config is written)."""
    from .config_check import check_config

    res = check_config(path)
    for knob, msg in res.problems:
        _say(req, f"{'note' if knob == 'memory' else 'problem'}: {knob}: {msg}")
    if res.memory_lines:
        _say(req, "memory plan and estimate of one training step:")
        for line in res.memory_lines:
            _say(req, line)
    _say(
        req,
        f"next: kogine run scripts/data/inspect_data.py --config {Path(req.out_dir, req.name + '_data.py').as_posix()}",
    )
    _say(req, f"      kogine run scripts/train/moss.py --config {path.as_posix()}")


def new_from_recipe(
    recipe: str, target: str, force: bool = False, extra: dict[str, Any] | None = None
) -> Path:
    """Write `target` extending configs/moss/recipes/<recipe>.py with every train knob and its value."""
    from kohakumoss.config.train import TRAIN_SCHEMA

    from .config_layers import load_file, use_line
    from .config_write import header, knob_line

    recipe_file = layer_path("recipes", recipe)
    path = Path(target)
    if path.exists() and not force:
        raise Refused(f"{path} exists: pass --force to overwrite it")
    knobs, metadata = load_file(recipe_file)
    values = {**TRAIN_SCHEMA.defaults(), **knobs, **(extra or {})}
    lines = header(
        f"{path.stem}: training config extending recipe {recipe}",
        [f"kogine run scripts/train/moss.py --config {path.as_posix()}"],
        [
            "Every knob of scripts/train/moss.py is listed with the value the recipe gives it (or the",
            "script's default) and one line of help. Your lines override the recipe; delete a line to",
            f"fall back to the recipe's value. Check it: kohakumoss-config check {path.as_posix()}",
        ],
    )
    lines += ["from kohakuengine import use_config", "", use_line(recipe_file, path.parent), ""]
    meta = {"kind": "train", "recipe": recipe, **{k: v for k, v in metadata.items() if k != "kind"}}
    lines += [f"_metadata = {meta!r}  # not a knob: read by kohakumoss-config check", ""]
    for name in TRAIN_SCHEMA.knobs:
        line = knob_line(name, values[name], TRAIN_SCHEMA)
        if name not in knobs and name not in (extra or {}):
            line = line.replace("  # ", "  # [script default] ", 1)
        lines.append(line)
    _write(path, "\n".join(lines) + "\n")
    return path


def _ask(
    prompt: str,
    default: str,
    choices: tuple[str, ...] | None = None,
    check: Callable[[str], str | None] | None = None,
) -> str:
    """One answer, checked as it is given: a bad one is said at once and asked again (3 tries)."""
    for _ in range(3):
        hint = f" ({'/'.join(choices)})" if choices and len(choices) <= 14 else ""
        print(f"{prompt}{hint} [{default}]: ", end="", flush=True)
        line = sys.stdin.readline()
        if not line:  # end of input: take the default
            print()
            answer = default
        else:
            answer = line.strip() or default
        if choices is not None and answer not in choices:
            print(f"  please answer one of {list(choices)}")
        elif not (answer or default):
            print("  an answer is needed")
        elif check is not None and (problem := check(answer)):
            print(f"  {problem}: please answer again")
        else:
            return answer
        if not line:
            break
    raise Refused(f"no usable answer for: {prompt}")


class _Answers:
    """The wizard's answers so far; when it stops, they are said as the `new` command that resumes them."""

    def __init__(self, out_dir: str, force: bool, no_check: bool):
        self.req = NewRequest(what="", name="", out_dir=out_dir, force=force, no_check=no_check)

    def command(self) -> str:
        r = self.req
        parts = ["kohakumoss-config new", r.what or "train"]
        for flag, value, unset in (
            ("--gpu", r.gpu, "auto"),
            ("--algo", r.algo, "lora"),
            ("--data", r.data, ""),
            ("--references", r.references, ""),
            ("--source", r.source, "auto"),
            ("--resolution", r.resolution, "1mp"),
            ("--weights", r.weights, ""),
            ("--adapter", r.adapter, ""),
            ("--name", r.name, ""),
        ):
            if value != unset:
                parts.append(f"{flag} {shlex.quote(str(value))}")
        parts.append(f"--out-dir {shlex.quote(r.out_dir)}")
        parts += ["--force"] * r.force + ["--no-check"] * r.no_check
        return " ".join(parts)


def _problem_or_note(problem: str | None, no_check: bool) -> str | None:
    """With --no-check a weights or data problem is said and the answer kept."""
    if problem and no_check:
        print(f"  note: {problem} (kept: --no-check)")
        return None
    return problem


def wizard(out_dir: str = "configs/user", force: bool = False, no_check: bool = False) -> list[Path]:
    """Ask for what `new` takes, checking each answer as it is given, then write the same files."""
    from kohakumoss.adapters.config import ALGO_CHOICES
    from kohakumoss.config.rules import run_name_problem

    from .config_dataset import check_dataset, dataset_spec, guess_source
    from .config_gpu import detect_gpu, resolve_gpu
    from .config_weights import find_weights

    def gpu_problem(answer: str) -> str | None:
        try:
            resolve_gpu(answer)
        except KohakuMossError as e:
            return str(e)
        return None

    def data_problem(answer: str, source: str | None = None) -> str | None:
        if not Path(answer).expanduser().exists():
            return f"'{answer}' does not exist"
        spec = dataset_spec(answer, source or guess_source(answer))
        return _problem_or_note(check_dataset(spec), no_check)

    def weights_problem(answer: str) -> str | None:
        problems = find_weights(answer).problems
        msg = "; ".join(f"{knob}: {m}" for knob, m in problems) if problems else None
        if msg and not Path(answer).expanduser().exists():
            return msg  # a mistyped path is asked again even with --no-check
        return _problem_or_note(msg, no_check)

    def adapter_problem(answer: str) -> str | None:
        return None if answer == "-" or Path(answer).expanduser().is_file() else f"no file '{answer}'"

    def name_problem(answer: str) -> str | None:
        if problem := run_name_problem(answer):
            return problem
        taken = [
            p for p in (Path(out_dir) / f"{answer}.py", Path(out_dir) / f"{answer}_data.py") if p.exists()
        ]
        if taken and not force:
            return f"{taken[0]} exists (another name, or --force to overwrite)"
        return None

    answers = _Answers(out_dir, force, no_check)
    req = answers.req
    found = detect_gpu()
    print(f"GPU found: {found[0]} ({found[1]:.1f} GiB)" if found else "no GPU found")
    try:
        req.what = _ask("what to write", "train", ("train", "sample", "data"))
        req.gpu = _ask(
            "GPU: auto, a card name (rtx4090), vram_<N>g or memory in GB", "auto", check=gpu_problem
        )
        if req.what == "train":
            req.algo = _ask("algorithm", "lora", tuple(ALGO_CHOICES))
        if req.what in ("train", "data"):
            req.data = _ask("dataset folder or file", "", check=data_problem)
            req.source = _ask(
                "dataset kind",
                guess_source(req.data),
                source_kinds(),
                check=lambda a: data_problem(req.data, a),
            )
            req.resolution = _ask("training resolution", "1mp", RESOLUTIONS)
        if req.what in ("train", "sample"):
            req.weights = _ask(
                "weights folder (ComfyUI models folder, HF folder or DiT file)", "", check=weights_problem
            )
        if req.what == "sample":
            adapter = _ask("adapter file (empty: the base model)", "-", check=adapter_problem)
            req.adapter = "" if adapter == "-" else adapter
        default_name = {"train": "my-lora", "sample": "my-sample", "data": "my-data"}[req.what]
        req.name = _ask("config name", default_name, check=name_problem)
        return new_config(req)
    except (Refused, KohakuMossError):
        print(f"your answers so far: {answers.command()}", file=sys.stderr)
        raise


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kohakumoss-config", description="Write or check KohakuMoss configs (docs/guides/configs.md)."
    )
    sub = p.add_subparsers(dest="command", required=True)
    n = sub.add_parser("new", help="write a config: new train|sample|data ..., or new --from RECIPE FILE.py")
    n.add_argument("what", nargs="?", help="train, sample or data (with --from: the file to write)")
    n.add_argument(
        "--from",
        dest="recipe",
        help=f"a recipe of configs/moss/recipes/ ({', '.join(list_layers('recipes'))})",
    )
    n.add_argument("--name", help="config name: writes OUT_DIR/NAME.py (and NAME_data.py)")
    n.add_argument("--weights", default="", help="ComfyUI models folder, HF folder, or a DiT checkpoint")
    n.add_argument("--data", default="", help="dataset folder or file")
    n.add_argument(
        "--references",
        default="",
        help="edit training: the reference images' folder (kohya / folder: matched by the targets' "
        "stems) or the field naming them (jsonl / parquet / webdataset)",
    )
    n.add_argument(
        "--source",
        default="auto",
        help="dataset kind: auto (guessed) or a data source kind (kohya, folder, ...)",
    )
    n.add_argument("--resolution", default="1mp", choices=RESOLUTIONS, help="data layer's target area")
    n.add_argument("--algo", default="lora", help="adapter algorithm or full")
    n.add_argument("--gpu", default="auto", help="auto, a card name (rtx4090), vram_<N>g, or memory in GB")
    n.add_argument("--adapter", default="", help="sample: adapter file to load")
    n.add_argument(
        "--train", default="", help="data: the training config whose caches to fill (instead of --data)"
    )
    n.add_argument("--out-dir", default="configs/user")
    n.add_argument("--force", action="store_true", help="overwrite existing files")
    n.add_argument(
        "--no-check", action="store_true", help="write even when the weights or data have problems"
    )
    w = sub.add_parser("wizard", help="ask for the GPU, algorithm, data and weights, then write the config")
    w.add_argument("--out-dir", default="configs/user")
    w.add_argument("--force", action="store_true")
    w.add_argument(
        "--no-check", action="store_true", help="keep weights or data answers that have problems (said)"
    )
    pr = sub.add_parser(
        "profiles", help="the memory catalog: predicted peak and cost of each plan, and the fastest that fits"
    )
    pr.add_argument(
        "--gpu-mem",
        default=None,
        help="card memory in GB, a card name or vram_<N>g (default: the config's, else the GPU)",
    )
    pr.add_argument(
        "--config", default=None, help="a training config (default: the script's defaults, moss-image-5b)"
    )
    pr.add_argument(
        "--tokens", type=int, default=None, help="TOKENS_PER_STEP to price (default: the config's)"
    )
    pr.add_argument("--algo", default=None, help="ALGO to price (an adapter or full)")
    pr.add_argument("--all", action="store_true", help="list every catalog entry")
    c = sub.add_parser("check", help="report every problem of a config by knob; non-zero exit status if any")
    c.add_argument("file")
    c.add_argument(
        "--gpu", default=None, help="compare the memory estimate with this card (default: the config's)"
    )
    c.add_argument(
        "--script", choices=("train", "sample", "data"), default=None, help="default: from the file"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "check":
            from .config_check import check_config

            res = check_config(args.file, gpu=args.gpu, kind=args.script)
            print(res.text())
            return 1 if res.problems else 0
        if args.command == "profiles":
            return _profiles(args)
        if args.command == "wizard":
            wizard(args.out_dir, args.force, args.no_check)
            return 0
        if args.recipe:
            if not args.what:
                raise Refused("new --from RECIPE FILE.py: give the file to write")
            extra = _weights_and_data(args)
            new_from_recipe(args.recipe, args.what, args.force, extra)
            return 0
        if not args.name:
            raise Refused("new: --name NAME is needed")
        req = NewRequest(
            what=args.what or "",
            name=args.name,
            weights=args.weights,
            data=args.data,
            references=args.references,
            source=args.source,
            resolution=args.resolution,
            algo=args.algo,
            gpu=args.gpu,
            adapter=args.adapter,
            train_config=args.train,
            out_dir=args.out_dir,
            force=args.force,
            no_check=args.no_check,
        )
        new_config(req)
        return 0
    except Refused as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KohakuMossError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _profiles(args: argparse.Namespace) -> int:
    from kohakumoss.config.train import TRAIN_SCHEMA

    from .config_profiles import catalog_view, profiles_lines

    overrides: dict[str, Any] = {}
    if args.tokens is not None:
        overrides["TOKENS_PER_STEP"] = args.tokens
    if args.algo is not None:
        overrides["ALGO"] = args.algo
    if problems := TRAIN_SCHEMA.problems(overrides):
        raise Refused("; ".join(f"{k}: {m}" for k, m in problems))
    view = catalog_view(args.config, args.gpu_mem, overrides)
    print("\n".join(profiles_lines(view, show_all=args.all)))
    return 0


def _weights_and_data(args: argparse.Namespace) -> dict[str, Any]:
    """--weights / --data given with --from: their knobs (checked) on top of the recipe."""
    from .config_dataset import check_dataset, dataset_spec, guess_source
    from .config_weights import find_weights

    extra: dict[str, Any] = {}
    problems: list[tuple[str, str]] = []
    if args.weights:
        found = find_weights(args.weights)
        problems += found.problems
        extra.update(given_knobs(found, args.weights))
    if args.data:
        source = guess_source(args.data) if args.source == "auto" else args.source
        extra["DATASET"] = dataset_spec(args.data, source, args.references)
        if msg := check_dataset(extra["DATASET"]):
            problems.append(("DATASET", msg))
    req = NewRequest(what="train", name="", no_check=args.no_check)
    _problems(req, problems)
    return extra


if __name__ == "__main__":
    sys.exit(main())

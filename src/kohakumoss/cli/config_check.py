"""`kohakumoss-config check FILE.py`: every problem of a config, each named by its knob.

Unknown knobs (with a did-you-mean), wrong types, out-of-range values and missing paths come from the
script's schema; then the DiT's layout, the text encoder and VAE files, the dataset, and (for
training) the trainer's own refusals before it loads anything (`train/preflight.run_problems`) and the memory plan the trainer will resolve (MEMORY_PROFILE and the per-engine knobs) with its
predicted peak against the card's memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kohakumoss.config.train import TrainConfig
from kohakumoss.data_knobs import SCAN_KNOBS
from kohakumoss.distributed.rank_run import refusals as distributed_refusals
from kohakumoss.memory.plan import PLAN_KNOBS
from kohakumoss_common.errors import KohakuMossError
from kohakumoss_common.knobs import Schema

from .config_cache_check import cache_pair_problems
from .config_dataset import check_dataset
from .config_gpu import resolve_gpu
from .config_layers import load_file
from .config_weights import check_text_encoder, check_vae, inspect_dit

GIB = 1 << 30
# knobs the memory estimate reads: with a bad one, no estimate is attempted
MEMORY_INPUTS = (
    "PRECISION",
    "BASE_PRECISION",
    "RANK",
    "TOKENS_PER_STEP",
    "ALGO",
    "TARGET_PRESET",
    "GRAD_ACCUM",
    "AREA",
    "MAX_TEXT_TOKENS",
    "MEMORY_PROFILE",
    "CARD_GB",
    *PLAN_KNOBS,
    *SCAN_KNOBS,  # an edit dataset's references per target are its cached scan's (memory/references.py)
)


def schemas() -> dict[str, Schema]:
    from kohakumoss.config.data_scripts import DATA_SCHEMA
    from kohakumoss.config.sample import SAMPLE_SCHEMA
    from kohakumoss.config.train import TRAIN_SCHEMA

    return {"train": TRAIN_SCHEMA, "sample": SAMPLE_SCHEMA, "data": DATA_SCHEMA}


def guess_kind(knobs: dict[str, Any]) -> str:
    """The schema with the fewest unknown knobs (ties: train)."""
    names = [k for k in knobs if k.isupper() and not k.startswith("_")]
    scores = {kind: sum(n not in s.knobs for n in names) for kind, s in schemas().items()}
    return min(scores, key=lambda k: (scores[k], k != "train"))


@dataclass
class CheckResult:
    path: str
    kind: str
    problems: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    memory_lines: list[str] = field(default_factory=list)

    def text(self) -> str:
        head = f"{self.path}: {self.kind} config"
        lines = [head]
        lines += [f"  {k}: {p}" for k, p in self.problems]
        if self.memory_lines:
            lines += [
                "memory estimate of one training step (kohakumoss.memory.estimate):",
                *self.memory_lines,
            ]
        lines += [f"note: {n}" for n in self.notes]
        lines.append(f"{len(self.problems)} problem(s)" if self.problems else "ok")
        return "\n".join(lines)


def _model_files(knobs: dict[str, Any], out: CheckResult) -> tuple[Any, int | None]:
    """Check WEIGHTS / TEXT_ENCODER / VAE contents; return the DiT's (config, params) for the estimate."""
    from kohakumoss.model.presets import get_preset

    config, params = None, None
    weights = knobs.get("WEIGHTS", "")
    if isinstance(weights, str) and weights and Path(weights).exists():
        try:
            _, config, params = inspect_dit(weights)
        except (KohakuMossError, OSError, ValueError) as e:
            out.problems.append(("WEIGHTS", f"unrecognised DiT checkpoint: {e}"))
    for knob, fn in (("TEXT_ENCODER", check_text_encoder), ("VAE", check_vae)):
        value = knobs.get(knob, "")
        usable = isinstance(value, str) and value not in ("", "synthetic", "random") and Path(value).exists()
        if usable and (msg := fn(value)):
            out.problems.append((knob, msg))
    if config is None:
        preset = knobs.get("MODEL_PRESET") or "moss-image-5b"
        try:
            config = get_preset(preset)
        except KohakuMossError:
            preset, config = "moss-image-5b", get_preset("moss-image-5b")
        out.notes.append(f"DiT size for the memory estimate: the {preset} preset (WEIGHTS not read)")
    return config, params


def _card_gb(
    gpu: str | None, metadata: dict[str, Any], out: CheckResult, knobs: dict[str, Any]
) -> float | None:
    """--gpu, else the config's CARD_GB knob, else its _metadata card_gb; None when none says."""
    if gpu:
        choice = resolve_gpu(gpu)
        if choice.message:
            out.notes.append(choice.message)
            return None
        return choice.card_gb
    if float(knobs.get("CARD_GB") or 0) > 0:
        return float(knobs["CARD_GB"])
    if "card_gb" in metadata:
        return float(metadata["card_gb"])
    return None


def trainer_refusals(knobs: dict[str, Any]) -> list[tuple[str, str]]:
    """What the trainer refuses at setup that no single knob's schema sees (same wording as the trainer)."""
    out = []
    if not knobs.get("WEIGHTS") and not knobs.get("MODEL_PRESET"):
        out.append(("WEIGHTS", "set WEIGHTS to a DiT checkpoint (or MODEL_PRESET for random weights)"))
    if knobs.get("PRECISION") == "fp16" and str(knobs.get("DEVICE")) == "cpu":
        out.append(("PRECISION", "fp16 needs a GPU; use bf16 or fp32 on the CPU"))
    try:
        cfg = TrainConfig.from_knobs(knobs)
    except (TypeError, ValueError):  # a value of the wrong type: the schema named it already
        cfg = None
    if cfg is not None:  # DISTRIBUTED / DEVICES together, and what DDP cannot run with
        out += distributed_refusals(cfg)
    resume = knobs.get("RESUME")
    if isinstance(resume, str) and resume not in ("", "latest") and not Path(resume).exists():
        out.append(("RESUME", f"no checkpoint at '{resume}'"))
    return out


def check_config(path: str | Path, gpu: str | None = None, kind: str | None = None) -> CheckResult:
    """Load `path` as `kogine run --config` would and report every problem by knob name."""
    try:
        knobs, metadata = load_file(path)
    except Exception as e:  # a config that does not even load: say why, by file
        res = CheckResult(str(path), kind or "?")
        res.problems.append(("<file>", f"cannot load: {type(e).__name__}: {e}"))
        return res
    kind = kind or metadata.get("kind") or guess_kind(knobs)
    res = CheckResult(str(path), kind)
    schema = schemas()[kind]
    res.problems += schema.problems(knobs)
    merged = {**schema.defaults(), **{k: v for k, v in knobs.items() if k in schema.knobs}}
    if kind in ("train", "sample"):
        config, params = _model_files(merged, res)
    if kind == "train":
        res.problems += [p for p in trainer_refusals(merged) if p[0] not in {k for k, _ in res.problems}]
    if kind == "train":
        _run_checks(merged, res)
    if kind in ("train", "data") and "DATASET" in knobs and (msg := check_dataset(knobs["DATASET"])):
        res.problems.append(("DATASET", msg))
    if kind in ("train", "data"):
        res.problems += cache_pair_problems(path, kind, knobs, metadata)
    if kind == "train" and not any(k in MEMORY_INPUTS for k, _ in res.problems):
        _memory(merged, config, params, _card_gb(gpu, metadata, res, merged), metadata, res)
    return res


def _run_checks(knobs: dict[str, Any], res: CheckResult) -> None:
    """The trainer's own refusals before it loads anything (train/preflight.run_problems: the encoders,
    BASE_PRECISION and the dropouts with the adapter, ALGO_ARGS for ALGO, RANK against the targeted
    layers), each knob named once."""
    from kohakumoss.train.preflight import run_problems

    try:
        found = run_problems(TrainConfig.from_knobs(knobs))
    except (TypeError, ValueError, OSError):  # a value of the wrong type: the schema named it already
        return
    named = {k for k, _ in res.problems}
    res.problems += [p for p in found if p[0] not in named]


def encoder_bytes(knobs: dict[str, Any]) -> tuple[int, int]:
    """(text encoder, VAE) sizes for the estimate (files, or what 'random' builds); 0 when not set or synthetic."""
    from kohakumoss.memory.estimate import encoder_file_bytes

    return encoder_file_bytes(TrainConfig.from_knobs(knobs))


def _memory(knobs, config, params, card_gb, metadata, res: CheckResult) -> None:
    """Resolve the memory plan as the trainer will, estimate its peak, and compare it with the card."""
    from kohakumoss.distributed.rank_run import device_count
    from kohakumoss.memory import catalog, estimate_plan, fastest_fit, resolve_plan
    from kohakumoss.memory.profiles import rank_share

    cfg = TrainConfig.from_knobs(knobs)
    # a DDP / FSDP rank's share of the step, as the trainer plans it (DEVICES=0, every GPU: one rank's
    # whole step, an upper bound)
    share, shards = rank_share(cfg, device_count(cfg.parallel.devices) or 1)
    te, vae = encoder_bytes(knobs)
    full = cfg.adapter.algo == "full"
    try:
        plan, reason = resolve_plan(share, config, card_gb, full, params, te, vae, shards=shards)
    except KohakuMossError as e:  # an inconsistent plan: named by its knob
        knob = getattr(e, "knob", "memory")
        res.problems.append((knob, str(e).removeprefix(f"{knob}: ")))
        return
    est = estimate_plan(plan, share, config, params, te, vae, shards)
    res.memory_lines = [f"  plan: {reason}", _graphs_line(knobs, plan, res), *est.lines()]
    if note := _references_note(cfg):
        res.notes.append(note)
    if card_gb is None:
        res.notes.append("card memory unknown (no card_gb in the config's _metadata): pass --gpu to compare")
        return
    if est.total <= card_gb * GIB:
        return
    # an explicit profile ('auto' never gets here: with nothing under the card it refuses in resolve_plan)
    chosen = knobs.get("MEMORY_PROFILE") or "auto"
    hint = "lower TOKENS_PER_STEP, or set per-engine knobs (docs/concepts/profiles.md)"
    best = fastest_fit(catalog(config, share, params, te, vae, shards), card_gb * GIB)
    if best is not None:
        hint = (
            f"MEMORY_PROFILE='auto' picks {best.id} ({best.label}: {best.peak / GIB:.1f} GiB, "
            f"cost {best.cost:.2f}x)"
        )
    res.problems.append(
        (
            "memory",
            f"estimated peak {est.total / GIB:.1f} GiB with MEMORY_PROFILE {chosen!r} is above the "
            f"card's {card_gb:g} GiB: {hint}",
        )
    )


def _references_note(cfg: TrainConfig) -> str | None:
    """How many references per target the estimate priced for an edit dataset, and from what."""
    from kohakumoss.memory.calibration import ASSUMED_REFERENCES
    from kohakumoss.memory.estimate import references_per_target
    from kohakumoss.memory.references import scanned_references

    if not references_per_target(cfg):
        return None
    if scanned_references(cfg.data) is None:
        return (
            f"memory estimate: {ASSUMED_REFERENCES} reference image per target assumed (no scan of the "
            "dataset yet); the trainer prices the most any item has: check again after a scan "
            "(scripts/data/inspect_data.py)"
        )
    return f"memory estimate: {references_per_target(cfg)} reference image(s) per target (the dataset's scan)"


def _graphs_line(knobs, plan, res: CheckResult) -> str:
    """Whether the step will replay from a CUDA graph on a CUDA card; CUDA_GRAPHS='on' that cannot is a problem."""
    import torch

    from kohakumoss.train.graphs import graph_refusal

    dtype = {"fp16": torch.float16, "fp32": torch.float32}.get(knobs.get("PRECISION"), torch.bfloat16)
    algo = knobs.get("ALGO", "lora")
    dropouts = [float(knobs.get(n) or 0) for n in ("DROPOUT", "RANK_DROPOUT", "MODULE_DROPOUT")]
    why = graph_refusal(
        plan, torch.device("cuda"), algo, dropouts[2], dtype, draws_random=algo != "full" and any(dropouts)
    )
    mode = knobs.get("CUDA_GRAPHS", "auto")
    if mode == "on" and why is not None:
        res.problems.append(("CUDA_GRAPHS", f"'on' is not possible with this run: {why}"))
    if mode == "off":
        return "  CUDA graphs: off (CUDA_GRAPHS)"
    return (
        "  CUDA graphs: on (each micro-step replays from a graph)"
        if why is None
        else f"  CUDA graphs: off ({why})"
    )

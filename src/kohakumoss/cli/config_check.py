"""`kohakumoss-config check FILE.py`: every problem of a config, each named by its knob.

Unknown knobs (with a did-you-mean), wrong types, out-of-range values and missing paths come from the
script's schema; then the DiT's layout, the text encoder and VAE files, the dataset, and (for
training) the memory estimate against the card's memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kohakumoss.config.knobs import Schema
from kohakumoss_common.errors import KohakuMossError

from .config_dataset import check_dataset
from .config_gpu import resolve_gpu
from .config_layers import load_file
from .config_weights import check_text_encoder, check_vae, inspect_dit

GIB = 1 << 30


def schemas() -> dict[str, Schema]:
    from kohakumoss.config.sample import SAMPLE_SCHEMA
    from kohakumoss.config.train import TRAIN_SCHEMA

    from .config_data_schema import DATA_SCHEMA

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
        usable = isinstance(value, str) and value not in ("", "synthetic") and Path(value).exists()
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


def _card_gb(gpu: str | None, metadata: dict[str, Any], out: CheckResult) -> float | None:
    if gpu:
        choice = resolve_gpu(gpu)
        if choice.message:
            out.notes.append(choice.message)
            return None
        return choice.card_gb
    if "card_gb" in metadata:
        return float(metadata["card_gb"])
    return None


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
    if kind in ("train", "data") and "DATASET" in knobs and (msg := check_dataset(knobs["DATASET"])):
        res.problems.append(("DATASET", msg))
    if kind == "train" and not any(k in ("PRECISION", "RANK", "TOKENS_PER_STEP") for k, _ in res.problems):
        _memory(merged, config, params, _card_gb(gpu, metadata, res), metadata, res)
    return res


def _memory(knobs, config, params, card_gb, metadata, res: CheckResult) -> None:
    from kohakumoss.memory import estimate_peak, file_bytes

    te = file_bytes(knobs["TEXT_ENCODER"]) if knobs.get("TEXT_ENCODER") not in ("", "synthetic") else 0
    vae = file_bytes(knobs["VAE"]) if knobs.get("VAE") not in ("", "synthetic") else 0
    est = estimate_peak(knobs, config, params, te, vae)
    res.memory_lines = est.lines()
    if card_gb is None:
        res.notes.append("card memory unknown (no card_gb in the config's _metadata): pass --gpu to compare")
        return
    if est.total > card_gb * GIB:
        profile = metadata.get("memory_profile")
        why = (
            f"; the layer's '{profile}' memory profile, which would lower it, is not built yet"
            if profile
            else ""
        )
        res.problems.append(
            ("memory", f"estimated peak {est.total / GIB:.1f} GiB is above the card's {card_gb:g} GiB{why}")
        )

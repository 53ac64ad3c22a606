"""What an adapter file says about its run: kohya `ss_*` keys and ModelSpec (`modelspec.*`) metadata.

Safetensors metadata values are strings; lists and dicts are JSON. The same knobs give the same keys,
so a checkpoint re-exported later carries what its run's own exports carried.
"""

from __future__ import annotations

import base64
import io
import json
import math
import re
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from PIL import Image
from safetensors import safe_open

from kohakumoss.adapters.io import modelspec_architecture
from kohakumoss_common.errors import CheckpointError

THUMBNAIL_PX = 256  # longest side of the thumbnail
FORMAT_KEYS = ("kohakumoss_format", "kohakumoss_comfy_formats")  # describe one file, never carried over
_LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) ")


def run_dir(k: dict[str, Any]) -> Path:
    return Path(k["RUNS_DIR"]) / k["RUN_NAME"]


def started_at(folder: Path) -> float | None:
    """The run's start (unix seconds): the first timestamp of its log.txt, or None."""
    log = folder / "log.txt"
    if not log.is_file():
        return None
    with open(log, encoding="utf-8") as f:
        match = _LOG_TIME.match(f.readline())
    if match is None:
        return None
    return time.mktime(time.strptime(match.group(1), "%Y-%m-%d %H:%M:%S"))


def last_grid(folder: Path, step: int | None = None) -> Path | None:
    """The run's latest sample grid (`samples/grid_step_N.png`, N <= step when given), or None."""
    found = []
    for path in (folder / "samples").glob("grid_step_*.png"):
        n = int(path.stem.rsplit("_", 1)[1])
        if step is None or n <= step:
            found.append((n, path))
    return max(found)[1] if found else None


def thumbnail(path: str | Path, px: int = THUMBNAIL_PX) -> str:
    """A small JPEG copy of an image as a data URI (ModelSpec's thumbnail)."""
    with Image.open(path) as im:
        im = im.convert("RGB")
        im.thumbnail((px, px))
        buf = io.BytesIO()
        im.save(buf, "JPEG", quality=85)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _datasets(value: Any) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def run_metadata(k: dict[str, Any], step: int, folder: Path | None = None) -> dict[str, str]:
    """ss_* and modelspec.* of a run's adapter at `step` (knobs `k`; `folder`: the run folder, for its
    start time and last sample grid)."""
    from kohakumoss.optim.names import optimizer_label

    folder = run_dir(k) if folder is None else folder
    side = int(math.isqrt(int(k.get("AREA", 1024 * 1024))))
    algo = str(k.get("ALGO", "lora"))
    args = {
        "algo": algo,
        "preset": k.get("TARGET_PRESET"),
        "dropout": k.get("DROPOUT", 0.0),
        "rank_dropout": k.get("RANK_DROPOUT", 0.0),
        "module_dropout": k.get("MODULE_DROPOUT", 0.0),
        "bypass": k.get("BYPASS", "auto"),
        **dict(k.get("ALGO_ARGS", {})),
    }
    datasets = _datasets(k.get("DATASET", []))
    meta = {  # with adapter_metadata's fixed keys (ss_network_module, modelspec.sai_model_spec, ...)
        "ss_network_dim": str(k.get("RANK")),
        "ss_network_alpha": str(k.get("ALPHA")),
        "ss_network_args": json.dumps(args, sort_keys=True, default=str),
        "ss_network_dropout": str(k.get("DROPOUT", 0.0)),
        "ss_steps": str(step),
        "ss_max_train_steps": str(k.get("STEPS")),
        "ss_learning_rate": str(k.get("LR")),
        "ss_unet_lr": str(k.get("LR")),
        "ss_lr_scheduler": str(k.get("LR_SCHEDULE")),
        "ss_lr_warmup_steps": str(k.get("LR_WARMUP_STEPS", 0)),
        "ss_optimizer": optimizer_label(
            k.get("OPTIMIZER", "adamw"), k.get("OPTIMIZER_ARGS"), k.get("WEIGHT_DECAY", 0.0)
        ),
        "ss_gradient_accumulation_steps": str(k.get("GRAD_ACCUM", 1)),
        "ss_max_grad_norm": str(k.get("GRAD_CLIP")),
        "ss_seed": str(k.get("SEED")),
        "ss_datasets": json.dumps(datasets, default=str),
        "ss_dataset_dirs": json.dumps(
            {str(d.get("path")): {"kind": d.get("kind")} for d in datasets if isinstance(d, dict)}
        ),
        "ss_resolution": f"({side}, {side})",
        "ss_caption_dropout_rate": str(k.get("CAPTION_DROPOUT", 0.0)),
        "ss_shuffle_caption": str(k.get("SHUFFLE_CAPTION", False)),
        "ss_keep_tokens": str(k.get("KEEP_TOKENS", 0)),
        "ss_sd_model_name": Path(k.get("WEIGHTS") or "").name or str(k.get("MODEL_PRESET", "")),
        "ss_output_name": str(k.get("RUN_NAME")),
        "modelspec.architecture": modelspec_architecture(algo),
        "modelspec.title": str(k.get("RUN_NAME")),
        "modelspec.date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "modelspec.resolution": f"{side}x{side}",
    }
    if k.get("TRIGGER_PHRASE"):
        meta["modelspec.trigger_phrase"] = str(k["TRIGGER_PHRASE"])
    start = started_at(folder)
    if start is not None:
        meta["ss_training_started_at"] = str(start)
    grid = last_grid(folder, step)
    if grid is not None:
        meta["modelspec.thumbnail"] = thumbnail(grid)
    return meta


def read_metadata(path: str | Path) -> dict[str, str]:
    """The metadata of a safetensors file."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(path, "no such file")
    try:
        with safe_open(str(path), framework="pt") as f:
            return dict(f.metadata() or {})
    except Exception as e:  # safetensors raises its own error type on a bad header
        raise CheckpointError(path, f"not a readable safetensors file ({e})") from e


def carried(meta: dict[str, str]) -> dict[str, str]:
    """What a re-export keeps of a file's metadata: all but the keys that describe that one file."""
    return {key: v for key, v in meta.items() if key not in FORMAT_KEYS}


def describe(meta: dict[str, str], width: int = 100) -> str:
    """`key: value` lines, sorted; long values (the thumbnail) cut to `width` characters."""
    cut = lambda v: v if len(v) <= width else f"{v[:width]}... ({len(v)} chars)"  # noqa: E731
    return "\n".join(f"{key}: {cut(meta[key])}" for key in sorted(meta))

"""What an adapter file says about its run: kohya `ss_*` keys and ModelSpec (`modelspec.*`) metadata.

Safetensors metadata values are strings; lists and dicts are JSON. The same knobs give the same keys,
so a checkpoint re-exported later carries what its run's own exports carried. Datasets appear as kohya
records them (folder basenames, `run_facts.py`): a shared file names no local path.
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

from .run_facts import dataset_entries, entry_name, epoch_at, read_run_facts

THUMBNAIL_PX = 256  # longest side of the thumbnail
HASH_KEYS = ("sshs_model_hash", "sshs_legacy_hash", "modelspec.hash_sha256")  # each file's own data
# describe one file, never carried over
FORMAT_KEYS = ("kohakumoss_format", "kohakumoss_comfy_formats", *HASH_KEYS)
CAPTION_KEYS = {  # top-level key: the subset field it summarises (kohya writes both)
    "ss_caption_dropout_rate": "caption_dropout_rate",
    "ss_caption_tag_dropout_rate": "caption_tag_dropout_rate",
    "ss_shuffle_caption": "shuffle_caption",
    "ss_keep_tokens": "keep_tokens",
}
_SAMPLE_DIR = re.compile(r"^step_(\d+)$")


def run_dir(k: dict[str, Any]) -> Path:
    return Path(k["RUNS_DIR"]) / k["RUN_NAME"]


def last_sample(folder: Path, step: int | None = None) -> Path | None:
    """The first image of the run's latest sample row (`samples/step_N/sample_00.png`, N <= step when
    given): one picture, what a model page shows as its preview; None without samples."""
    found = []
    for path in (folder / "samples").glob("step_*/sample_*.png"):
        match = _SAMPLE_DIR.match(path.parent.name)
        if match and (step is None or int(match.group(1)) <= step):
            found.append((int(match.group(1)), path.name, path))
    return min(found, key=lambda f: (-f[0], f[1]))[2] if found else None


def thumbnail(path: str | Path, px: int = THUMBNAIL_PX) -> str:
    """A small JPEG copy of an image as a data URI (ModelSpec's thumbnail)."""
    with Image.open(path) as im:
        im = im.convert("RGB")
        im.thumbnail((px, px))
        buf = io.BytesIO()
        im.save(buf, "JPEG", quality=85)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _uniform(subsets: list[dict], field: str) -> Any:
    """A subset field's value when every subset agrees, else None (no top-level value to state)."""
    values = {json.dumps(sub.get(field)) for sub in subsets}
    return subsets[0].get(field) if len(values) == 1 else None


def dataset_metadata(k: dict[str, Any], facts: dict[str, Any], step: int) -> dict[str, str]:
    """The data's ss_* keys: kohya's shapes from the run's facts (`run_facts.py`), basenames only; without
    facts (a run from before they were written) the dataset folders' basenames from the knobs."""
    if not facts:
        names = [entry_name(e) for e in dataset_entries(k.get("DATASET", []))]
        return {"ss_datasets": json.dumps([{"subsets": [{"image_dir": n} for n in names]}])}
    subsets = [sub for d in facts["datasets"] for sub in d["subsets"] if not sub["is_reg"]]
    meta = {
        "ss_datasets": json.dumps(facts["datasets"]),
        "ss_dataset_dirs": json.dumps(facts["dataset_dirs"]),
        "ss_reg_dataset_dirs": json.dumps(facts["reg_dataset_dirs"]),
        "ss_tag_frequency": json.dumps(facts["tag_frequency"]),
        "ss_bucket_info": json.dumps(facts["bucket_info"]),
        "ss_num_train_images": str(facts["num_train_images"]),
        "ss_num_reg_images": str(facts["num_reg_images"]),
        "ss_enable_bucket": "True",
    }
    epochs = list(facts.get("epoch_steps", []))
    if epochs:
        micro = step * int(k.get("GRAD_ACCUM", 1))
        meta.update(
            ss_num_epochs=str(len(epochs)),
            ss_num_batches_per_epoch=str(epochs[0]),
            ss_epoch=str(epoch_at(epochs, micro)),
        )
    for key, field in CAPTION_KEYS.items():
        value = _uniform(subsets, field) if subsets else None
        if value is not None:  # datasets that differ: their values are in ss_datasets' subsets only
            meta[key] = str(value)
    if "started_at" in facts:
        meta["ss_training_started_at"] = str(facts["started_at"])
    return meta


def run_metadata(k: dict[str, Any], step: int, folder: Path | None = None) -> dict[str, str]:
    """ss_* and modelspec.* of a run's adapter at `step` (knobs `k`; `folder`: the run folder, for its
    facts (`train_facts.json`) and latest sample)."""
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
        "ss_resolution": f"({side}, {side})",
        "ss_caption_dropout_rate": str(k.get("CAPTION_DROPOUT", 0.0)),
        "ss_shuffle_caption": str(k.get("SHUFFLE_CAPTION", False)),
        "ss_keep_tokens": str(k.get("KEEP_TOKENS", 0)),
        "ss_sd_model_name": Path(k.get("WEIGHTS") or "").name or str(k.get("MODEL_PRESET", "")),
        "ss_output_name": str(k.get("RUN_NAME")),
        "ss_training_finished_at": str(time.time()),
        "modelspec.architecture": modelspec_architecture(algo),
        "modelspec.title": str(k.get("RUN_NAME")),
        "modelspec.date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "modelspec.resolution": f"{side}x{side}",
    }
    facts = read_run_facts(folder)
    if facts:  # the datasets' own caption settings replace the knobs' defaults, or are stated per dataset
        for key in CAPTION_KEYS:
            meta.pop(key, None)
    meta.update(dataset_metadata(k, facts, step))
    if k.get("TRIGGER_PHRASE"):
        meta["modelspec.trigger_phrase"] = str(k["TRIGGER_PHRASE"])
    sample = last_sample(folder, step)
    if sample is not None:
        meta["modelspec.thumbnail"] = thumbnail(sample)
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

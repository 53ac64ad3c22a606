"""What a run trained on, in kohya's metadata shapes: folder basenames (never a path), image counts and
repeats, tag frequencies from the captions, buckets and epochs. The trainer writes it once the plan is
built (`train_facts.json` in the run folder); `metadata.run_metadata` reads it into every export, so a
checkpoint re-exported later carries it too.
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from kohakumoss_common.io import atomic_write_json
from kohakumoss_data import Catalog, Plan
from kohakumoss_data.dataset_options import DatasetOptions
from kohakumoss_data.plan import dataset_of

FACTS_FILE = "train_facts.json"
SOURCE_FOLDERS = ("kohya",)  # sources whose first sub-folder is a kohya subset (`<repeats>_<name>`)


def dataset_entries(spec: Any) -> list[dict]:
    """The DATASET knob as a list of entries (a dict: one dataset)."""
    entries = list(spec) if isinstance(spec, (list, tuple)) else [spec]
    return [e if isinstance(e, dict) else {"path": str(e)} for e in entries]


def entry_name(entry: dict) -> str:
    """A dataset entry's folder (or file) basename: what kohya records of an image folder."""
    return Path(str(entry.get("path", ""))).name or str(entry.get("kind", "dataset"))


def _tags(caption: str, separator: str) -> list[str]:
    return [t.strip() for t in caption.split(separator) if t.strip()]


def _unique(name: str, taken: dict) -> str:
    """kohya's rule for a folder met twice: `name (2)`, `name (3)`, ..."""
    out, i = name, 2
    while out in taken:
        out, i = f"{name} ({i})", i + 1
    return out


def _buckets(counts: Counter) -> dict[str, Any]:
    """kohya's ss_bucket_info: {"buckets": {"0": {"resolution": [w, h], "count": n}, ...}}."""
    ordered = sorted(counts.items())
    return {"buckets": {str(i): {"resolution": list(r), "count": n} for i, (r, n) in enumerate(ordered)}}


def dataset_facts(spec: Any, catalog: Catalog, plan: Plan, side: int) -> dict[str, Any]:
    """The kohya-shaped description of the training data (`spec`: the DATASET knob; `catalog`: the
    training items; `plan`: their plan, whose first epoch gives the bucket counts; `side`: ss_resolution's)."""
    entries, knobs = dataset_entries(spec), plan.knobs
    several = catalog.source.get("kind") == "concat"
    options = [
        knobs.datasets[i] if i < len(knobs.datasets) else DatasetOptions() for i in range(len(entries))
    ]

    def pick(opts: DatasetOptions, name: str) -> Any:
        value = getattr(opts, name)
        return getattr(knobs, name) if value is None else value

    groups: dict[tuple[int, str], list] = defaultdict(list)  # (dataset, subset folder) -> items
    for item in catalog.usable:
        i, rel = dataset_of(item.key, several)
        folder = entries[i].get("kind") in SOURCE_FOLDERS and "/" in rel
        groups[(i, rel.split("/", 1)[0] if folder else entry_name(entries[i]))].append(item)

    first_epoch = plan.steps[: plan.epoch_steps[0]] if plan.epoch_steps else plan.steps
    bucket_counts: dict[int, Counter] = defaultdict(Counter)
    for step in first_epoch:
        for planned in step:
            bucket_counts[dataset_of(planned.key, several)[0]][tuple(planned.target)] += 1

    datasets, dirs, reg_dirs, tag_frequency = [], {}, {}, {}
    for i, opts in enumerate(options):
        separator = str(pick(opts, "caption_separator"))
        subsets, frequency, counts = [], {}, {"train": 0, "reg": 0}
        for (g, name), items in sorted(groups.items()):
            if g != i:
                continue
            repeats = max(1, items[0].repeats) * opts.repeats
            tags = Counter(t for it in items for c in it.captions for t in _tags(c, separator))
            frequency[name] = dict(sorted(tags.items(), key=lambda kv: (-kv[1], kv[0])))
            counts["reg" if opts.reg else "train"] += len(items) * repeats
            subsets.append(
                {
                    "image_dir": name,
                    "img_count": len(items),
                    "num_repeats": repeats,
                    "is_reg": bool(opts.reg),
                    "shuffle_caption": bool(pick(opts, "shuffle_caption")),
                    "keep_tokens": int(pick(opts, "keep_tokens")),
                    "keep_tokens_separator": "",
                    "caption_separator": separator,
                    "caption_dropout_rate": float(pick(opts, "caption_dropout")),
                    "caption_tag_dropout_rate": float(pick(opts, "tag_dropout")),
                    "flip_aug": float(knobs.flip_prob) > 0,
                    "random_crop": knobs.crop == "random",
                    "loss_weight": float(opts.loss_weight),
                }
            )
            info = {"n_repeats": repeats, "img_count": len(items)}
            table = reg_dirs if opts.reg else dirs
            table[_unique(name, table)] = info
            if not opts.reg:
                tag_frequency.setdefault(name, frequency[name])
        datasets.append(
            {
                "is_dreambooth": True,
                "num_train_images": counts["train"],
                "num_reg_images": counts["reg"],
                "resolution": [side, side],
                "enable_bucket": True,
                "tag_frequency": frequency,
                "bucket_info": _buckets(bucket_counts[i]),
                "subsets": subsets,
            }
        )
    return {
        "datasets": datasets,
        "dataset_dirs": dirs,
        "reg_dataset_dirs": reg_dirs,
        "tag_frequency": tag_frequency,
        "bucket_info": _buckets(sum(bucket_counts.values(), Counter())),
        "num_train_images": sum(d["num_train_images"] for d in datasets),
        "num_reg_images": sum(d["num_reg_images"] for d in datasets),
        "epoch_steps": list(plan.epoch_steps),
    }


def write_run_facts(folder: Path, facts: dict[str, Any], started_at: float | None = None) -> Path:
    """`train_facts.json` in the run folder: `facts` and when this training session started."""
    path = Path(folder) / FACTS_FILE
    atomic_write_json(path, {**facts, "started_at": time.time() if started_at is None else started_at})
    return path


def read_run_facts(folder: Path) -> dict[str, Any]:
    """The run's facts, or {} (a run from before they were written, an unreadable file)."""
    path = Path(folder) / FACTS_FILE
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def epoch_at(epoch_steps: list[int], micro_step: int) -> int:
    """The 1-based epoch that holds micro-step `micro_step` (kohya's ss_epoch); 0 before the first."""
    end = 0
    for epoch, n in enumerate(epoch_steps, 1):
        end += n
        if micro_step <= end:
            return epoch if micro_step > 0 else 0
    return len(epoch_steps)

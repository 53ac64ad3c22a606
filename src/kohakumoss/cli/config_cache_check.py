"""`check`'s cache test: a data config whose caches its training config would not read is a problem.

A training config is held against the data config beside it (`NAME.py` and `NAME_data.py`, as
`kohakumoss-config new train` writes them); a data config against the training config it composes
(its `_metadata` names its sources). Both sides' cache settings come from `train/cache_identity.py`,
the computation the trainer and the data scripts build their encoders and plans from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kohakumoss_common.errors import KohakuMossError

from .config_layers import load_file


def data_config_beside(path: Path) -> Path:
    """Where `kohakumoss-config new train` writes a training config's data config."""
    return path.with_name(f"{path.stem}_data.py")


def cache_pair_problems(
    path: str | Path, kind: str, knobs: dict[str, Any], metadata: dict[str, Any]
) -> list[tuple[str, str]]:
    """(knob, why) for each setting where the pair's caches differ; [] without a pair to compare."""
    path = Path(path)
    try:
        if kind == "train":
            data_path = data_config_beside(path)
            if not data_path.is_file():
                return []
            return _compare(knobs, load_file(data_path)[0], data_path, path)
        if kind == "data":
            for source in metadata.get("sources", []):
                train_knobs, train_meta = load_file(source)
                if train_meta.get("kind") == "train":
                    return _compare(train_knobs, knobs, path, Path(source))
    except KohakuMossError as e:  # a knob that builds no encoder settings: named by it
        knob = getattr(e, "knob", None) or "CACHE_DIR"
        why = str(e).removeprefix(f"{knob}: ")
        return [(knob, f"{why} (the data and training configs' caches could not be compared)")]
    return []


def _compare(
    train_knobs: dict[str, Any], data_knobs: dict[str, Any], data_path: Path, train_path: Path
) -> list[tuple[str, str]]:
    from kohakumoss.train.cache_identity import cache_mismatches, cache_settings

    found = cache_mismatches(cache_settings(train_knobs, "train"), cache_settings(data_knobs, "data"))
    return [
        (
            knob,
            f"{why}: {data_path} fills caches that {train_path} would not read (write both with kohakumoss-config)",
        )
        for knob, why in found
    ]

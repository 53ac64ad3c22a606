"""Merge kernel tuning tables from GPU runs into the tables shipped with the package
(`src/kohakumoss_kernels/tuning/tables/<card>.json`), which seed a fresh machine's table (kohakumoss_kernels.tuning).

    python scripts/bench/ship_tuning.py gpu-run.tar.gz [more archives or <card>.json files]
    python scripts/bench/ship_tuning.py --replace $OUT/kohakumoss-cache/tuning/NVIDIA_H200.json

Every tuning/<card>.json in an archive counts (the call's own cache, each user_runs row's table under
user_runs/<row>/tuning/), merged in the order found; lycoris-lora's launch-config tables beside them
(lycoris/kernels/<arch>-<card>.json) go to tables/lycoris/, which seed a fresh machine's lycoris table. A card with no shipped table yet gets one. Rows and
launch configs the shipped table lacks are added; with --replace the newer timing wins. A table timed under
other torch/triton versions than the shipped one replaces it only with --replace (the shipped table holds
one version set per card). The card's arch (sm90), where the run wrote it, goes along: other cards of that
arch take the table's launch-config picks as their first guess (kohakumoss_kernels/tuning/launch_prune.py).
"""

from __future__ import annotations

import argparse
import json
import tarfile
from pathlib import Path

SHIPPED = Path(__file__).resolve().parents[2] / "src" / "kohakumoss_kernels" / "tuning" / "tables"


def read_tables(path: Path) -> list[tuple[str, dict]]:
    """(name, table) of a <card>.json file, or of every table inside a .tar.gz archive: ours
    (tuning/<card>.json: name <card>) and lycoris-lora's (lycoris/kernels/<arch>-<card>.json: name
    lycoris/<arch>-<card>)."""
    if path.suffix == ".json":
        return [(path.stem, json.loads(path.read_text()))]
    out = []
    with tarfile.open(path) as tar:
        for member in tar.getmembers():
            parts = Path(member.name).parts
            if not member.isfile() or len(parts) < 2 or not member.name.endswith(".json"):
                continue
            if parts[-2] == "tuning":
                out.append((Path(member.name).stem, json.loads(tar.extractfile(member).read())))
            elif parts[-2] == "kernels" and len(parts) >= 3 and parts[-3] == "lycoris":
                out.append((f"lycoris/{Path(member.name).stem}", json.loads(tar.extractfile(member).read())))
    return out


def merge_lycoris(shipped: dict | None, new: dict, replace: bool) -> tuple[dict, int]:
    """A lycoris table ({"version", "stamp", "entries": [{"kernel", "cat", "num", "config"}]}) merged
    like ours: rows by (kernel, cat, num); another version or stamp replaces it only with `replace`."""
    same = shipped is not None and (shipped.get("version"), shipped.get("stamp")) == (
        new.get("version"),
        new.get("stamp"),
    )
    if not same:
        if shipped is not None and not replace:
            return shipped, 0
        shipped = {"version": new.get("version"), "stamp": new.get("stamp"), "entries": []}

    def key(row: dict) -> str:
        return json.dumps([row["kernel"], row["cat"], row["num"]])

    rows = {key(r): r for r in shipped["entries"]}
    changed = 0
    for row in new.get("entries", []):
        if key(row) not in rows or (replace and rows[key(row)] != row):
            rows[key(row)] = row
            changed += 1
    shipped["entries"] = [rows[k] for k in sorted(rows)]
    return shipped, changed


def merge(shipped: dict | None, new: dict, replace: bool) -> tuple[dict, int]:
    """The shipped table with `new` merged in, and how many rows and launch configs changed."""
    if shipped is None or shipped.get("versions") != new.get("versions"):
        if shipped is not None and not replace:
            return shipped, 0
        shipped = {"versions": new.get("versions"), "entries": {}, "launches": {}}
    if new.get("arch") and not shipped.get("arch"):
        shipped["arch"] = new["arch"]
    changed = 0
    for part in ("entries", "launches"):
        into = shipped.setdefault(part, {})
        for key, value in new.get(part, {}).items():
            if key not in into or (replace and into[key] != value):
                into[key] = value
                changed += 1
    return shipped, changed


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("tables", nargs="+", type=Path, help="gpu-run.tar.gz archives or <card>.json tables")
    p.add_argument("--replace", action="store_true", help="the given timings win over the shipped ones")
    p.add_argument("--out", type=Path, default=SHIPPED, help="the shipped tables' folder")
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    for path in a.tables:
        for card, table in read_tables(path):
            target = a.out / f"{card}.json"
            target.parent.mkdir(parents=True, exist_ok=True)
            shipped = json.loads(target.read_text()) if target.exists() else None
            lycoris = card.startswith("lycoris/")
            merged, changed = (merge_lycoris if lycoris else merge)(shipped, table, a.replace)
            target.write_text(json.dumps(merged, indent=0, sort_keys=True) + "\n")
            versions = merged.get("stamp") if lycoris else merged["versions"]
            print(f"{target}: {changed} rows / launch configs from {path} ({card}, {versions})")


if __name__ == "__main__":
    main()

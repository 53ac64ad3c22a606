"""scripts/bench/ship_tuning.py: tuning tables from GPU runs merged into the shipped ones."""

from __future__ import annotations

import io
import json
import tarfile

from .scripts import load_bench


def _module():
    return load_bench("ship_tuning")


def _table(versions: str, **rows) -> dict:
    return {"versions": {"torch": versions}, "entries": {k: {"backend": v} for k, v in rows.items()}}


def test_archives_merge_into_the_shipped_table_of_their_card(tmp_path):
    st = _module()
    out = tmp_path / "tables"
    out.mkdir()
    (out / "GPU.json").write_text(json.dumps(_table("2.11", a="triton", b="eager")))
    archive = tmp_path / "gpu-run.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        data = json.dumps(_table("2.11", b="compile", c="triton")).encode()
        info = tarfile.TarInfo("kohakumoss-cache/tuning/GPU.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    st.main([str(archive), "--out", str(out)])
    merged = json.loads((out / "GPU.json").read_text())["entries"]
    assert {k: v["backend"] for k, v in merged.items()} == {"a": "triton", "b": "eager", "c": "triton"}
    st.main([str(archive), "--out", str(out), "--replace"])
    assert json.loads((out / "GPU.json").read_text())["entries"]["b"]["backend"] == "compile"
    other = tmp_path / "GPU.json"
    other.write_text(json.dumps(_table("2.12", d="triton")))
    st.main([str(other), "--out", str(out)])  # other versions: kept out unless --replace
    assert "d" not in json.loads((out / "GPU.json").read_text())["entries"]
    st.main([str(other), "--out", str(out), "--replace"])
    assert json.loads((out / "GPU.json").read_text())["entries"] == {"d": {"backend": "triton"}}


def test_a_new_card_gets_a_table_from_every_row_of_an_archive(tmp_path):
    """An H100 call's archive: the call's own cache and each user_runs row's table for one card, merged
    into a new shipped table, with the arch the run wrote (other sm90 cards' first guess)."""
    st = _module()
    out = tmp_path / "tables"
    archive = tmp_path / "gpu-run.tar.gz"
    tables = {
        "kohakumoss-cache/tuning/NVIDIA_H100.json": _table("2.11", a="triton"),
        "user_runs/card24-lora-2-cold/tuning/NVIDIA_H100.json": {**_table("2.11", b="eager"), "arch": "sm90"},
        "user_runs/whole-lora-2-cold/tuning/NVIDIA_H100.json": _table("2.11", c="compile"),
        "user_runs/whole-lora-2-cold/tuning/NVIDIA_H100.json.lock": {},
    }
    with tarfile.open(archive, "w:gz") as tar:
        for name, table in tables.items():
            data = json.dumps(table).encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    st.main([str(archive), "--out", str(out)])
    assert [p.name for p in out.iterdir()] == ["NVIDIA_H100.json"]
    shipped = json.loads((out / "NVIDIA_H100.json").read_text())
    assert set(shipped["entries"]) == {"a", "b", "c"} and shipped["arch"] == "sm90"


def test_lycoris_tables_in_an_archive_ship_beside_ours(tmp_path):
    st = _module()
    out = tmp_path / "tables"
    archive = tmp_path / "gpu-run.tar.gz"
    stamp = {"torch": "2.11", "lycoris-lora": "4.1"}

    def rows(*names):
        return [{"kernel": n, "cat": ["bf16"], "num": [64], "config": {"BLOCK": 64}} for n in names]

    tables = {
        "user_runs/card24-lora-2-cold/lycoris/kernels/sm90-nvidia-h100.json": {
            "version": 2, "stamp": stamp, "entries": rows("lora_fwd")
        },
        "user_runs/whole-lora-2-cold/lycoris/kernels/sm90-nvidia-h100.json": {
            "version": 2, "stamp": stamp, "entries": rows("lora_fwd", "lora_bwd")
        },
        "kohakumoss-cache/lycoris/kernels/sm90-nvidia-h100.json": {
            "version": 2, "stamp": {"torch": "2.10"}, "entries": rows("old")
        },
    }  # fmt: skip
    with tarfile.open(archive, "w:gz") as tar:
        for name, table in tables.items():
            data = json.dumps(table).encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    st.main([str(archive), "--out", str(out)])
    shipped = json.loads((out / "lycoris" / "sm90-nvidia-h100.json").read_text())
    assert shipped["stamp"] == stamp  # the table of other versions found after it is kept out
    assert sorted(r["kernel"] for r in shipped["entries"]) == ["lora_bwd", "lora_fwd"]

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

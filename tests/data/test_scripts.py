"""The kogine data scripts end to end on a small real-photo dataset (fake encoders by factory knob)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from .test_scan_faults import corrupt_idat

REPO = Path(__file__).resolve().parents[2]


def kogine(capsys, script: str, config: Path, *sets: str) -> str:
    """What `kogine run SCRIPT --config CONFIG --set K=V` does, in this process (torch is already imported)."""
    engine = pytest.importorskip("kohakuengine", reason="kohaku-engine (kogine) is not installed")
    from kohakuengine.engine import layer_overrides

    run = engine.Script(str(REPO / "scripts" / "data" / script))
    overrides = dict(s.split("=", 1) for s in sets)
    run.config = layer_overrides(engine.load_config_file(str(config)), set_values=overrides)
    capsys.readouterr()
    try:
        engine.ScriptExecutor(run).execute()
    except SystemExit as e:  # the scripts exit through run_checked: 0 done, 2 a named problem
        if e.code:
            out = capsys.readouterr()
            raise ScriptFailed(e.code, out.out + out.err) from None
    out = capsys.readouterr()
    return out.out + out.err


class ScriptFailed(Exception):
    def __init__(self, code: int, output: str):
        super().__init__(f"exit {code}: {output}")
        self.code, self.output = code, output


@pytest.fixture
def config(kohya_dir, tmp_path) -> Path:
    cfg = tmp_path / "data_cfg.py"
    cfg.write_text(
        f"DATASET = {{'kind': 'kohya', 'path': {str(kohya_dir)!r}}}\n"
        f"CATALOG_DIR = {str(tmp_path / 'catalogs')!r}\n"
        "AREA = 128 * 128\nTOKENS_PER_STEP = 300\nCROP = 'random'\nSEED = 5\nEPOCHS = 2\n"
        f"RUN_DIR = {str(tmp_path / 'run')!r}\nCACHE_DIR = {str(tmp_path / 'cache')!r}\n"
        "WORKERS = 2\nVAE_FACTORY = 'tests.data.fakes:make_vae'\nVAE_KWARGS = {}\n"
        "TEXT_FACTORY = 'tests.data.fakes:make_text'\nTEXT_KWARGS = {}\n"
    )
    return cfg


def _sha(out: str) -> str:
    found = re.findall(r"^plan sha256 ([0-9a-f]{64})$", out, re.M)
    assert found, out
    return found[-1]


def test_inspect_then_cache_scripts(config, tmp_path, capsys):
    out = kogine(capsys, "inspect_data.py", config)
    assert "items kept 7" in out and "tokens per step min" in out and "steps per epoch" in out
    for name in ("report.txt", "histogram.png", "contact_sheet.png"):
        assert (tmp_path / "run" / name).stat().st_size > 0
    sha = _sha(out)
    lat = kogine(capsys, "cache_latents.py", config)
    assert _sha(lat) == sha and "0 already cached" in lat
    again = kogine(capsys, "cache_latents.py", config)
    assert re.search(r"latents: (\d+) planned, \1 already cached, 0 encoded", again), again
    text = kogine(capsys, "cache_text.py", config)
    assert "text: 7 planned, 0 already cached, 7 encoded" in text
    other = kogine(capsys, "cache_text.py", config, "TEXT_KWARGS={'template': 'photo of {}'}")
    assert "7 encoded" in other  # another template misses the cache
    assert _sha(kogine(capsys, "inspect_data.py", config, "SEED=6")) != sha


def test_inspect_writes_its_pictures_atomically(config, tmp_path, capsys, monkeypatch):
    """histogram.png and contact_sheet.png go through the atomic writer (a temporary name, then a
    rename): a stop mid-write never leaves a truncated PNG under the final name."""
    from PIL import Image

    written, real = [], Image.Image.save
    monkeypatch.setattr(
        Image.Image, "save", lambda im, fp, *a, **k: written.append(Path(fp)) or real(im, fp, *a, **k)
    )
    kogine(capsys, "inspect_data.py", config)
    finals = [tmp_path / "run" / name for name in ("histogram.png", "contact_sheet.png")]
    assert len(written) == 2 and all(f.stat().st_size > 0 for f in finals)
    assert not set(written) & set(finals), written  # each saved under a temporary name, then renamed


def test_convert_shards_script(config, tmp_path, capsys):
    out = kogine(capsys, "convert_shards.py", config, f"OUT_DIR={tmp_path / 'shards'}", "MAX_AREA=20000")
    assert "wrote 7 images into 1 shards" in out
    cfg2 = tmp_path / "shards_cfg.py"
    cfg2.write_text(
        config.read_text() + f"DATASET = {{'kind': 'shards', 'path': {str(tmp_path / 'shards')!r}}}\n"
    )
    assert "items kept 7" in kogine(capsys, "inspect_data.py", cfg2)


def test_inspect_names_dropped_files(kohya_copy, config, tmp_path, capsys):
    wall = kohya_copy / "3_wall"
    png = (wall / "img1.png").read_bytes()
    (wall / "img1.png").write_bytes(corrupt_idat(png))
    (wall / "gone.jpg").symlink_to(tmp_path / "gone.jpg")
    cfg = tmp_path / "faulty_cfg.py"
    cfg.write_text(config.read_text() + f"DATASET = {{'kind': 'kohya', 'path': {str(kohya_copy)!r}}}\n")
    out = kogine(capsys, "inspect_data.py", cfg)
    assert "items kept 6" in out
    report = (tmp_path / "run" / "report.txt").read_text(encoding="utf-8")
    assert "items dropped corrupt 1" in report and "items dropped broken_symlink 1" in report
    assert "  corrupt 3_wall/img1.png: " in report and "  broken_symlink 3_wall/gone.jpg: " in report
    rows = [json.loads(line) for line in (tmp_path / "run" / "dropped.jsonl").read_text().splitlines()]
    assert [(r["path"], r["status"]) for r in rows] == [
        ("3_wall/gone.jpg", "broken_symlink"),
        ("3_wall/img1.png", "corrupt"),
    ]


@pytest.mark.parametrize(
    "script", ["inspect_data.py", "cache_latents.py", "cache_text.py", "convert_shards.py"]
)
def test_data_scripts_check_their_knobs_like_the_trainer(config, tmp_path, capsys, script):
    bad = tmp_path / "bad_cfg.py"
    bad.write_text(config.read_text() + "MIN_SIDEE = 5000\nAREA = 'big'\nSHARD_ITEMS = -3\n")
    with pytest.raises(ScriptFailed) as failed:
        kogine(capsys, script, bad)
    out = failed.value.output
    assert failed.value.code == 2 and "Traceback" not in out
    assert "MIN_SIDEE: unknown knob (did you mean MIN_SIDE?)" in out
    assert "AREA: expected int, got str 'big'" in out
    assert "SHARD_ITEMS: -3 is below the minimum 1" in out
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache").exists()  # refused before any work

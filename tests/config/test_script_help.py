"""`python scripts/<script>.py --help` lists every knob of the script with its type, default and help, and runs
nothing (kogine's own parser takes `--help` before a script sees it: the direct run is the way)."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

from kohakumoss_common.knobs import script_knobs

ROOT = Path(__file__).resolve().parents[2]
CHECKED = sorted(
    p
    for p in (ROOT / "scripts").rglob("*.py")
    if "run_checked(" in p.read_text() or "run_data_script(" in p.read_text()
)


@pytest.mark.parametrize("script", CHECKED, ids=lambda p: p.relative_to(ROOT / "scripts").as_posix())
def test_help_lists_each_knob_with_its_help_and_runs_nothing(script, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(script), run_name="__main__")
    assert done.value.code == 0
    out = capsys.readouterr().out
    namespace = runpy.run_path(str(script))  # the knobs, without the __main__ block
    knobs = script_knobs(namespace)
    assert knobs, script
    lines = out.splitlines()
    for name, default in knobs.items():
        row = next((i for i, line in enumerate(lines) if line.startswith(f"  {name} (")), None)
        assert row is not None, f"{name} missing from {script.name} --help"
        assert f"default {default!r}" in lines[row] and lines[row + 1].strip(), lines[row : row + 2]


def test_the_scripts_with_typed_knobs_are_all_found():
    names = {p.name for p in CHECKED}
    assert {"moss.py", "sample.py", "export.py", "cache_latents.py", "cache_text.py", "demo.py"} <= names

"""docs/guides/scripts.md lists every script under scripts/, and every knob it names exists in that script."""

from __future__ import annotations

import re

import pytest

from .conftest import REPO

DOC = (REPO / "docs" / "guides" / "scripts.md").read_text()
SCRIPTS = sorted(
    p.relative_to(REPO).as_posix()
    for p in (REPO / "scripts").rglob("*")
    if p.suffix in (".py", ".sh", ".ps1")
)


def rows() -> dict[str, str]:
    """First-cell script paths of the doc's tables -> the row's last cell (its knobs or options)."""
    out = {}
    for line in DOC.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`scripts/"):
            continue
        first = re.findall(r"`([^`]+)`", cells[0])
        folder = first[0].rsplit("/", 1)[0]
        for name in first:
            out[name if "/" in name else f"{folder}/{name}"] = cells[-1]
    return out


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_is_listed(script):
    assert script in rows(), f"{script} is not listed in docs/guides/scripts.md"


def test_listed_knobs_exist():
    for script, knobs in rows().items():
        path = REPO / script
        assert path.exists(), f"docs/guides/scripts.md lists {script}, which does not exist"
        if path.suffix != ".py" or "(plain Python)" in DOC.split(f"`{script}`")[1][:20]:
            continue  # the knobs of kogine scripts only
        text = path.read_text()
        for knob in re.findall(r"`([A-Z][A-Z0-9_]+)`", knobs):
            assert re.search(rf"^{knob} = ", text, re.M), f"{script}: no knob {knob} (listed in scripts.md)"

"""The four packages import only downward (DESIGN.md section 3)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
ALLOWED = {
    "kohakumoss_common": set(),
    "kohakumoss_kernels": {"kohakumoss_common"},
    "kohakumoss_data": {"kohakumoss_common"},
    "kohakumoss": {"kohakumoss_common", "kohakumoss_kernels", "kohakumoss_data"},
}


def imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names & set(ALLOWED)


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_point_down(package):
    bad = []
    for path in sorted((SRC / package).rglob("*.py")):
        wrong = imported_packages(path) - ALLOWED[package] - {package}
        if wrong:
            bad.append(f"{path.relative_to(SRC)} imports {sorted(wrong)}")
    assert not bad, "\n".join(bad)

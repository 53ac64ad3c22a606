"""No module under scripts/ is named like an importable top-level module (stdlib or installed package).

Running a script puts its folder first on sys.path, so `scripts/bench/kernels.py` once stood in for the
PyPI package `kernels` that transformers imports when it is installed: the benchmark died at set-up on a
fresh install.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# asked in a fresh interpreter whose sys.path holds no project folder (-I: no cwd, PYTHONPATH, user site)
FIND = """
import importlib.util, json, pathlib, sys
repo = pathlib.Path(sys.argv[1])
scripts = repo / "scripts"
def project(p):
    p = pathlib.Path(p).resolve()
    return p == repo or p == scripts or scripts in p.parents
sys.path = [p for p in sys.path if p and not project(p)]
found = {}
for name in json.loads(sys.argv[2]):
    spec = importlib.util.find_spec(name)
    if spec is not None:
        found[name] = spec.origin or "namespace package"
print(json.dumps(found))
"""


def script_modules() -> dict[str, list[str]]:
    """Importable module name -> the scripts/ files of that name."""
    names: dict[str, list[str]] = {}
    for path in sorted((REPO / "scripts").rglob("*.py")):
        if path.stem.isidentifier():
            names.setdefault(path.stem, []).append(path.relative_to(REPO).as_posix())
    return names


def shadowed(names: list[str]) -> dict[str, str]:
    """The names among `names` that import from outside the repository, with where they import from."""
    out = subprocess.run(
        [sys.executable, "-I", "-c", FIND, str(REPO), json.dumps(names)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


def test_no_script_shadows_an_importable_module():
    modules = script_modules()
    clashes = shadowed(sorted(modules))
    assert not clashes, "scripts named like importable modules (rename the script): " + "; ".join(
        f"{modules[name]} shadow '{name}' ({origin})" for name, origin in clashes.items()
    )


def test_the_check_sees_installed_packages_and_stdlib():
    # the names a clash would have: an installed dependency's and the standard library's
    assert set(shadowed(["transformers", "json", "no_such_module_kohakumoss"])) == {"transformers", "json"}

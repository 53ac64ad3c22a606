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


# --- inside kohakumoss: its subpackages ------------------------------------------------------------------
PKG = SRC / "kohakumoss"


def imported_modules(path: Path) -> set[str]:
    """Every kohakumoss module `path` imports, at any depth of the file (a deferred import still depends),
    relative imports resolved; `from package import name` gives both package and package.name."""
    package = ["kohakumoss", *path.relative_to(PKG).parent.parts]  # what `from .` means in this file
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            out.add(module)
            out.update(f"{module}.{a.name}" for a in node.names)
    return {m for m in out if m == "kohakumoss" or m.startswith("kohakumoss.")}


def subpackage(module: str) -> str | None:
    """`kohakumoss.memory.catalog` -> 'memory' (a top-level module is its own)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def subpackage_edges() -> dict[str, dict[str, list[str]]]:
    """subpackage -> imported subpackage -> the files that import it."""
    edges: dict[str, dict[str, list[str]]] = {}
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG)
        if len(rel.parts) == 1 and rel.name == "__init__.py":
            continue
        src = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        for module in imported_modules(path):
            dst = subpackage(module)
            real = dst and ((PKG / dst).is_dir() or (PKG / f"{dst}.py").is_file())  # not a name in __init__
            files = edges.setdefault(src, {}).setdefault(dst, []) if real and dst != src else None
            if files is not None and str(rel) not in files:
                files.append(str(rel))
    return edges


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as its nodes in order (first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_find_cycle_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"x": {"x"}}) == ["x", "x"]


def test_relative_imports_resolve():
    edges = subpackage_edges()
    assert "memory" in edges.get("train", {})  # train/components.py: from kohakumoss.memory...
    assert "model" in edges.get("export", {})
    # a relative import two levels up (memory/engines/optimizer.py: from ..plan) stays inside memory
    mods = imported_modules(PKG / "memory" / "engines" / "optimizer.py")
    assert "kohakumoss.memory.plan" in mods


def test_no_import_cycles_between_subpackages():
    edges = subpackage_edges()
    cycle = find_cycle({src: set(dst) for src, dst in edges.items()})
    if cycle:
        where = [f"{a} -> {b}: {edges[a][b][:3]}" for a, b in zip(cycle, cycle[1:], strict=False)]
        pytest.fail("import cycle between kohakumoss subpackages:\n" + "\n".join(where))


def test_memory_does_not_import_train():
    assert "train" not in subpackage_edges().get("memory", {}), subpackage_edges()["memory"]["train"]


def test_catalog_and_profiles_do_not_import_each_other():
    memory = PKG / "memory"
    catalog = imported_modules(memory / "catalog.py")
    profiles = imported_modules(memory / "profiles.py")
    both = "kohakumoss.memory.profiles" in catalog and "kohakumoss.memory.catalog" in profiles
    assert not both, (
        "memory/catalog.py and memory/profiles.py import each other: share through a third module"
    )


def test_sample_run_imports_neither_export_nor_train():
    wrong = {subpackage(m) for m in imported_modules(PKG / "diffusion" / "sample_run.py")} & {
        "export",
        "train",
    }
    assert not wrong, f"diffusion/sample_run.py imports {sorted(wrong)}: pass what it needs in"

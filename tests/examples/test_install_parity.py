"""install.ps1 against install.sh, read as text (no PowerShell here): the same index thresholds, options,
torch pins, Python order and fallback; and every PowerShell file of the project with balanced brackets."""

from __future__ import annotations

import re

import pytest

from .conftest import REPO

SH = (REPO / "scripts" / "install" / "install.sh").read_text()
PS1 = (REPO / "scripts" / "install" / "install.ps1").read_text()


def test_cuda_thresholds_pick_the_same_index():
    sh = dict(re.findall(r"cuda >= (\d+) \)\); then echo (cu\d+)", SH))
    ps1 = dict(re.findall(r"\$cuda -ge (\d+)\) \{ return '(cu\d+)' \}", PS1))
    assert sh == ps1 == {"130": "cu130", "128": "cu128", "126": "cu126"}
    # below the lowest threshold both fall back to the default index with the same line
    line = "KohakuMoss needs a driver for CUDA 12.6+."
    assert line in SH and line in PS1
    assert "old-driver:" in SH and "old-driver:" in PS1


def test_same_options_and_environment():
    sh_opts = set(re.findall(r"^\s+--([a-z-]+)\)", SH, re.M))
    assert sh_opts == {"cpu", "index", "no-dev", "python"}
    params = re.search(r"param\((.*?)\n\)", PS1, re.S).group(1)
    ps1_opts = set(re.findall(r"\$(\w+)", params))
    assert ps1_opts == {"".join(p.capitalize() for p in o.split("-")) for o in sh_opts}
    choices = re.search(r"--index (\S+)\]", SH).group(1).split("|")
    ps1_choices = re.findall(r"'(\w+)'", re.search(r"ValidateSet\(([^)]*)\)", PS1).group(1))
    assert set(ps1_choices) == {"auto", *choices}
    for env in ("KOHAKUMOSS_TORCH_INDEX", "KOHAKUMOSS_PYTHON"):
        assert env in SH and env in PS1


def test_same_torch_pins_extras_and_index():
    pins = re.findall(r'"(torch(?:vision)?>=[^"]+)"', SH)
    assert pins and pins == re.findall(r"'(torch(?:vision)?>=[^']+)'", PS1)
    assert "https://download.pytorch.org/whl/$INDEX_CHOICE" in SH
    assert "https://download.pytorch.org/whl/$IndexChoice" in PS1
    assert "timeout=8" in SH and "-TimeoutSec 8" in PS1
    fallback = "cannot be reached; falling back to the default package index."
    assert fallback in SH and fallback in PS1
    # cuda extra for every CUDA index, xpu for Intel, dev unless told not to
    assert "cu126|cu128|cu130) EXTRAS+=(cuda)" in SH and "xpu) EXTRAS+=(xpu)" in SH
    assert "@('cu126', 'cu128', 'cu130') -contains $IndexChoice) { $Extras += 'cuda' }" in PS1
    assert "$Extras += 'xpu'" in PS1 and "if (-not $NoDev) { $Extras += 'dev' }" in PS1
    assert "-m kohakumoss.cli.doctor" in SH and "-m kohakumoss.cli.doctor" in PS1


def test_both_install_the_newest_allowed_versions():
    # an existing .venv is upgraded eagerly, as a fresh install gets (CI then sees a new release's break);
    # the second install keeps the torch build of the first (its index's)
    sh_installs = re.findall(r'-m pip install "\$\{FRESH\[@\]\}" ([^\n]+)', SH)
    ps1_installs = re.findall(r"-m pip install @Fresh ([^}]+)", PS1)
    assert "FRESH=(--upgrade --upgrade-strategy eager)" in SH
    assert "$Fresh = @('--upgrade', '--upgrade-strategy', 'eager')" in PS1
    assert len(sh_installs) == len(ps1_installs) == 4
    assert sum('"${KEEP_TORCH[@]}"' in line for line in sh_installs) == 2
    assert sum("@KeepTorch" in line for line in ps1_installs) == 2


def test_same_python_preference():
    sh = re.findall(r"python(3\.\d+)", re.search(r"for c in ([^;]+);", SH).group(1))
    ps1 = re.findall(r"'(3\.\d+)'", re.search(r"foreach \(\$v in @\(([^)]*)\)\)", PS1).group(1))
    assert sh == ps1 == ["3.12", "3.13", "3.11", "3.10"]


def _strip_strings_and_comments(text: str) -> str:
    """PowerShell text with string literals, here-strings and comments blanked out (a rough lexer)."""
    text = re.sub(r"<#.*?#>", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c == "#":
            while i < n and text[i] != "\n":
                i += 1
        elif c == "'":
            i += 1
            while i < n and not (text[i] == "'" and text[i + 1 : i + 2] != "'"):
                i += 2 if text[i] == "'" else 1
            i += 1
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "`" else 1
            i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


@pytest.mark.parametrize(
    "path", sorted(p.relative_to(REPO).as_posix() for p in (REPO / "scripts").rglob("*.ps1")), ids=str
)
def test_powershell_brackets_balance(path):
    code = _strip_strings_and_comments((REPO / path).read_text())
    stack = []
    pairs = {")": "(", "]": "[", "}": "{"}
    for line_no, line in enumerate(code.splitlines(), 1):
        for ch in line:
            if ch in "([{":
                stack.append((ch, line_no))
            elif ch in pairs:
                assert stack and stack[-1][0] == pairs[ch], f"{path}: unmatched '{ch}' on line {line_no}"
                stack.pop()
    assert not stack, f"{path}: '{stack[-1][0]}' of line {stack[-1][1]} is never closed"
    assert "\t" not in (REPO / path).read_text(), f"{path}: tabs"


def test_install_sh_refuses_an_unknown_index_before_any_work(tmp_path):
    import subprocess

    out = subprocess.run(
        ["bash", str(REPO / "scripts" / "install" / "install.sh"), "--index", "cu999"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2 and "'cu999' is not one of auto, cu126" in out.stderr
    assert not (tmp_path / ".venv").exists() and "[install]" not in out.stdout


@pytest.mark.parametrize(
    "vendor, device, expect",
    [("0x8086", "0x56a0", "xpu"), ("0x8086", "0x9a49", "cpu"), ("0x10de", "0x56a0", "cpu")],
)
def test_intel_arc_is_found_in_sysfs(tmp_path, vendor, device, expect):
    """detect_index on a fake /sys (no nvidia-smi, no sycl-ls on PATH): Arc ids pick xpu, others cpu."""
    import subprocess

    dev = tmp_path / "class" / "drm" / "card0" / "device"
    dev.mkdir(parents=True)
    (dev / "vendor").write_text(vendor)
    (dev / "device").write_text(device)
    body = re.search(r"^detect_index\(\) \{.*?^\}", SH, re.S | re.M).group(0)
    script = f"{body}\ndetect_index\n"
    env = {"PATH": "/nonexistent", "KOHAKUMOSS_SYSFS": str(tmp_path)}
    out = subprocess.run(["/bin/bash", "-c", script], capture_output=True, text=True, env=env, timeout=30)
    assert out.stdout.strip() == expect, out.stderr

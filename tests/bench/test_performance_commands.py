"""Every command on the performance pages runs as printed: its script exists, each `--option` is one the
script takes, each row of `--rows` parses, each `--set KNOB=...` names one of the script's knobs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from .scripts import load_bench

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted((REPO / "docs" / "performance").glob("*.md"))
BASH = re.compile(r"^```bash\n(.*?)^```", re.M | re.S)
ROW_PARSERS = {"train_step": "parse_row", "user_runs": "parse_row"}  # scripts whose --rows name rows


def commands(text: str) -> list[list[str]]:
    """The `python scripts/...` and `kogine run scripts/...` commands of a page's bash blocks, as argv."""
    out = []
    for block in BASH.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("#", 1)[0].strip()
            if re.match(r"(python3? |kogine run )scripts/", line):
                argv = shlex.split(line.replace("$p", "speed"))  # the profile loop's variable
                out.append(argv[2:] if argv[0] == "kogine" else argv[1:])
    return out


def command_problems(argv: list[str]) -> list[str]:
    """What in one command (script first) the script would not take."""
    script = REPO / argv[0]
    if not script.is_file():
        return [f"{argv[0]}: no such script"]
    text, problems = script.read_text(encoding="utf-8"), []
    for i, token in enumerate(argv[1:], 1):
        flag = token.split("=", 1)[0]
        if flag == "--set":
            knob = argv[i + 1].split("=", 1)[0]
            if not re.search(rf"^{knob} = ", text, re.M):
                problems.append(f"{argv[0]}: --set {knob}: not a knob of the script")
        elif flag.startswith("--") and f'"{flag}"' not in text:
            problems.append(f"{argv[0]}: {flag}: not an option of the script")
    stem = script.stem
    if stem in ROW_PARSERS and "--rows" in argv:
        parse = getattr(load_bench(stem), ROW_PARSERS[stem])
        for row in argv[argv.index("--rows") + 1].split(","):
            if row == "baseline":  # train_step's plain-torch pair
                continue
            try:
                parse(row)
            except (Exception, SystemExit) as e:  # noqa: BLE001 - the scripts refuse a row with SystemExit
                problems.append(f"{argv[0]}: row {row!r}: {e}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_command_on_a_performance_page_is_one_its_script_takes(page):
    found = commands(page.read_text(encoding="utf-8"))
    problems = [p for argv in found for p in command_problems(argv)]
    assert not problems, "\n".join(problems)


def test_the_command_check_finds_a_wrong_option_row_and_knob():
    page = (
        "```bash\npython scripts/bench/user_runs.py --rows card24/lora/2,card24/bogus/2 --stepz 8\n"
        "kogine run scripts/bench/bench_kernels.py --set OPZ=rms_norm  # a comment\n"
        "python scripts/bench/nowhere.py\n```\n"
    )
    found = commands(page)
    assert [argv[0] for argv in found] == [
        "scripts/bench/user_runs.py",
        "scripts/bench/bench_kernels.py",
        "scripts/bench/nowhere.py",
    ]
    problems = [p for argv in found for p in command_problems(argv)]
    assert problems[0] == "scripts/bench/user_runs.py: --stepz: not an option of the script"
    assert problems[1].startswith("scripts/bench/user_runs.py: row 'card24/bogus/2': ")
    assert problems[2:] == [
        "scripts/bench/bench_kernels.py: --set OPZ: not a knob of the script",
        "scripts/bench/nowhere.py: no such script",
    ]

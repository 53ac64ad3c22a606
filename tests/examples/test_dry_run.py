"""scripts/examples/*.sh with DRY_RUN=1: the commands they would run, in order, for the options given."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import EXAMPLES, REPO, dry_run

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")

WRITE = str(EXAMPLES / "write_config.py")


def commands(out: str) -> list[list[str]]:
    return [shlex.split(line[2:]) for line in out.splitlines() if line.startswith("+ ")]


def knob_args(cmd: list[str]) -> dict[str, list[str]]:
    """'--str K=V'-style pairs of a write_config command, by flag."""
    out: dict[str, list[str]] = {}
    for flag, value in zip(cmd, cmd[1:]):
        if flag.startswith("--") and "=" in value:
            out.setdefault(flag, []).append(value)
    return out


@pytest.fixture
def run_dir(tmp_path) -> Path:
    run = tmp_path / "runs" / "my_set"
    for step in (10, 20, 30):
        (run / "checkpoints" / f"step_{step:08d}").mkdir(parents=True)
        (run / "checkpoints" / f"step_{step:08d}" / "meta.json").write_text("{}")
    (run / "checkpoints" / "step_00000040").mkdir()  # incomplete: no meta.json, so not a checkpoint
    return run


def test_train_with_config_tool(weights, dataset, tmp_path):
    r = dry_run(
        "train.sh",
        *("--weights", str(weights), "--dataset", str(dataset), "--steps", "30", "--sample-every", "10"),
        *("--algo", "lokr", "--source", "folder", "--set", "LR=2e-4", "--resume", "--cache"),
        cwd=tmp_path,
        tool="kohakumoss-config",
    )
    assert r.returncode == 0, r.stderr
    new, write, new_data, check, cache_text, cache_latents, train = commands(r.stdout)
    for cmd, script in ((cache_text, "cache_text"), (cache_latents, "cache_latents")):
        assert cmd[-4:] == [
            "run",
            f"scripts/data/{script}.py",
            "--config",
            "configs/user/examples/my_set_run_data.py",
        ]
    # the data scripts read the run's own config (its --set knobs included), not the base's
    assert new_data == [
        *("kohakumoss-config", "new", "data", "--train", "configs/user/examples/my_set_run.py"),
        *("--name", "my_set_run", "--out-dir", "configs/user/examples", "--force"),
    ]
    assert new == [
        *("kohakumoss-config", "new", "train", "--weights", str(weights), "--data", str(dataset)),
        *("--name", "my_set", "--gpu", "auto", "--out-dir", "configs/user/examples", "--force"),
        *("--algo", "lokr", "--source", "folder"),
    ]
    assert write[1:5] == [WRITE, "write", "configs/user/examples/my_set_run.py", "--base"]
    assert write[5] == "configs/user/examples/my_set.py"
    knobs = knob_args(write)
    assert knobs["--int"] == ["KEEP_LAST=5", "STEPS=30", "SAMPLE_EVERY=10", "SAVE_EVERY=10"]
    assert knobs["--str"] == ["RUN_NAME=my_set", "RUNS_DIR=runs/examples/train", "SAVE_FORMAT=both"]
    assert knobs["--prompts-from"] == [f"SAMPLE_PROMPTS={dataset}"]
    assert knobs["--set"] == ["LR=2e-4"]  # into the config, so the check sees it
    assert check == ["kohakumoss-config", "check", "configs/user/examples/my_set_run.py", "--script", "train"]
    assert (
        "data config for inspect_data / cache_text / cache_latents: configs/user/examples/my_set_run_data.py"
        in r.stdout
    )
    assert train[1:] == [
        *("-m", "kohakuengine.cli", "run", "scripts/train/moss.py"),
        *("--config", "configs/user/examples/my_set_run.py", "--set", "RESUME=latest"),
    ]


def test_train_without_config_tool_writes_a_plain_config(weights, dataset, tmp_path):
    r = dry_run(
        "train.sh",
        *(
            "--weights",
            str(weights),
            "--data",
            str(dataset),
            "--name",
            "style-v1",
            "--algo",
            "loha",
            "--cache",
        ),
        *("--prompt", 'a "quoted" prompt, it\'s fine', "--prompt", "second"),
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert "kohakumoss-config is not installed" in r.stdout
    assert "--cache needs the data config that kohakumoss-config writes" in r.stdout
    write, check, train = commands(r.stdout)
    assert write[:4] == [write[0], WRITE, "write", "configs/user/examples/style-v1_run.py"]
    assert write[4:8] == ["--weights", str(weights), "--data", str(dataset)]
    knobs = knob_args(write)
    assert knobs["--item"] == ['SAMPLE_PROMPTS=a "quoted" prompt, it\'s fine', "SAMPLE_PROMPTS=second"]
    assert "ALGO=loha" in knobs["--str"] and "--int" in write
    assert "--prompts-from" not in knobs and "SAVE_EVERY=" not in " ".join(write)
    assert check[1:] == [WRITE, "check", "configs/user/examples/style-v1_run.py", "--script", "train"]
    assert train[-2:] == ["--config", "configs/user/examples/style-v1_run.py"]


@pytest.mark.parametrize(
    "args, message",
    [
        ((), "--weights DIR is required"),
        (("--weights", "{w}"), "--dataset DIR is required"),
        (("--weights", "{w}", "--dataset", "nowhere"), "dataset folder 'nowhere' does not exist"),
        (("--weights", "{w}", "--dataset", "{d}", "--name", "a b"), "--name 'a b' may hold only"),
        (("--weights", "{w}", "--dataset", "{d}", "--steps", "ten"), "--steps wants a whole number"),
        (("--weights", "{w}", "--bogus"), "unknown option '--bogus'"),
    ],
)
def test_train_refuses_bad_options(weights, dataset, tmp_path, args, message):
    r = dry_run("train.sh", *(a.format(w=weights, d=dataset) for a in args), cwd=tmp_path)
    assert r.returncode == 2
    assert message in r.stderr
    assert "+ " not in r.stdout  # nothing would have run


def test_sample_with_adapters_and_multipliers(weights, tmp_path):
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    a.write_bytes(b"")
    b.write_bytes(b"")
    r = dry_run(
        "sample.sh",
        *("--weights", str(weights), "--adapter", str(a), "--multiplier", "0.6", "--adapter", str(b)),
        *("--prompt", "a fox", "--count", "2", "--size", "768x1024", "--cfg", "4.5"),
        cwd=tmp_path,
        tool="kohakumoss-config",
    )
    assert r.returncode == 0, r.stderr
    new, write, check, sample = commands(r.stdout)
    assert new == [
        *("kohakumoss-config", "new", "sample", "--weights", str(weights)),
        *("--name", "a-sample", "--out-dir", "configs/user/examples", "--force", "--adapter", str(a)),
    ]
    joined = " ".join(write)
    assert f"--adapter {a} --multiplier 0.6 --adapter {b} --multiplier 1.0" in joined
    knobs = knob_args(write)
    assert knobs["--int"] == ["COUNT=2", "WIDTH=768", "HEIGHT=1024"]
    assert knobs["--float"] == ["CFG=4.5"]
    assert "OUT_DIR=runs/examples/sample/a-sample" in knobs["--str"]
    assert check[-3:] == ["configs/user/examples/a-sample_run.py", "--script", "sample"]
    assert sample[-3:] == ["scripts/sample/sample.py", "--config", "configs/user/examples/a-sample_run.py"]


def test_sample_base_model_without_tool(weights, tmp_path):
    r = dry_run("sample.sh", "--weights", str(weights), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    write, check, _ = commands(r.stdout)
    assert "--no-adapters" in write and "configs/user/examples/base-sample_run.py" in write
    assert check[-2:] == ["--script", "sample"]
    bad = dry_run("sample.sh", "--weights", str(weights), "--multiplier", "2", cwd=tmp_path)
    assert bad.returncode == 2 and "--multiplier comes after the --adapter" in bad.stderr


def test_grid_rows(weights, run_dir, tmp_path):
    base = ("--weights", str(weights), "--run", "my_set", "--runs-dir", str(run_dir.parent))

    def rows(*extra: str) -> list[str]:
        r = dry_run("grid.sh", *base, *extra, "--out", str(tmp_path / "g"), cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        cmds = commands(r.stdout)
        stack = cmds[-1]
        assert stack[1:3] == ["scripts/examples/stack_grid.py", str(tmp_path / "g" / "grid.png")]
        runs = [c for c in cmds if "scripts/sample/sample.py" in c]
        assert len(runs) == len(stack) - 3  # one sampler run per row
        return [Path(p).name for p in stack[3:]]

    assert rows() == ["base", "step_00000030"]
    assert rows("--checkpoints") == ["base", "step_00000010", "step_00000020", "step_00000030"]
    assert rows("--only", "step_00000020,step_00000010", "--no-base") == ["step_00000020", "step_00000010"]


def test_grid_row_configs(weights, run_dir, tmp_path):
    r = dry_run(
        "grid.sh",
        *("--weights", str(weights), "--run", "my_set", "--runs-dir", str(run_dir.parent)),
        *("--only", "step_00000020", "--seeds", "3,4", "--prompt", "a boat"),
        cwd=tmp_path,
        tool="kohakumoss-config",
    )
    assert r.returncode == 0, r.stderr
    cmds = commands(r.stdout)
    ckpt = str(run_dir / "checkpoints" / "step_00000020")
    assert cmds[0] == [
        *("kohakumoss-config", "new", "sample", "--weights", str(weights)),
        *("--name", "my_set-grid", "--out-dir", "configs/user/examples", "--force"),
    ]
    knobs = knob_args(cmds[1])
    assert knobs["--ints"] == ["SEEDS=3,4"] and "PROMPT=a boat" in knobs["--str"]
    assert cmds[2] == [
        *("kohakumoss-config", "check", "configs/user/examples/my_set-grid_run.py", "--script", "sample")
    ]
    base_row, base_run, ckpt_row, ckpt_run, _ = cmds[3:]
    out = "runs/examples/grid/my_set"
    assert base_row[3:] == [
        *(f"{out}/configs/base.py", "--base", "configs/user/examples/my_set-grid_run.py"),
        *("--str", f"OUT_DIR={out}/base", "--no-adapters"),
    ]
    assert base_run[-1] == f"{out}/configs/base.py"
    assert ckpt_row[-2:] == ["--adapter", ckpt]
    assert ckpt_run[-1] == f"{out}/configs/step_00000020.py"


@pytest.mark.parametrize(
    "extra, message",
    [
        (("--only", "step_00000040"), "no checkpoint 'step_00000040'"),
        (("--seeds", "1;2"), "--seeds wants whole numbers"),
    ],
)
def test_grid_refuses(weights, run_dir, tmp_path, extra, message):
    base = ("--weights", str(weights), "--run", "my_set", "--runs-dir", str(run_dir.parent))
    r = dry_run("grid.sh", *base, *extra, cwd=tmp_path)
    assert r.returncode == 2 and message in r.stderr
    empty = dry_run("grid.sh", "--weights", str(weights), "--run", "x", "--runs-dir", str(tmp_path), cwd=REPO)
    assert empty.returncode == 2 and "run folder" in empty.stderr


def test_a_failed_check_stops_unless_no_check(weights, dataset, tmp_path):
    """Not a dry run: a fake Python and a fake config tool (whose check fails) log what they were given."""
    log = tmp_path / "calls.log"
    fake_py, fake_tool = tmp_path / "python", tmp_path / "tool"
    fake_py.write_text(f'#!/usr/bin/env bash\necho "py $*" >> {log}\n')
    fake_tool.write_text(f'#!/usr/bin/env bash\necho "tool $*" >> {log}\n[[ $1 != check ]]\n')
    for f in (fake_py, fake_tool):
        f.chmod(0o755)
    env = {**os.environ, "PYTHON": str(fake_py), "KOHAKUMOSS_CONFIG": str(fake_tool), "DRY_RUN": "0"}
    args = ["bash", str(EXAMPLES / "train.sh"), "--weights", str(weights), "--dataset", str(dataset)]
    r = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "pass --no-check to run anyway" in r.stderr
    calls = log.read_text().splitlines()
    assert [c.split()[1] for c in calls] == ["new", WRITE, "new", "check"]  # and no training run
    log.unlink()
    r = subprocess.run(
        [*args, "--no-check"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 0, r.stderr
    assert "running anyway (--no-check)" in r.stdout
    assert "kohakuengine.cli run scripts/train/moss.py" in log.read_text().splitlines()[-1]

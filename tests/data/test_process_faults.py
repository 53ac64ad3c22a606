"""Loader workers under process faults: kill -9 of their parent, Ctrl-C to the whole process group."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

# a trainer-like parent: a Loader with two workers, one batch taken, then held open
PARENT = """
import faulthandler, json, os, signal, sys, time
# a terminal's foreground job has Python's Ctrl-C handler; started from a background job (`pytest &` in a
# script) SIGINT comes ignored and Python installs none: the parent would never stop (a CI run timed out so)
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
faulthandler.register(signal.SIGUSR1, all_threads=True)  # a hung parent's stacks, on the test's request
from kohakumoss_data import Loader, LoaderKnobs, PlanKnobs, ScanKnobs, build_plan, make_source, scan
from kohakumoss_common.knobs import Knob, Schema, run_checked

def run(_):
    source = make_source({"kind": "kohya", "path": sys.argv[1]})
    catalog = scan(source, ScanKnobs(workers=1), cache_dir=sys.argv[2])
    plan = build_plan(catalog, 0, PlanKnobs(area=64 * 64, tokens_per_step=40, epochs=50))
    it = iter(Loader(plan, catalog, source, knobs=LoaderKnobs(workers=2, prefetch_steps=2)))
    next(it)
    kids = [int(p) for p in os.listdir("/proc") if p.isdigit() and ppid(int(p)) == os.getpid()]
    print(json.dumps(kids), flush=True)
    while True:
        next(it)
        time.sleep(0.05)

def ppid(pid):
    try:
        return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1

sys.exit(run_checked(Schema([Knob("X", 0, "unused")]), {}, run, "parent"))
"""


def alive(pid: int) -> bool:
    """Running (a zombie waiting to be reaped counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def start_parent(
    kohya_dir: Path, tmp_path: Path, sigint_ignored: bool = False
) -> tuple[subprocess.Popen, list[int]]:
    """`sigint_ignored`: start it with SIGINT ignored, as every process of a script's background job is."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if sigint_ignored else None
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", PARENT, str(kohya_dir), str(tmp_path / "catalogs")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its own process group, as a terminal's foreground job
        )
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        pytest.fail(f"the parent never started its workers: {proc.stderr.read()}")
    workers = json.loads(line)
    assert len(workers) >= 2 and all(alive(p) for p in workers)
    return proc, workers


def proc_state(pid: int) -> str:
    """A process's run state, kernel wait and signal masks (pending, blocked, ignored, caught)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        wchan = Path(f"/proc/{pid}/wchan").read_text()
    except OSError as e:
        return f"{pid}: {e}"
    keep = ("State", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")
    return f"{pid}: wchan={wchan} " + " ".join(" ".join(ln.split()) for ln in status if ln.startswith(keep))


def hang_report(proc: subprocess.Popen, workers: list[int]) -> str:
    """What a parent that never stopped was doing: its and its workers' states, every thread's stack."""
    states = [f"parent {proc_state(proc.pid)}"] + [f"worker {proc_state(pid)}" for pid in workers]
    os.kill(proc.pid, signal.SIGUSR1)  # faulthandler (PARENT) writes every thread's stack to stderr
    time.sleep(1.0)
    proc.kill()
    _, err = proc.communicate(timeout=10)
    return "\n".join(states) + "\n--- parent's stderr ---\n" + err


def wait_gone(pids: list[int], seconds: float = 15.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def test_kill_9_of_the_parent_leaves_no_worker_alive(kohya_dir, tmp_path):
    proc, workers = start_parent(kohya_dir, tmp_path)
    try:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        assert wait_gone(workers) == []
    finally:
        for pid in workers:  # never leave a stray behind, even when the test fails
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("sigint_ignored", [False, True], ids=["launched-plain", "launched-ignoring-sigint"])
def test_ctrl_c_to_the_process_group_prints_one_line_and_no_worker_traceback(
    kohya_dir, tmp_path, sigint_ignored
):
    proc, workers = start_parent(kohya_dir, tmp_path, sigint_ignored)
    try:
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal does: parent and workers all get it
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            err = None
        if err is None:  # failed outside the except: the report, not communicate()'s traceback
            report = hang_report(proc, workers)
            pytest.fail(f"the parent did not stop within 30 s of Ctrl-C (mask bit 0x2: SIGINT):\n{report}")
        assert proc.returncode == 130
        assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
        assert err.strip().splitlines()[-1] == "interrupted"  # earlier lines: the scan's log
        assert wait_gone(workers) == []
    finally:
        proc.kill()
        for pid in workers:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)

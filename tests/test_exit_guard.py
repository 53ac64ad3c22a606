"""The test process's exit guard (tests/exit_guard.py): a pool worker left running no longer hangs the exit,
and a hang of any other kind ends with the session's status and every thread's stack."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# a process pool whose one worker never returns, left running at exit: the exit's join waits on it forever
LEFT_POOL = """
import sys, time
from concurrent.futures import ProcessPoolExecutor
sys.path.insert(0, sys.argv[1])
from tests.exit_guard import end_leftover_workers, live_pool_managers, new_pool_managers
pool = ProcessPoolExecutor(1)
pool.submit(time.sleep, 3600)
time.sleep(0.5)
assert new_pool_managers(set(), wait_s=0.2), "the running pool was not seen"
if sys.argv[2] == "end":
    print("ended", len(end_leftover_workers()), flush=True)
"""

# a non-daemon thread that never ends, the watchdog armed for 1 s with status 3
HUNG_THREAD = """
import sys, threading
sys.path.insert(0, sys.argv[1])
from tests.exit_guard import arm_exit_watchdog
threading.Thread(target=threading.Event().wait, name="never-ends").start()
arm_exit_watchdog(3, after_s=1.0)
"""


def run(script: str, *args: str, timeout: float) -> tuple[tuple[int, str, str] | None, float]:
    """(status, stdout, stderr), or None when it ran past `timeout` (then its whole group is killed)."""
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", script, str(ROOT), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the hung parent and the worker it waits on
        proc.communicate()
        return None, time.monotonic() - start
    return (proc.returncode, out, err), time.monotonic() - start


def test_a_pool_worker_left_running_hangs_the_exit_unless_the_workers_are_ended():
    hung, _ = run(LEFT_POOL, "keep", timeout=8)
    assert hung is None, "the exit did not hang: this test no longer shows the hang the guard ends"
    done, took = run(LEFT_POOL, "end", timeout=60)
    assert done is not None, "the exit still hung with the workers ended"
    status, out, err = done
    assert status == 0, err
    assert "ended 1" in out and took < 30


def test_the_watchdog_ends_a_hung_exit_with_the_status_and_the_stacks():
    done, took = run(HUNG_THREAD, timeout=60)
    assert done is not None, "the watchdog did not end the hung process"
    status, _, err = done
    assert status == 3 and took < 30
    assert "had not exited 1 s after the test session ended" in err
    assert "Thread 0x" in err, err  # faulthandler's dump of every thread

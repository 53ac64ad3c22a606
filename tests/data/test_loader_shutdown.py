"""Loader shutdown is bounded with a worker that never returns (a read blocked on a hung mount, a lock a
fork copied held): closing the loader, `Loader.close()` from another thread, and leaving the process
without closing it each end within seconds, the stuck worker gone. Without the bound each of them waited
on the worker forever (`Future.result()`, `shutdown(wait=True)`, the interpreter's exit join)."""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from concurrent.futures.process import BrokenProcessPool

import pytest

from kohakumoss_data.loader import stop_pool, worker_pool

from .test_process_faults import alive, wait_gone

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

# a parent whose one worker hangs in its first read past step 0; argv: dataset, catalogs, how to stop
PARENT = """
import json, os, sys, threading, time
from kohakumoss_data import Loader, LoaderKnobs, PlanKnobs, ScanKnobs, build_plan, make_source, scan

source = make_source({"kind": "kohya", "path": sys.argv[1]})
catalog = scan(source, ScanKnobs(workers=1), cache_dir=sys.argv[2])
plan = build_plan(catalog, 0, PlanKnobs(area=64 * 64, tokens_per_step=40, epochs=50))
read, reads = type(source).read, [0]

def hanging_read(self, locator):  # the one worker reads in plan order: step 0's items, then it hangs
    reads[0] += 1
    if reads[0] > len(plan.steps[0]):
        time.sleep(3600)
    return read(self, locator)

type(source).read = hanging_read  # the forked worker inherits it
loader = Loader(plan, catalog, source, knobs=LoaderKnobs(workers=1, prefetch_steps=2, stop_grace_s=1.0))
it = iter(loader)
next(it)
kids = [int(p) for p in os.listdir("/proc") if p.isdigit() and open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1] == str(os.getpid())]
print(json.dumps(kids), flush=True)
time.sleep(1.0)  # the worker takes its next task and hangs in it
start = time.monotonic()
how = sys.argv[3]
if how == "close":  # the consumer closes the generator (a `for` loop left by break or an exception)
    it.close()
elif how == "loader_close":  # another thread closes the loader while a consumer waits in next()
    consumer = threading.Thread(target=lambda: list(it), daemon=True)
    consumer.start()
    time.sleep(0.5)
    loader.close()
    consumer.join(30)
    assert not consumer.is_alive(), "the consumer still waits after Loader.close()"
else:  # 'exit': a consumer thread blocked in next() (the trainer's prefetch thread) and the process ends
    threading.Thread(target=lambda: next(it, None), daemon=True).start()
    time.sleep(0.5)
print(f"stopped {time.monotonic() - start:.1f}", flush=True)
"""


@pytest.mark.parametrize("how", ["close", "loader_close", "exit"])
def test_stopping_with_a_stuck_worker_is_bounded(kohya_dir, tmp_path, how):
    (tmp_path / "c").mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(kohya_dir), str(tmp_path / "c"), how],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    workers: list[int] = []
    try:
        line = proc.stdout.readline()
        assert line, proc.communicate(timeout=60)
        workers = json.loads(line)
        assert workers and all(alive(p) for p in workers)
        # before the bound: no exit at all (the test's own limit catches it)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "stopped" in out
        assert "Traceback" not in err, err
        assert wait_gone(workers, 5.0) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in workers:  # never leave a stray behind, even when the test fails
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_stop_pool_terminates_a_busy_worker_after_the_grace_period():
    """Workers forked from a thread that stays alive (here the test's): only the termination ends them."""
    pool = worker_pool(1, None, None)
    running = pool.submit(time.sleep, 3600)
    pids = list(pool._processes)
    time.sleep(0.5)
    start = time.monotonic()
    assert stop_pool(pool, grace_s=0.5) == 1
    assert time.monotonic() - start < 10
    assert wait_gone(pids, 5.0) == []
    with pytest.raises(BrokenProcessPool):
        running.result(timeout=10)
    idle = worker_pool(1, None, None)
    idle.submit(int, 1).result(timeout=30)
    idle_pids = list(idle._processes)
    start = time.monotonic()
    # an idle worker is asked to leave; one forked into a busy test process may still hang on its way
    # out (seen in full CI runs), and the stop ends it too, within the grace period plus the kill's bound
    stop_pool(idle, grace_s=2.0)
    assert time.monotonic() - start < 10
    assert wait_gone(idle_pids, 5.0) == []


@pytest.mark.parametrize("warn", [True, False])
def test_a_terminated_worker_is_a_warning_unless_the_stop_is_an_interrupt(caplog, warn):
    """After Ctrl-C or at the interpreter's exit (warn=False) the user hears one line, not the workers' end."""
    pool = worker_pool(1, None, None)
    pool.submit(time.sleep, 3600)
    time.sleep(0.5)
    with caplog.at_level(logging.DEBUG, logger="kohakumoss"):
        assert stop_pool(pool, grace_s=0.2, warn=warn) == 1
    lines = [r for r in caplog.records if "terminated 1 loader worker" in r.getMessage()]
    assert len(lines) == 1 and (lines[0].levelno == logging.WARNING) == warn


def test_a_stop_is_quiet_during_ctrl_c_and_when_the_consumer_left():
    from kohakumoss_data.loader import _stopping_quietly

    seen = []

    def batches():
        try:
            yield 1
        finally:
            seen.append(_stopping_quietly())

    it = batches()
    next(it)
    it.close()  # the consumer abandoned the iteration: GeneratorExit in flight
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt:
        seen.append(_stopping_quietly())
    seen.append(_stopping_quietly())  # an explicit close in normal flow warns
    assert seen == [True, True, False]


def test_a_submit_racing_the_stop_leaves_no_worker_running():
    """`Loader.close()` stops a pool from one thread while the feeder submits from another. Here the submit
    lands at the worst moment, after the stop looked at the workers and before it shut the pool: it must
    raise, or its worker be stopped with the rest (unseen, it ran on and its join hung the exit)."""
    pool = worker_pool(1, None, None)
    raced: list[object] = []
    shutdown = pool.shutdown

    def submit_then_shutdown(*args, **kwargs):
        try:
            raced.append(pool.submit(time.sleep, 3600))
        except RuntimeError:  # "cannot schedule new futures after shutdown"
            raced.append(None)
        return shutdown(*args, **kwargs)

    pool.shutdown = submit_then_shutdown
    stop_pool(pool, grace_s=0.2, warn=False)
    assert raced, "the stop never shut the pool down"
    pids = [p.pid for p in mp.active_children()]
    assert wait_gone(pids, 5.0) == [], "a worker forked by the racing submit is still running"

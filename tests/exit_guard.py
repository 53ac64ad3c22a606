"""The test process always exits: pool workers a test left behind are ended when the session ends, and a
watchdog ends the process with the session's status if the interpreter's exit still hangs (printing every
thread's stack, so the hang is found).

Why: the interpreter's exit joins each live ProcessPoolExecutor's manager thread with no timeout, and that
thread joins its workers; one worker that never exits (forked from a busy process, holding a lock it copied)
kept a CI run that had passed every test alive until its time limit, and nothing landed.
"""

from __future__ import annotations

import concurrent.futures.process as futures_process
import faulthandler
import multiprocessing
import os
import sys
import threading
import time

EXIT_WATCHDOG_S = 120.0
LEAK_WAIT_S = 5.0


def live_pool_managers() -> set[threading.Thread]:
    """The manager threads of this process's ProcessPoolExecutors that are still running."""
    return {t for t in list(futures_process._threads_wakeups.keys()) if t.is_alive()}


def new_pool_managers(before: set[threading.Thread], wait_s: float = LEAK_WAIT_S) -> set[threading.Thread]:
    """Managers started since `before` that are still running after up to `wait_s` (a pool stopped just now
    may take a moment to wind down)."""
    deadline = time.monotonic() + wait_s
    while (left := live_pool_managers() - before) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def end_leftover_workers(join_s: float = 5.0) -> list[int]:
    """Kill every child process multiprocessing still tracks (a pool's workers among them); their pids."""
    children = multiprocessing.active_children()
    for child in children:
        child.kill()
    for child in children:
        child.join(join_s)
    return [c.pid for c in children]


def arm_exit_watchdog(status: int, after_s: float = EXIT_WATCHDOG_S) -> threading.Thread:
    """If this process still runs `after_s` from now, print every thread's stack and exit with `status`."""

    def watch() -> None:
        time.sleep(after_s)
        sys.stderr.write(
            f"\nexit_guard: the process had not exited {after_s:.0f} s after the test session ended; "
            f"ending it with the session's status {status}. Every thread's stack:\n"
        )
        sys.stderr.flush()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        os._exit(status)

    thread = threading.Thread(target=watch, name="exit-watchdog", daemon=True)
    thread.start()
    return thread

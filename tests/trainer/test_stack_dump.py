"""`kill -USR1 <pid>` on a training process prints where every thread is."""

import os
import signal
import subprocess
import sys

import pytest


@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="no SIGUSR1 on this platform")
def test_sigusr1_prints_every_thread_stack_and_the_process_goes_on():
    code = (
        "import os, signal, time\n"
        "from kohakumoss.train.loop import dump_stacks_on_signal\n"
        "dump_stacks_on_signal()\n"
        "def waiting_in_a_named_function():\n"
        "    os.kill(os.getpid(), signal.SIGUSR1)\n"
        "    time.sleep(0.2)\n"
        "waiting_in_a_named_function()\n"
        "print('still running')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "waiting_in_a_named_function" in r.stderr
    assert "still running" in r.stdout


@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="no SIGUSR1 on this platform")
def test_a_captured_stderr_falls_back_to_the_process_stderr(capsys):
    """Under pytest's capsys (or a notebook) sys.stderr has no file descriptor: faulthandler gets fd 2's."""
    import faulthandler

    from kohakumoss.train.loop import dump_stacks_on_signal

    with pytest.raises((AttributeError, OSError, ValueError)):  # what the trainer hit before the fallback
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True, chain=False)
    try:
        dump_stacks_on_signal()
    finally:
        faulthandler.unregister(signal.SIGUSR1)

"""KOHAKUMOSS_TEST_FAILURES: .ci/gpu kills a GPU area at its time limit; the failures before that stay on disk."""

import os
import shutil
import subprocess
import sys
from pathlib import Path


def test_each_failure_is_written_as_it_happens(tmp_path):
    for name in ("conftest.py", "exit_guard.py"):  # the conftest and the module it loads from beside it
        shutil.copy(Path(__file__).with_name(name), tmp_path / name)
    (tmp_path / "test_two.py").write_text("def test_a():\n    assert 1 == 2\n\ndef test_b():\n    pass\n")
    log = tmp_path / "failures.txt"
    env = {**os.environ, "KOHAKUMOSS_TEST_FAILURES": str(log)}
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_two.py"]
    subprocess.run(args, cwd=tmp_path, env=env, capture_output=True)
    text = log.read_text()
    assert "test_two.py::test_a (call)" in text and "assert 1 == 2" in text and "test_b" not in text

"""A run refused once its loader workers are up (VAE_ENCODE / TEXT_ENCODE 'cache' over an empty cache) exits
within seconds of the refusal, leaving no process behind: no pool, thread or worker keeps the interpreter
alive (it once hung at exit, joining the loader's process pool in concurrent.futures' exit hook)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import tiny_knobs

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

# the loader's workers hang in every task past its first step's (a read on a hung mount, a library
# deadlocked after the fork): only a stop that terminates busy workers lets the refused run end
RUN = """
import json, multiprocessing, sys, time
import kohakumoss_data.loader as loader
import kohakumoss_data.worker as worker
first, taken = multiprocessing.Value("i", 0), multiprocessing.Value("i", 0)  # shared with forked workers
real_iter = loader.Loader.__iter__

def counted_iter(self):
    first.value = len(self.plan.steps[self.start_step])
    return real_iter(self)

def hanging_run_task(task, source=None, cache=None):
    with taken.get_lock():
        taken.value += 1
        n = taken.value
    if n > first.value:
        time.sleep(3600)
    return worker.run_task(task, source, cache)

loader.Loader.__iter__ = counted_iter
loader.run_task = hanging_run_task  # pickled by name into the forked workers, which define it too
from kohakumoss_common.knobs import run_checked
from kohakumoss.config.train import TRAIN_SCHEMA
from kohakumoss.train.loop import train
sys.exit(run_checked(TRAIN_SCHEMA, json.load(open(sys.argv[1])), train, "scripts/train/moss.py"))
"""
EXIT_AFTER_REFUSAL_S = 15.0  # a worker's stop grace (5 s) with room for a loaded machine; a hang is forever


def session_processes(session: int) -> list[int]:
    """Every live process of the session `session` (the run and anything it started)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[3]) == session:  # state, ppid, pgrp, session
            out.append(int(entry))
    return out


def test_a_cache_refusal_with_loader_workers_exits_at_once(train_world, tmp_path):
    knob = (
        "TEXT_ENCODE"  # refused in the loader's first step, after VAE_ENCODE 'auto' filled latents in a pool
    )
    knobs = tiny_knobs(train_world, f"refused-{knob}", WORKERS=2, CACHE_DIR=str(tmp_path / "cache"))
    knobs[knob] = "cache"
    (tmp_path / "knobs.json").write_text(json.dumps(knobs))
    log_txt = Path(knobs["RUNS_DIR"]) / knobs["RUN_NAME"] / "log.txt"
    with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", RUN, str(tmp_path / "knobs.json")],
            stdout=out,
            stderr=err,
            start_new_session=True,  # its session id is its pid: every process it starts is found by it
        )
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            seen.update(p for p in session_processes(proc.pid) if p != proc.pid)
            time.sleep(0.05)
        ended = time.time()
        assert proc.poll() is not None, "the refused run never exited"
        text = (tmp_path / "out").read_text() + (tmp_path / "err").read_text()
        assert proc.returncode != 0, text
        assert f"{knob}='cache' but " in text and "entries this run reads are not in" in text, text
        assert "Traceback" not in text, text
        assert seen, "no loader worker was started: the test no longer covers a pool"
        # the refusal was logged (log.txt's last line), then the process ended within seconds
        assert log_txt.read_text().splitlines()[-1].endswith(f"{knob}='auto'")
        assert ended - log_txt.stat().st_mtime < EXIT_AFTER_REFUSAL_S
        left = session_processes(proc.pid)
        assert left == [], f"processes left behind: {left}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in session_processes(proc.pid):  # never leave a stray behind, even when the test fails
            os.kill(pid, signal.SIGKILL)


def test_a_dataset_with_nothing_usable_is_refused_before_the_models_load(train_world, tmp_path, monkeypatch):
    """A gzip-compressed webdataset shard is named in the scan, and the run stops there, not after loading."""
    import gzip
    import io
    import tarfile

    from kohakumoss.train import trainer
    from kohakumoss.train.loop import train
    from kohakumoss_common.errors import DataError

    image = next(Path(train_world["DATASET"]["path"]).rglob("*.png")).read_bytes()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in (("s1.png", image), ("s1.txt", b"a caption")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    shard = tmp_path / "shard-0.tar.gz"
    shard.write_bytes(gzip.compress(buf.getvalue()))

    def no_models(cfg):
        raise AssertionError("the models loaded before the scan refused the dataset")

    monkeypatch.setattr(trainer, "build_components", no_models)
    knobs = tiny_knobs(train_world, "compressed", DATASET={"kind": "webdataset", "path": str(shard)})
    with pytest.raises(DataError, match=r"no usable item in the dataset .*dropped: compressed_tar 1"):
        train(knobs)

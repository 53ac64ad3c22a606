"""Files and disks: a full disk is one line at every write whatever library raised it, a re-saved folder
keeps a complete copy at every moment, a torn metrics line, the run folder's lock, folder knobs that
cannot be folders, cut or foreign weight files and adapters of another model size are named."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError

from kohakumoss.adapters import build_adapter, load_adapter
from kohakumoss.adapters.io import save_adapter
from kohakumoss.checkpoint import folders
from kohakumoss.checkpoint import write as ckpt_mod
from kohakumoss.checkpoint.folders import list_checkpoints
from kohakumoss.checkpoint.write import save_checkpoint
from kohakumoss.encoders.tiny import write_tiny_vae
from kohakumoss.encoders.vae import ImageVAE
from kohakumoss.model import get_preset
from kohakumoss.model.io import load_backbone, save_backbone
from kohakumoss.train.logbook import MetricsWriter
from kohakumoss_common import io
from kohakumoss_common.errors import CheckpointError, ConfigError
from kohakumoss_common.io import DiskSpaceError, disk_full_as_error, disk_full_reason, read_header, save_image
from kohakumoss_common.knobs import check_folder_knobs
from kohakumoss_common.lock import FolderInUse, FolderLock
from kohakumoss_common.paths import folder_problem
from kohakumoss_data.cache import TensorCache
from kohakumoss_data.catalog import _write_cache

from ..model.helpers import random_model

ENOSPC = OSError(errno.ENOSPC, "No space left on device")


def torch_save_error() -> RuntimeError:
    """What torch.save into a file object raises on a full disk: its writer's RuntimeError, the OSError as context."""
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")  # noqa: B904
    except RuntimeError as e:
        return e


# each library's own way of saying the disk is full (each seen on a full tmpfs, see the real test below)
LIBRARY_ERRORS = {
    "safetensors": lambda: SafetensorError(
        "Error while serializing: I/O error: No space left on device (os error 28)"
    ),
    "torch.save": torch_save_error,
    "pyarrow": lambda: OSError(28, "Error writing bytes to file. Detail: [errno 28] No space left on device"),
    "pillow": lambda: OSError(errno.ENOSPC, "No space left on device"),
    "quota": lambda: OSError(errno.EDQUOT, "Disk quota exceeded"),
}


@pytest.mark.parametrize("library", sorted(LIBRARY_ERRORS))
def test_disk_full_as_error_reads_every_librarys_way_of_saying_it(tmp_path, library):
    with pytest.raises(DiskSpaceError) as e, disk_full_as_error(tmp_path / "out", 1 << 20):
        raise LIBRARY_ERRORS[library]()
    line = str(e.value)
    assert "\n" not in line and line.startswith(f"{tmp_path / 'out'}: disk full while writing (")
    assert "needs 1.0 MiB" in line and "free" in line
    with pytest.raises(SafetensorError), disk_full_as_error(tmp_path, 1):  # another error passes through
        raise SafetensorError("Error while deserializing header: HeaderTooLarge")
    assert disk_full_reason(RuntimeError("unexpected pos 704 vs 598")) is None


def raise_from(error_factory):
    def raiser(*args, **kwargs):
        raise error_factory()

    return raiser


def test_a_full_disk_in_a_checkpoints_safetensors_or_torch_save_is_one_line(tmp_path, monkeypatch):
    """safetensors raises its own error type (it was not caught) and torch.save a RuntimeError."""
    state = {"w": torch.ones(4)}
    for target, error in (
        ("save_file", LIBRARY_ERRORS["safetensors"]),
        ("torch_save", LIBRARY_ERRORS["torch.save"]),
    ):
        with monkeypatch.context() as m:
            if target == "save_file":
                m.setattr(io, "save_file", raise_from(error))
            else:
                m.setattr(ckpt_mod.torch, "save", raise_from(error))
            with pytest.raises(DiskSpaceError, match=r"step_00000003: disk full while writing \(No space"):
                save_checkpoint(tmp_path, 3, state, optimizer_state={"state": {}})
        assert sorted(p.name for p in tmp_path.iterdir()) == []  # the temporary folder gone too


def test_a_full_disk_is_one_line_naming_the_file_at_every_other_writer(tmp_path, monkeypatch):
    """The cache, the catalog, metrics.jsonl, sample images and exported adapters."""
    safetensors_full = raise_from(LIBRARY_ERRORS["safetensors"])
    with monkeypatch.context() as m:
        m.setattr(io, "save_file", safetensors_full)
        cache = TensorCache(tmp_path / "cache", {"encoder": "x"})
        cache.put("a", torch.ones(2))
        with pytest.raises(DiskSpaceError, match=r"cache.*part-.*\.safetensors: disk full while writing"):
            cache.flush()
    real_write_text = Path.write_text

    def full_write_text(self, *args, **kwargs):
        if self.name.endswith(".tmp"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write_text(self, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(Path, "write_text", full_write_text)
        with pytest.raises(DiskSpaceError, match=r"catalog\.json: disk full while writing"):
            _write_cache(tmp_path / "catalog.json", {}, 0, {})

    metrics = MetricsWriter(tmp_path / "metrics.jsonl")
    with monkeypatch.context() as m:
        m.setattr("kohakumoss.train.logbook.open", raise_from(LIBRARY_ERRORS["pillow"]), raising=False)
        with pytest.raises(DiskSpaceError, match=r"metrics\.jsonl: disk full while writing"):
            metrics.write({"step": 1, "loss": 0.5})

    class FullImage:
        def save(self, *args, **kwargs):
            raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(DiskSpaceError, match=r"grid\.png: disk full while writing"):
        save_image(FullImage(), tmp_path / "grid.png")
    assert not (tmp_path / "grid.png").exists() and not list(tmp_path.glob(".grid*"))

    network = build_adapter(random_model(get_preset("tiny")), algo="lora", rank=2, alpha=2)
    with monkeypatch.context() as m:  # the adapter is written through the atomic safetensors writer
        m.setattr(io, "save_file", safetensors_full)
        with pytest.raises(DiskSpaceError, match=r"adapter\.safetensors: disk full while writing"):
            save_adapter(network, tmp_path / "export" / "adapter.safetensors")


REAL_FULL_DISK = textwrap.dedent(
    """
    import sys, torch
    from PIL import Image
    from kohakumoss.checkpoint import write as checkpoint
    from kohakumoss.checkpoint.write import save_checkpoint
    from kohakumoss.train.logbook import MetricsWriter
    from kohakumoss_common.io import save_image
    root = sys.argv[1]
    checkpoint.ensure_free_space = lambda path, needed: None  # past the check before writing: a mid-write fill
    big = {"w": torch.randn(64, 1024)}
    attempts = [
        lambda: save_checkpoint(root + "/ckpt", 1, big),  # safetensors
        lambda: save_checkpoint(root + "/ckpt", 2, None, optimizer_state=big, write_sharded=lambda t: None),
        lambda: save_image(Image.effect_noise((512, 512), 64).convert("RGB"), root + "/grid.png"),
        lambda: MetricsWriter(root + "/metrics.jsonl").write({"pad": "x" * 400000}),
    ]
    for attempt in attempts:
        try:
            attempt()
            print("written")
        except Exception as e:
            print(type(e).__name__, str(e).replace(chr(10), " "))
    """
)


def test_a_real_full_disk_gives_one_line_at_each_writer(tmp_path):
    """A 64 KiB tmpfs in a user namespace: the libraries' own errors, not imitations."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux) for a small tmpfs")
    mount = tmp_path / "small"
    mount.mkdir()
    script = tmp_path / "full.py"
    script.write_text(REAL_FULL_DISK)
    cmd = f"mount -t tmpfs -o size=64k tmpfs {mount} && exec {sys.executable} {script} {mount}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(["unshare", "-r", "-m", "sh", "-c", cmd], capture_output=True, text=True, env=env)
    if "mount" in done.stderr and done.returncode != 0 and not done.stdout:
        pytest.skip(f"no user namespaces here: {done.stderr.strip()}")
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 4, done.stdout + done.stderr
    for line, name in zip(lines, ["step_00000001", "step_00000002", "grid.png", "metrics.jsonl"]):
        assert line.startswith("DiskSpaceError ") and f"{name}: disk full while writing" in line, line


def test_a_resave_keeps_a_complete_copy_when_stopped_between_its_renames(tmp_path, monkeypatch):
    first = save_checkpoint(tmp_path, 2, {"w": torch.zeros(3)})
    real_replace, calls = os.replace, []

    def stopped_at_the_second(src, dst):
        if Path(dst) == first:
            calls.append(src)
            if len(calls) == 1:  # the new copy going in place, after the old one was set aside
                raise KeyboardInterrupt
        return real_replace(src, dst)

    with monkeypatch.context() as m:
        m.setattr(io.os, "replace", stopped_at_the_second)
        with pytest.raises(KeyboardInterrupt):
            save_checkpoint(tmp_path, 2, {"w": torch.ones(3)})
    assert list_checkpoints(tmp_path) == [(2, first)]
    assert io.load_tensors(first / "trainable.safetensors")["w"].eq(0).all()

    # a kill there (nothing runs after it): the next start puts the set-aside copy back
    real_replace(first, tmp_path / ".step_00000002.old")
    (tmp_path / ".step_00000002.abc.tmp").mkdir()
    folders.clean_stale(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000002"]
    assert folders.verify_checkpoint(first) is None


def test_a_torn_last_metrics_line_is_dropped_on_resume(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    writer = MetricsWriter(path)
    for step in (1, 2, 3):
        writer.write({"step": step, "loss": 1.0 / step})
    with open(path, "a") as f:
        f.write('{"step": 4, "lo')  # a kill in the middle of a line
    MetricsWriter(path, resume_step=3)
    assert [r["step"] for r in map(json.loads, path.read_text().splitlines())] == [1, 2, 3]
    assert f"{path}: line(s) [4] are not JSON records" in caplog.text


def test_a_second_process_on_a_locked_folder_is_refused_with_the_owners_pid(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom kohakumoss_common.lock import FolderLock\n"
         f"FolderLock({str(tmp_path)!r}).acquire(); print('held', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(FolderInUse, match=f"{tmp_path}: in use by process {holder.pid}"):
            FolderLock(tmp_path).acquire()
    finally:
        holder.kill()  # as kill -9: the lock goes with the process, never stale
        holder.wait()
    with FolderLock(tmp_path):
        pass


def test_folder_knobs_that_are_files_or_too_long_are_named(tmp_path):
    (tmp_path / "a_file").write_text("x")
    assert folder_problem(tmp_path / "a_file") == f"{tmp_path / 'a_file'} is a file, not a folder"
    assert folder_problem(tmp_path / "a_file" / "run") == f"{tmp_path / 'a_file'} is a file, not a folder"
    assert "is 300 bytes long; the filesystem of" in folder_problem(tmp_path / ("r" * 300))
    assert folder_problem(tmp_path / "new" / "run") is None
    for knob in ("RUNS_DIR", "CACHE_DIR", "OUT", "OUT_DIR"):
        with pytest.raises(ConfigError, match=f"{knob}: .*a_file is a file"):
            check_folder_knobs({knob: str(tmp_path / "a_file")})


def test_a_cut_or_foreign_weight_file_is_named_with_what_was_expected(tmp_path):
    vae_dir = write_tiny_vae(tmp_path / "vae")
    vae_file = next(Path(vae_dir).glob("*.safetensors"))
    data = vae_file.read_bytes()
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(data[: len(data) // 2])
    for load in (read_header, ImageVAE.load, load_backbone):
        with pytest.raises(
            CheckpointError,
            match=rf"{cut}: cut short: {len(data) // 2} bytes, its header describes {len(data)}",
        ):
            load(cut)
    dit = save_backbone(random_model(get_preset("tiny")), tmp_path / "dit", layout="comfy", prefix="moss")[0]
    with pytest.raises(
        CheckpointError, match=rf"{dit}: expected a VAE .*; this file holds a MOSS-Image DiT \(keys like"
    ):
        ImageVAE.load(dit)
    with pytest.raises(
        CheckpointError, match=rf"{vae_dir}: expected a MOSS-Image DiT; this file holds a VAE"
    ):
        load_backbone(vae_dir)


def test_an_adapter_of_another_model_size_names_the_module_and_both_shapes(tmp_path):
    cfg = get_preset("tiny")
    path = save_adapter(
        build_adapter(random_model(cfg), algo="lora", rank=2, alpha=2), tmp_path / "a.safetensors"
    )
    wider = random_model(dataclasses.replace(cfg, dim=cfg.dim * 2))
    with pytest.raises(
        CheckpointError,
        match=r"a\.safetensors: module .* was trained as a \d+x\d+ linear .*this model's is \d+x\d+: an adapter trained on a model of another size",
    ):
        load_adapter(wider, path)
    load_adapter(random_model(cfg), path)  # the model it was made for still loads it


def test_a_script_whose_out_folder_is_a_file_stops_with_one_line_before_work(tmp_path, capsys):
    from kohakumoss.config.export import EXPORT_SCHEMA
    from kohakumoss.config.sample import SAMPLE_SCHEMA
    from kohakumoss_common.knobs import run_checked

    (tmp_path / "a_file").write_text("x")
    ran = []
    for schema, knob in ((SAMPLE_SCHEMA, "OUT_DIR"), (EXPORT_SCHEMA, "OUT")):
        code = run_checked(schema, {knob: str(tmp_path / "a_file")}, ran.append, "script.py")
        assert code == 2 and ran == []
        assert capsys.readouterr().err == f"error: {knob}: {tmp_path / 'a_file'} is a file, not a folder\n"

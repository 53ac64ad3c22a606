"""The trainer with DISTRIBUTED='fsdp' on 2 CPU ranks (gloo) against one process: the same losses and
gradient norms, sharded (DCP) checkpoints resumed at 2 ranks and at 1, rank 0's exports equal to the
one-process run's files, and the refused combinations named by their knob."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from kohakumoss.checkpoint.folders import verify_checkpoint
from kohakumoss.checkpoint.read import load_checkpoint
from kohakumoss.distributed.rank_run import fsdp_plan_problem
from kohakumoss.memory.plan import MemoryPlan
from kohakumoss.train.loop import train_on_devices
from kohakumoss_common.errors import ConfigError

from .test_trainer import records
from .tiny import tiny_knobs, train_world  # noqa: F401 (the fixture)

STEPS = dict(STEPS=3, GRAD_ACCUM=2, LOGGERS=[], SAVE_EVERY=2)
FSDP = dict(DISTRIBUTED="fsdp", DEVICES=2, DIST_TIMEOUT=120.0)


def same_losses(a: list[dict], b: list[dict], rel: float = 1e-4, grad_rel: float = 1e-3) -> None:
    assert [r["step"] for r in a] == [r["step"] for r in b] and a
    for ra, rb in zip(a, b):
        assert rb["loss"] == pytest.approx(ra["loss"], rel=rel)
        assert rb["grad_norm"] == pytest.approx(ra["grad_norm"], rel=grad_rel)
        assert (rb["samples"], rb["tokens"]) == (ra["samples"], ra["tokens"])


def export_script(ckpt: Path, out: Path) -> Path:
    """scripts/export/export.py on a checkpoint folder, in this process (as test_scripts runs it)."""
    from kohakumoss.config.export import EXPORT_SCHEMA
    from kohakumoss_common.knobs import run_checked

    from ..trainer.test_scripts import load_script

    ns = load_script("scripts/export/export.py")
    knobs = {**ns, "MODEL_PRESET": "tiny", "ADAPTER": str(ckpt), "OUT": str(out), "NAME": "again"}
    assert run_checked(EXPORT_SCHEMA, knobs, ns["run"], "export.py") == 0
    return out


def export_files(folder: Path, name: str) -> dict[str, Path]:
    """{path under `folder` with the run's name taken out: file}."""
    return {p.relative_to(folder).as_posix().replace(name, ""): p for p in folder.rglob("*") if p.is_file()}


def same_files(one: Path, two: Path, name_one: str, name_two: str) -> list[str]:
    """Every export file of `two` has `one`'s name, keys, dtypes, metadata keys and (fp32 tolerance) values."""
    fa, fb = export_files(one, name_one), export_files(two, name_two)
    assert sorted(fa) == sorted(fb) and fa
    for rel in fa:
        if not rel.endswith(".safetensors"):
            continue
        wa, wb = load_file(fa[rel]), load_file(fb[rel])
        assert wa.keys() == wb.keys()
        for key in wa:
            assert wa[key].dtype == wb[key].dtype
            diff = (wa[key].float() - wb[key].float()).abs().max()
            assert diff <= 1e-4 + 1e-3 * wa[key].float().abs().max(), (rel, key, diff)
        with safe_open(fa[rel], "pt") as ma, safe_open(fb[rel], "pt") as mb:
            assert set(ma.metadata() or {}) == set(mb.metadata() or {})
    return sorted(fa)


def same_weights(whole: Path, sharded: Path) -> None:
    """A sharded checkpoint read whole in this process (what the export script reads) holds the
    one-process checkpoint's trainable weights."""
    a, b = load_checkpoint(whole).trainable, load_checkpoint(sharded).trainable
    assert a.keys() == b.keys() and a
    for key in a:
        assert torch.allclose(a[key], b[key], rtol=1e-4, atol=1e-6), key


def test_fsdp_lora_on_two_cpu_ranks_trains_what_one_process_does(train_world):  # noqa: F811
    """LoRA over a sharded frozen base (with an EMA): losses, samples drawn by every rank, a sharded
    checkpoint, the ComfyUI and LyCORIS exports; then the step-2 checkpoint resumed at 1 and at 2
    ranks, and the one-process run's checkpoint resumed at 2."""
    extra = dict(SAVE_FORMAT="both", SAMPLE_PROMPTS=["a cat"], VAL_ITEMS=1, VAL_EVERY=1, EMA=True, **STEPS)
    one = train_on_devices(tiny_knobs(train_world, "lora-one", **extra))
    two = train_on_devices(tiny_knobs(train_world, "lora-two", **FSDP, **extra))
    log = (two / "log.txt").read_text()
    assert "FSDP2: " in log and "CUDA graphs off" in log
    a, b = records(one), records(two)
    same_losses(a, b)
    assert all(rb["val_loss"] == pytest.approx(ra["val_loss"], rel=1e-4) for ra, rb in zip(a, b))
    assert len({r["loss"] for r in b}) == 3  # the adapter moved
    files = same_files(one / "export", two / "export", "lora-one", "lora-two")
    assert any("comfy" in f for f in files)
    assert (two / "samples" / "grid_step_00000003.png").is_file()

    ckpt = two / "checkpoints" / "step_00000002"
    assert verify_checkpoint(ckpt) is None
    meta = json.loads((ckpt / "meta.json").read_text())
    assert meta["sharded"] and (ckpt / "sharded" / ".metadata").is_file()
    assert not (ckpt / "trainable.safetensors").exists() and not (ckpt / "optimizer.pt").exists()
    assert (ckpt / "export" / "lora-two-comfy.safetensors").is_file()
    assert (ckpt / "ema.safetensors").is_file() and meta["ema"] is not None
    same_weights(one / "checkpoints" / "step_00000002", ckpt)
    assert not list((two / "checkpoints").glob(".*"))  # no temporary folder left
    # the export script, one process, re-exports the sharded checkpoint as the run exported it
    again = export_script(ckpt, two / "again")
    for name in ("again-comfy.safetensors", "lycoris/again.safetensors"):
        fresh = load_file(again / name)
        original = load_file(ckpt / "export" / name.replace("again", "lora-two"))
        assert fresh.keys() == original.keys() and all(torch.equal(fresh[k], original[k]) for k in fresh)

    at_one = train_on_devices(tiny_knobs(train_world, "lora-at-one", RESUME=str(ckpt), **extra))
    same_losses(a[-1:], records(at_one))
    at_two = train_on_devices(tiny_knobs(train_world, "lora-at-two", RESUME=str(ckpt), **FSDP, **extra))
    same_losses(b[-1:], records(at_two), rel=1e-6)
    whole = one / "checkpoints" / "step_00000002"  # the one-process format: the adapter loads whole
    from_one = train_on_devices(tiny_knobs(train_world, "lora-from-one", RESUME=str(whole), **FSDP, **extra))
    same_losses(a[-1:], records(from_one))


def test_fsdp_lokr_exports_what_one_process_does(train_world):  # noqa: F811
    """A LyCORIS algorithm besides LoRA (LoKr) over the sharded base, its blocks checkpointed whole
    (the recompute gathers each block again): the losses and both adapter files of one process."""
    extra = dict(ALGO="lokr", SAVE_FORMAT="both", STEPS=2, GRAD_ACCUM=1, LOGGERS=[])
    one = train_on_devices(tiny_knobs(train_world, "lokr-one", **extra))
    two = train_on_devices(tiny_knobs(train_world, "lokr-two", CHECKPOINTING="full", **FSDP, **extra))
    assert "memory plan: ckpt full" in (two / "log.txt").read_text()
    same_losses(records(one), records(two))
    files = same_files(one / "export", two / "export", "lokr-one", "lokr-two")
    assert any("comfy" in f for f in files)


def test_fsdp_full_finetune_resumes_at_two_and_at_one(train_world):  # noqa: F811
    """A full fine-tune, AdamW on fp32 shards: the losses and the merged export of one process, a
    checkpoint written by 2 ranks resumed by 2 and by 1 (DCP reshards the weights and the states)."""
    extra = dict(ALGO="full", LR=1e-4, USE_MUON=False, **STEPS)
    one = train_on_devices(tiny_knobs(train_world, "full-one", **extra))
    two = train_on_devices(tiny_knobs(train_world, "full-two", **FSDP, **extra))
    a, b = records(one), records(two)
    same_losses(a, b)
    assert len({r["loss"] for r in b}) == 3
    same_files(one / "export", two / "export", "full-one", "full-two")

    ckpt = two / "checkpoints" / "step_00000002"
    assert json.loads((ckpt / "meta.json").read_text())["sharded"]
    same_weights(one / "checkpoints" / "step_00000002", ckpt)
    at_two = train_on_devices(tiny_knobs(train_world, "full-at-two", RESUME=str(ckpt), **FSDP, **extra))
    same_losses(b[-1:], records(at_two), rel=1e-6)
    at_one = train_on_devices(tiny_knobs(train_world, "full-at-one", RESUME=str(ckpt), **extra))
    same_losses(a[-1:], records(at_one))
    # the one-process checkpoint of a full fine-tune holds whole optimizer states: refused under FSDP2
    whole = one / "checkpoints" / "step_00000002"
    with pytest.raises(Exception, match="cannot resume under DISTRIBUTED='fsdp'"):
        train_on_devices(tiny_knobs(train_world, "full-whole", RESUME=str(whole), **FSDP, **extra))


def test_fsdp_full_finetune_with_muon_logs_the_losses_of_one(train_world):  # noqa: F811
    """Muon on sharded matrices orthogonalizes the whole matrix (DTensor ops), as one process does; its
    Newton-Schulz runs in bf16 (torch.optim.Muon), so the weights agree to bf16 rounding of the update,
    not to fp32: the losses are compared here, the files in the AdamW test."""
    extra = dict(ALGO="full", LR=1e-4, MUON_LR=1e-3, USE_MUON=True, STEPS=3, GRAD_ACCUM=2, LOGGERS=[])
    one = train_on_devices(tiny_knobs(train_world, "muon-one", **extra))
    two = train_on_devices(tiny_knobs(train_world, "muon-two", **FSDP, **extra))
    same_losses(records(one), records(two))


def test_fsdp_refusals_name_the_knob(train_world):  # noqa: F811
    refused = [
        (dict(PRECISION="bf16", CUDA_GRAPHS="on"), "CUDA_GRAPHS: 'on' with DISTRIBUTED"),
        (dict(STREAM_BLOCKS=2), "STREAM_BLOCKS: 2 with DISTRIBUTED='fsdp'"),
        (dict(CHECKPOINTING="mlp"), "CHECKPOINTING: 'mlp' with DISTRIBUTED='fsdp'"),
        (dict(OPTIMIZER="prodigy"), "OPTIMIZER: 'prodigy' with DISTRIBUTED='fsdp'"),
        (dict(ALGO="full", EMA=True), "EMA: True with DISTRIBUTED='fsdp'"),
        (dict(OPTIMIZER_PLACEMENT="host"), "OPTIMIZER_PLACEMENT: 'host' with DISTRIBUTED='fsdp'"),
    ]
    for knobs, message in refused:
        with pytest.raises(ConfigError, match=message):
            train_on_devices(tiny_knobs(train_world, "no", **FSDP, **knobs))
    # a plan resolved from MEMORY_PROFILE is checked in the worker, naming the engine's knob
    with pytest.raises(Exception, match="STREAM_BLOCKS: 32 with DISTRIBUTED='fsdp' \\(from the memory plan"):
        train_on_devices(tiny_knobs(train_world, "no", MEMORY_PROFILE="low_vram", **FSDP))
    assert fsdp_plan_problem(MemoryPlan(checkpointing="attn"))[0] == "CHECKPOINTING"
    assert fsdp_plan_problem(MemoryPlan(stream_blocks=-1))[0] == "STREAM_BLOCKS"
    assert fsdp_plan_problem(MemoryPlan(activation_offload="on"))[0] == "ACTIVATION_OFFLOAD"
    assert fsdp_plan_problem(MemoryPlan(optimizer="stream"))[0] == "OPTIMIZER_PLACEMENT"
    assert fsdp_plan_problem(MemoryPlan(checkpointing="full")) is None

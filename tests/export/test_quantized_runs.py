"""The reported fp8-base failures, run as a user runs them (the tiny trainer on the CPU): GLoRA crashed at
its first checkpoint, LoRA with SAVE_MERGED=True crashed the same way, LoKr wrote a wrong fused-qkv
ComfyUI diff while SAVE_FORMAT='comfy' deleted the correct LyCORIS file. Each run now trains, checkpoints
and exports, every file verified as it is written (a wrong one would stop the run with ExportMismatch)."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file

from kohakumoss.train.loop import train

from ..trainer.conftest import tiny_knobs, train_world  # noqa: F401 (the fixture)

RUNS = [
    ("glora", {}, False, "comfy"),
    ("lora", {}, True, "comfy"),
    ("lokr", {"factor": 4}, False, "comfy"),
]


@pytest.mark.parametrize("algo,args,merged,fmt", RUNS, ids=[r[0] for r in RUNS])
def test_fp8_base_runs_checkpoint_and_export(train_world, caplog, algo, args, merged, fmt):  # noqa: F811
    knobs = tiny_knobs(
        train_world,
        f"fp8-{algo}",
        ALGO=algo,
        ALGO_ARGS=args,
        BASE_PRECISION="fp8_weight",
        SAVE_MERGED=merged,
        SAVE_FORMAT=fmt,
        STEPS=4,
        SAVE_EVERY=2,
    )
    with caplog.at_level("INFO", logger="kohakumoss.export.verify"):
        run = train(knobs)
    lines = [r.getMessage() for r in caplog.records if "keys matched, 0 unused" in r.getMessage()]
    # two checkpoints, each with its ComfyUI and LyCORIS files (and merged); the final export is the last
    # checkpoint's files linked, verified when they were written
    assert len(lines) == 2 * (2 + merged), lines
    export = run / "export"
    comfy = load_file(str(export / f"fp8-{algo}-comfy.safetensors"))
    assert not any(k.endswith("weight_scale") for k in comfy)
    assert not (export / "lycoris").exists()  # SAVE_FORMAT='comfy' keeps one file
    for step in (2, 4):
        folder = next((run / "checkpoints").glob(f"step_*{step}"))
        assert (folder / "trainable.safetensors").is_file()
        assert (folder / "export" / f"fp8-{algo}-comfy.safetensors").is_file()


def test_a_wrong_export_keeps_the_checkpoint_and_stops_the_run(train_world, monkeypatch):  # noqa: F811
    import kohakumoss.export.bundle as bundle
    from kohakumoss.export.verify import ExportMismatch

    real = bundle.to_comfy_adapter

    def broken(*a, **k):
        out = real(*a, **k)
        for key in [k for k in out.tensors if k.endswith("lora_up.weight")]:
            out.tensors[key] = out.tensors[key] * 3
        return out

    monkeypatch.setattr(bundle, "to_comfy_adapter", broken)
    knobs = tiny_knobs(train_world, "wrong-export", STEPS=4, SAVE_EVERY=2)
    with pytest.raises(ExportMismatch, match="wrong-export-comfy.safetensors: ComfyUI"):
        train(knobs)
    folder = next((_run_dir(knobs) / "checkpoints").glob("step_*2"))
    assert (folder / "trainable.safetensors").is_file() and (folder / "meta.json").is_file()
    assert (
        folder / "export" / "lycoris" / "wrong-export.safetensors"
    ).is_file()  # SAVE_FORMAT='comfy' kept it


def _run_dir(knobs) -> Path:
    return Path(knobs["RUNS_DIR"]) / knobs["RUN_NAME"]

"""The LyCORIS kernel probe: the child runs the adapter at each shape, its outcome is kept, and a child that
dies switches lycoris to its torch backend and names the shape it was running."""

from __future__ import annotations

import sys

import torch

from kohakumoss.adapters import AdapterSpec, kernel_probe
from kohakumoss.model import get_preset, linear_rows
from kohakumoss.model.backbone import MossBackbone

LOKR = AdapterSpec(algo="lokr", rank=4, alpha=4.0, preset="full", bypass=True)


def test_shapes_are_the_wrapped_linears_with_the_rows_each_sees():
    with torch.device("meta"):
        model = MossBackbone(get_preset("tiny"))
    shapes = kernel_probe.probe_shapes(model, LOKR, lambda n: linear_rows(n, 64, 16, 2))
    dim = get_preset("tiny").dim
    assert (dim, dim, 80) in shapes  # a block's q (all tokens)
    assert {rows for _, _, rows in shapes} == {80, 16, 64, 2}  # blocks, refiner, embedder and head, time
    assert len(shapes) == len(set(shapes))
    attn = kernel_probe.probe_shapes(model, AdapterSpec(algo="lokr", preset="attn"), lambda n: 80)
    assert attn == [(dim, dim, 80)]  # q, k, v and o: one shape
    assert not kernel_probe.needs_probe(AdapterSpec(algo="lora")) and kernel_probe.needs_probe(LOKR)


def test_the_trainers_probe_rows_hold_an_edit_steps_references():
    """The trainer probes lycoris's kernels at a full step's rows: an edit step's samples carry their
    references (each at the target's area) through the blocks and the video embedder, not the head."""
    from kohakumoss.config.train import TrainConfig
    from kohakumoss.train.trainer import step_rows

    knobs = {"AREA": 1024 * 1024, "MAX_TEXT_TOKENS": 256, "TOKENS_PER_STEP": 2 * (2 * 4096 + 256)}
    edit = step_rows(
        TrainConfig.from_knobs({**knobs, "DATASET": {"kind": "kohya", "path": "d", "references": "r"}})
    )
    t2i = step_rows(TrainConfig.from_knobs(knobs))
    assert edit("layers.0.attention.to_q") == 2 * (2 * 4096 + 256)  # two samples, each with a reference
    assert edit("video_embedder") == 2 * 2 * 4096 and edit("final_linear_video") == 2 * 4096
    assert t2i("layers.0.attention.to_q") == 3 * (4096 + 256) and t2i("final_linear_video") == 3 * 4096


def test_a_child_that_passes_is_run_once(tmp_path, monkeypatch):
    shapes = [(32, 48, 20), (48, 32, 3)]
    got = kernel_probe.probe_lycoris_kernels(LOKR, shapes, torch.float32, torch.device("cpu"), tmp_path)
    assert got.ok and not got.cached and got.failed is None
    children = []
    monkeypatch.setattr(kernel_probe, "_run_child", lambda *a: children.append(a) or got)
    again = kernel_probe.probe_lycoris_kernels(LOKR, shapes, torch.float32, torch.device("cpu"), tmp_path)
    assert again.ok and again.cached and not children  # the record answers now
    kernel_probe.probe_lycoris_kernels(LOKR, [(32, 48, 21)], torch.float32, torch.device("cpu"), tmp_path)
    assert len(children) == 1  # another shape set is probed anew


def test_a_child_that_dies_names_the_shape_and_the_run_falls_back(tmp_path, monkeypatch, caplog):
    # a child that starts the second shape and then dies as a CUDA fault would (abort, no traceback)
    dying = (
        "import json, os, sys; p = json.loads(sys.argv[1]);"
        "[print('probe-start ' + json.dumps(s), flush=True) for s in p['shapes'][:2]];"
        "print('torch.AcceleratorError: CUDA error: an illegal memory access was encountered', file=sys.stderr);"
        "print('Compile with TORCH_USE_CUDA_DSA to enable device-side assertions.', file=sys.stderr, flush=True);"
        "os.abort()"
    )
    monkeypatch.setattr(kernel_probe, "child_command", lambda payload: [sys.executable, "-c", dying, payload])
    monkeypatch.delenv(kernel_probe.BACKEND_ENV, raising=False)
    shapes = [(32, 48, 20), (48, 32, 3), (64, 64, 7)]
    got = kernel_probe.probe_lycoris_kernels(LOKR, shapes, torch.float32, torch.device("cpu"), tmp_path)
    assert not got.ok and got.failed == (48, 32, 3)
    assert got.message == "torch.AcceleratorError: CUDA error: an illegal memory access was encountered"
    assert kernel_probe.os.environ[kernel_probe.BACKEND_ENV] == "torch"
    assert "in=48 out=32 rows=3" in caplog.text
    monkeypatch.delenv(kernel_probe.BACKEND_ENV)
    again = kernel_probe.probe_lycoris_kernels(LOKR, shapes, torch.float32, torch.device("cpu"), tmp_path)
    assert again.cached and not again.ok and again.failed == (48, 32, 3)
    assert kernel_probe.os.environ[kernel_probe.BACKEND_ENV] == "torch"


def test_the_trainer_probes_a_lycoris_adapter_on_a_gpu_at_the_steps_rows(monkeypatch):
    from types import SimpleNamespace

    from kohakumoss.train import trainer

    with torch.device("meta"):
        model = MossBackbone(get_preset("tiny"))
    calls = []
    monkeypatch.setattr(kernel_probe, "probe_lycoris_kernels", lambda *a: calls.append(a))
    data = SimpleNamespace(area=64 * 64 * 4, max_text_tokens=16, tokens_per_step=2 * (64 + 16), dataset={})
    cfg = SimpleNamespace(adapter=SimpleNamespace(spec=lambda: LOKR), data=data)
    comps = SimpleNamespace(backbone=model, device=torch.device("cuda"), dtype=torch.bfloat16)
    trainer.probe_adapter_kernels(cfg, comps)
    ((spec, shapes, dtype, device, _),) = calls
    assert spec == LOKR and dtype == torch.bfloat16 and device.type == "cuda"
    assert {rows for _, _, rows in shapes} == {160, 32, 128, 2}  # 2 samples of 64 image + 16 text tokens
    comps.device = torch.device("cpu")  # no fused lycoris kernels there: nothing to probe
    trainer.probe_adapter_kernels(cfg, comps)
    cfg.adapter.spec = lambda: AdapterSpec(algo="lora")  # the kernel registry's path
    comps.device = torch.device("cuda")
    trainer.probe_adapter_kernels(cfg, comps)
    assert len(calls) == 1


def test_the_child_lets_lycoris_time_its_kernels_as_the_first_step_does(monkeypatch, capsys):
    from lycoris.kernels.plans import tune

    seen = []
    forward = kernel_probe._One.forward
    monkeypatch.setattr(
        kernel_probe._One, "forward", lambda self, x: seen.append(tune.tuning_enabled()) or forward(self, x)
    )
    payload = {"spec": LOKR.to_json(), "shapes": [[32, 48, 5]], "dtype": "float32", "device": "cpu"}
    kernel_probe._child(payload)
    assert seen == [True] and not tune.tuning_enabled()  # on inside the child's window only
    assert capsys.readouterr().out.splitlines()[-1].strip() == kernel_probe.DONE.strip()

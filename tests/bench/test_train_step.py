"""scripts/bench/train_step.py end to end on the CPU (tiny preset), and its FLOP count and row parsing."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from .scripts import load_bench

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "bench" / "train_step.py"
ROWS = ["lora/speed/latent_text", "full/speed/latent_text", "lora/minimal/none", "baseline/eager"]


def load_script():
    return load_bench("train_step")


def test_flops_of_the_5b_preset():
    """The bench's MFU divides by kohakumoss.memory.flops.step_flops over the row's image and text tokens."""
    from kohakumoss.memory.flops import step_flops
    from kohakumoss.model import get_preset

    ts = load_script()
    cfg, a = get_preset("moss-image-5b"), ts.parse_args(["--target-preset", "full"])
    assert ts.token_layout(a)[1:] == (4096, 256)
    lens = [4352, 4352]
    for full in (False, True):
        got = ts.row_flops(a, cfg, lens, full)
        assert got == step_flops(cfg, [4096, 4096], [256, 256], full, outside_trains=True)
    a = ts.parse_args([])  # attn-mlp: the refiner, embedders and modulations frozen, no backward there
    assert ts.row_flops(a, cfg, lens, False) == step_flops(
        cfg, [4096] * 2, [256] * 2, False, outside_trains=False
    )
    assert ts.row_flops(a, cfg, lens, False) < step_flops(cfg, [4096] * 2, [256] * 2, False)
    legacy = ts.row_adapter(a, ts.parse_row("lora/speed/latent_text/legacy"))[0]  # every DiT linear
    assert ts.row_flops(a, cfg, lens, False, legacy) == step_flops(cfg, [4096] * 2, [256] * 2, False)


def test_row_specs():
    ts = load_script()
    spec = ts.parse_row("full/minimal/latent_text/cap24/optimizer=host/stream_slots=3")
    assert (spec.mode, spec.profile, spec.cache, spec.cap_gb) == ("full", "minimal", "latent_text", 24.0)
    assert dict(spec.overrides) == {"optimizer": "host", "stream_slots": 3}
    assert ts.parse_row("baseline/compiled").baseline
    assert ts.parse_row("lora/auto/latent_text/cap24/legacy").forward == "legacy"
    for bad in ("lora/speed", "lora/speed/latents", "sgd/speed/none", "baseline/fast", "lora/speed/none/x",
                "full/speed/latent_text/legacy", "lora/speed/latent_text/legacy/merged"):  # fmt: skip
        with pytest.raises(SystemExit):
            ts.parse_row(bad)
    rows = ts.expand_rows("main,lora/speed/latent_text,baseline")
    assert rows[:8] == ts.GROUPS["main"] and rows[8:] == ts.GROUPS["baseline"]  # no duplicates


def test_cpu_run_end_to_end(tmp_path):
    out = tmp_path / "train_step.json"
    cmd = [
        sys.executable,
        str(SCRIPT),
        "--preset",
        "tiny",
        "--device",
        "cpu",
        "--steps",
        "2",
        "--warmup",
        "1",
    ]
    cmd += ["--full-optimizer", "adamw"]  # Muon's bf16 Newton-Schulz is slow on a CPU
    cmd += ["--rows", ",".join(ROWS), "--out", str(out), "--timing", "both"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # tiny ops: one thread beats a busy pool on a shared CPU
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("row ") and "MFU %" in line)
    body = lines[head + 1 : head + 1 + 2 * len(ROWS)]
    assert [line.split()[0] for line in body[::2]] == ROWS  # the table is printed last, one line per row
    assert all(line.startswith("  (back to back") for line in body[1::2])  # --timing both: its line below
    assert any("MFU = FLOPs / step time" in line for line in lines)
    data = json.loads(out.read_text())
    assert [r["row"] for r in data["rows"]] == ROWS
    for r in data["rows"]:
        assert r["error"] == "", r
        assert r["steps_done"] == 3 and r["nonfinite_steps"] == 0  # 1 warm-up + 2 measured
        assert r["tokens_per_s"] > 0 and r["mfu"] > 0
        assert r["samples_per_s"] == pytest.approx(r["tokens_per_s"] * 2 / (2 * (64 + 8)))
        b2b = r["trainer"]  # the 2 measured steps again, back to back
        assert r["timing"] == "synced" and b2b["timing"] == "trainer" and b2b["steps_done"] == 2
        assert b2b["tokens_per_s"] > 0 and b2b["mfu"] == pytest.approx(r["mfu"] * r["step_s"] / b2b["step_s"])
    minimal = data["rows"][2]
    assert minimal["plan"]["STREAM_BLOCKS"] == -1  # the profile's plan was installed, not a default
    assert minimal["plan"]["TEXT_ENCODER_PLACEMENT"] == "streamed"  # 'off' upgraded: cache 'none' encodes
    assert "speed/eager" in data["ratios"] and "speed/eager (back to back)" in data["ratios"]


def test_a_row_that_times_out_reports_its_progress(tmp_path):
    ts = load_script()
    progress = tmp_path / "row.json.progress"
    progress.write_text(
        "".join(
            json.dumps({"step": i, "s": s, "peak_gib": 5.0 + i}) + "\n" for i, s in enumerate([9, 9, 2, 4, 3])
        )
    )
    row = ts.partial_row("lora/minimal/latent_text/cap8", progress, warmup=2, samples=2, why="timed out")
    assert row["steps_done"] == 5 and row["step_s"] == 3 and row["samples_per_s"] == 2 / 3
    assert row["step_peak_gib"] == 9.0 and row["error"] == "timed out after 5 steps"
    empty = ts.partial_row("x/y/z", tmp_path / "missing", warmup=2, samples=2, why="subprocess exited -9")
    assert empty["steps_done"] == 0 and empty["step_s"] is None


def row_plan(ts, a, name: str):
    """The trainer's build_plan on the row's knobs (a capped row prices the cap, as on the GPU)."""
    from kohakumoss.train.components import build_plan

    return build_plan(ts.row_config(a, ts.parse_row(name)), torch.device("cuda" if "/cap" in name else "cpu"))


def test_a_row_plan_comes_from_a_profile_a_catalog_entry_or_the_fastest_fit():
    from kohakumoss.memory.catalog import find_entry
    from kohakumoss.memory.profiles import PROFILES
    from kohakumoss.model import get_preset

    ts = load_script()
    cfg, a = get_preset("moss-image-5b"), ts.parse_args([])
    plan, why = row_plan(ts, a, "lora/minimal/latent_text/stream_slots=3")
    assert plan.stream_slots == 3 and plan.checkpointing == PROFILES["minimal"].checkpointing
    plan, why = row_plan(ts, a, "lora/c0292/latent_text")
    assert plan == find_entry("c0292", cfg.depth) and why.startswith("catalog entry c0292")
    small, why = row_plan(ts, a, "lora/auto/latent_text/cap6")
    assert why.startswith("auto: catalog entry") and "fits 6 GiB" in why
    roomy, _ = row_plan(ts, a, "lora/auto/latent_text/cap80")
    assert small.streamed_count(cfg.depth) > roomy.streamed_count(cfg.depth)
    for bad, says in [
        ("lora/auto/latent_text", "capN"),
        ("lora/c9999/latent_text", "c0299"),
        ("lora/x/latent_text", "'x'"),
        ("lora/speed/latent_text/stream_slot=3", "stream_slot"),
    ]:
        with pytest.raises(SystemExit, match=says):
            ts.row_config(a, ts.parse_row(bad))


def test_a_row_config_is_the_trainers():
    """What the row asks for reaches the trainer's knobs: cap, tokens, adapter, plan fields, encoders."""
    ts = load_script()
    a = ts.parse_args(["--rank", "8", "--base-precision", "fp8", "--plan-knobs", '{"stream_slots": 4}'])
    k = ts.row_config(a, ts.parse_row("lora/auto/none/cap24/checkpointing=full")).knobs()
    assert (k["MEMORY_PROFILE"], k["CARD_GB"], k["MODEL_PRESET"]) == ("auto", 24.0, "moss-image-5b")
    assert (k["RANK"], k["ALPHA"], k["BASE_PRECISION"], k["TOKENS_PER_STEP"]) == (
        8,
        8.0,
        "fp8",
        2 * (4096 + 256),
    )
    assert (k["CHECKPOINTING"], k["STREAM_SLOTS"]) == ("full", 4)
    assert (k["TEXT_ENCODE"], k["VAE_ENCODE"], k["TEXT_ENCODER"], k["VAE"]) == ("auto", "auto", "", "")
    # the shipped adapter (the trainer's TARGET_PRESET and BYPASS), or a FORWARD part's
    assert (k["TARGET_PRESET"], k["BYPASS"]) == ("attn-mlp", "auto")
    for part, adapter in (
        ("legacy", ("full", True)),
        ("bypass", ("attn-mlp", True)),
        ("merged", ("attn-mlp", False)),
    ):
        knobs = ts.row_config(a, ts.parse_row(f"lora/speed/latent_text/{part}")).knobs()
        assert (knobs["TARGET_PRESET"], knobs["BYPASS"]) == adapter, part
    forced = ts.parse_args(["--bypass", "False", "--target-preset", "full"])
    assert ts.row_config(forced, ts.parse_row("lora/speed/latent_text")).knobs()["BYPASS"] is False
    assert all(ts.parse_row(n) for n in ts.GROUPS["fastpath"])
    full = ts.row_config(a, ts.parse_row("full/speed/latent_text")).knobs()
    assert (full["ALGO"], full["BASE_PRECISION"], full["CARD_GB"]) == ("full", "same", 0.0)
    assert (full["TEXT_ENCODE"], full["VAE_ENCODE"]) == ("cache", "cache")


def test_the_model_and_plan_are_built_by_build_components(monkeypatch):
    """The script keeps no model building or plan resolution of its own: a row's DiT, plan and estimate
    are the trainer's build_components' from the row's knobs, and that DiT is the one trained."""
    import kohakumoss.train.components as components
    import kohakumoss.train.loop as loop

    source = SCRIPT.read_text()
    for copied in ("MossBackbone(", "init_weights(", "install_memory_plan(", "quantize_frozen_linears(",
                   "estimate_peak(", "set_per_process_memory_fraction(", "resolve_plan(", "find_entry("):  # fmt: skip
        assert copied not in source, copied
    ts = load_script()
    for gone in ("estimate_knobs", "resolve_plan", "predicted_peak"):
        assert not hasattr(ts, gone), gone

    built, trained = [], []
    real_build, real_trainable = components.build_components, loop.build_trainable

    def spy_build(cfg, build_device=None):
        built.append((cfg, real_build(cfg, build_device=build_device)))
        return built[-1][1]

    def spy_trainable(cfg, comps):
        trained.append(comps)
        return real_trainable(cfg, comps)

    monkeypatch.setattr(components, "build_components", spy_build)
    monkeypatch.setattr(loop, "build_trainable", spy_trainable)
    argv = [
        "--preset",
        "tiny",
        "--device",
        "cpu",
        "--steps",
        "1",
        "--warmup",
        "1",
        "--full-optimizer",
        "adamw",
    ]
    a = ts.parse_args(argv)
    name = "lora/minimal/latent_text/stream_slots=3"
    row = ts.run_row(a, name)
    assert row["error"] == "" and row["steps_done"] == 2, row
    assert len(built) == 1 and built[0][0] == ts.row_config(a, ts.parse_row(name))
    k, comps = built[0]
    assert trained == [comps]  # the adapter wraps the components' DiT, not a second one
    trainer_plan, trainer_why = components.build_plan(k, torch.device("cpu"))
    assert (
        comps.plan == trainer_plan
        and row["plan"] == trainer_plan.knobs()
        and row["plan"]["STREAM_SLOTS"] == 3
    )
    assert row["notes"][0] == f"plan: {trainer_why}" and "predicted peak" in trainer_why
    assert row["predicted_gib"] == components.predicted_peak_gib(k, trainer_plan)
    assert row["params"] == sum(p.numel() for p in comps.backbone.parameters())


def test_profile_steps_writes_the_op_table(tmp_path, monkeypatch, capsys):
    ts = load_script()
    monkeypatch.setenv("OUT", str(tmp_path))
    x = torch.randn(64, 64)
    ts.profile_steps(lambda i: (x @ x).sum(), 5, 2, torch.device("cpu"), "lora/speed/latent_text", trace=True)
    text = (tmp_path / "profile_lora_speed_latent_text.txt").read_text()
    with gzip.open(tmp_path / "trace_lora_speed_latent_text.json.gz") as f:
        assert "aten::mm" in f.read().decode()  # the Chrome trace, with the op that ran
    assert text.startswith("profile of 2 steps of lora/speed/latent_text") and "aten::mm" in text
    assert "aten::mm" in capsys.readouterr().out


def test_kernels_are_grouped_by_kind_per_step():
    ts = load_script()
    kernels = [
        ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16", 30.0),
        ("nvjet_sm90_tst_192x192_64x3_2x1_v_badd_coopB_NNN", 60.0),
        ("_norm_modulate_bwd", 6.0),
        ("void at::native::vectorized_elementwise_kernel<8, at::native::FillFunctor<c10::BFloat16>>", 3.0),
        ("something_else", 1.0),
    ]
    table = ts.kinds_table(kernels, steps=3).splitlines()
    assert table[1].split()[:2] == ["GEMM", "20.00"]  # largest first, per step
    assert [line.split()[0] for line in table[2:5]] == ["attention", "Triton", "copies"]
    assert table[-1].split()[-1] == "33.33"
    # with the profiled steps' wall time and kernel count: the GPU's idle time and kernels per step
    table = ts.kinds_table(kernels, steps=3, wall_ms=120.0, launches=15).splitlines()
    assert table[-3].split()[-1] == "33.33"
    assert table[-2].split()[2] == "40.00" and "idle 6.67 ms" in table[-2]
    assert table[-1].split()[-1] == "5"


def test_row_kernels_bandwidth_per_call():
    """GB/s from the bytes each call must move ([T, width] bf16 tensors read + written) over its device time."""
    ts = load_script()
    tokens, dim, hidden = 8704, 3072, 8192
    # the MLP activation's forward: the one forward kernel over [T, h] tensors, whatever its name
    act = next(k for k, (_, w) in ts.ROW_KERNEL_TENSORS.items() if w == "h" and k.endswith("_fwd"))
    n_act = ts.ROW_KERNEL_TENSORS[act][0]
    kernels = [  # (name, ms summed over 2 steps, calls)
        ("_norm_modulate_bwd", 62.2e-3 * 86, 86),  # 4 tensors of [T, d] in 62.2 us
        (act, 99.8e-3 * 84, 84),  # tensors of [T, h]
        ("nvjet_sm90_tst_192x192", 400.0, 840),  # not a row kernel
    ]
    lines = ts.row_kernel_table(kernels, 2, tokens, dim, hidden, ceiling_gbs=4159.0).splitlines()
    assert "4159 GB/s" in lines[0] and len(lines) == 4
    mlp, norm = lines[2].split(), lines[3].split()  # largest device time first
    assert mlp[0] == act and norm[0] == "_norm_modulate_bwd"
    assert float(norm[1]) == 43.0 and float(norm[2]) == 62.2
    assert abs(float(norm[3]) - 4 * tokens * dim * 2 / 62.2e-6 / 1e9) < 1  # 3439 GB/s
    assert norm[4] == "82.7%"
    assert abs(float(mlp[3]) - n_act * tokens * hidden * 2 / 99.8e-6 / 1e9) < 1
    assert ts.row_kernel_table(kernels[2:], 2, tokens, dim, hidden, 4159.0) == ""


def test_the_table_says_when_the_allocator_retried():
    ts = load_script()
    row = {"row": "lora/minimal/latent_text/cap4", "steps_done": 43, "cap_gib": 4, "under_cap": True}
    assert "allocator retries" not in ts.table([row])[1]
    assert ts.table([{**row, "alloc_retries": 12}])[1].endswith("(12 allocator retries)")


FAKE_SMI = """#!/usr/bin/env python3
import sys, time
args = sys.argv[1:]
with open(sys.argv[0] + ".calls", "a") as f:
    f.write(" ".join(args) + "\\n")
loop = "-lms" in args
apps = any(a.startswith("--query-compute-apps") for a in args)
used = [100, 900, 300]
for i in range(200 if loop else 1):
    mib = used[min(i, 2)]
    print(f"{PID}, {mib}" if apps else f"{mib + 1000}, {1980 - mib}, [N/A], 700.00" if i == 0 else f"{mib + 1000}, {1980 - mib}, 650.5, 700.00", flush=True)
    if loop:
        time.sleep(0.01)
"""


def test_smi_poller_streams_from_one_process_per_query(tmp_path, monkeypatch):
    """Readings come from long-lived loop-mode nvidia-smi processes (one start per row, not per poll);
    the peak is kept, and interval 0 takes one reading at the end."""
    ts = load_script()
    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_SMI.replace("PID", str(os.getpid())))
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    import time

    t0 = time.perf_counter()
    with ts.SmiPoller(0.01, gpu_base_mib=1000.0) as poller:
        # until both streams passed their 900 MiB reading (a loaded machine starts the fake slowly)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (poller.process_mib == 900 and poller.gpu_mib == 1900):
            time.sleep(0.05)
        time.sleep(0.1)
    t1 = time.perf_counter()
    assert poller.result() == (900 / 1024, "process")
    assert poller.gpu_mib == 1900
    # the SM clock and power readings (a "[N/A]" field skipped), averaged per step span
    assert poller.clocks and all(w == 650.5 for _, _, w in poller.clocks) and poller.power_limit_w == 700.0
    (clock, watts), (none, _) = poller.per_step([(t0, t1), (t1 + 10, t1 + 11)])
    assert 1080 <= clock <= 1880 and watts == 650.5 and none is None
    calls = (tmp_path / "nvidia-smi.calls").read_text().splitlines()
    looped = [c for c in calls if "-lms 10" in c]
    assert len(looped) == 2 and len(calls) == 4  # two streams, then one reading of each at the end

    (tmp_path / "nvidia-smi.calls").unlink()
    with ts.SmiPoller(0, gpu_base_mib=None) as poller:
        pass
    assert poller.result() == (100 / 1024, "process")
    assert all("-lms" not in c for c in (tmp_path / "nvidia-smi.calls").read_text().splitlines())


def test_trainer_timing_runs_steps_back_to_back():
    """'trainer': each step from the previous step's end to its own (the spans tile the run);
    'synced': each its own span; both time every step, and an unknown mode is refused."""
    import time

    ts = load_script()

    def step(i):
        time.sleep(0.01 * (i + 1))

    cpu = torch.device("cpu")
    times, done, error, peaks, starts = ts.timed_steps(step, 3, cpu, "trainer")
    assert done == 3 and not error and peaks == []
    for i in range(2):
        assert starts[i + 1] == pytest.approx(starts[i] + times[i], abs=1e-9)
    assert all(t >= 0.01 * (i + 1) for i, t in enumerate(times))  # each step's own sleep, at least
    times, *_ = ts.timed_steps(step, 3, cpu, "synced")
    assert len(times) == 3 and all(t >= 0.01 * (i + 1) for i, t in enumerate(times))
    with pytest.raises(ValueError, match="timing"):
        ts.timed_steps(step, 1, cpu, "wall")


def test_device_kernels_leave_out_annotations_and_host_ops():
    """The optimizer's user annotation spans its own kernels on the GPU timeline: counted once."""
    from types import SimpleNamespace

    ts = load_script()
    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU

    def ev(key, us, device=cuda, annotation=False, count=2):
        return SimpleNamespace(
            key=key, self_device_time_total=us, device_type=device, is_user_annotation=annotation, count=count
        )

    events = [
        ev("multi_tensor_apply_kernel<FusedAdamW>", 2000.0, count=34),
        ev("Optimizer.step#AdamW.step", 2100.0, annotation=True),
        ev("aten::_fused_adamw_", 0.0, device=cpu),
        ev("_norm_modulate_bwd", 5000.0, count=86),
        ev("nothing_on_the_device", 0.0),
    ]
    assert ts.device_kernels(events) == [
        ("multi_tensor_apply_kernel<FusedAdamW>", 2.0, 34),
        ("_norm_modulate_bwd", 5.0, 86),
    ]


def test_copy_bandwidth_is_bytes_read_and_written_over_time():
    from kohakumoss_common.timing import copy_gbs

    gbs = copy_gbs("cpu", gib=1 / 64)
    assert 0.1 < gbs < 1e4  # a plausible host memcpy rate, counted both ways


def test_the_baseline_computes_the_released_model():
    """PlainDiT with a MossBackbone's weights (LoRA ups at zero) gives the backbone's velocity: the plain
    baseline is the same model, so the two rows' FLOPs are the same work."""
    sys.path.insert(0, str(SCRIPT.parent))
    from baseline_model import PlainDiT, rope_angles

    from kohakumoss.model import MossBackbone, PackedSeq, get_preset

    cfg = get_preset("tiny")
    torch.manual_seed(0)
    moss = MossBackbone(cfg).init_weights(std=0.05, generator=torch.Generator().manual_seed(0)).eval()
    plain = PlainDiT(cfg, 4, torch.float32, torch.float32)
    names = {  # PlainDiT name -> MossBackbone name, where they differ
        "text_proj": "text_embedder.proj",
        "refiner": "text_embedder.blocks",
        "time_1": "time_embedding.0",
        "time_2": "time_embedding.2",
    }
    block_linears = ("q", "k", "v", "o", "ffn_up_gate", "ffn_down")
    ours = dict(moss.named_parameters())
    copied = set()
    with torch.no_grad():
        for name, p in plain.named_parameters():
            if ".down." in name or ".up." in name:
                continue
            key = name.replace(".base.", ".")
            for a, b in names.items():
                key = key.replace(a, b, 1) if key.startswith(a) else key
            parts = key.split(".")
            if parts[0] == "layers" and parts[2] in block_linears:
                key = ".".join([*parts[:2], "proj", *parts[2:]])
            if parts[-1] in ("norm1", "norm2", "q_norm", "k_norm", "final_norm_video"):
                key += ".weight"  # nn.RMSNorm's parameter; the baseline holds the bare weight
            assert ours[key].shape == p.shape, key
            p.copy_(ours[key])
            copied.add(key)
    assert copied == set(ours)  # every parameter of the product, with its shape

    B, side, n_text = 2, 4, 5
    g = torch.Generator().manual_seed(1)
    img = torch.randn(B, side * side, cfg.in_channels, generator=g)
    text = torch.randn(B, n_text, cfg.text_dim, generator=g)
    sigma = torch.rand(B, generator=g)
    seq = PackedSeq.build([n_text] * B, [(side, side)] * B)
    want = moss(img.flatten(0, 1), text.flatten(0, 1), sigma, seq).view(B, side * side, -1)
    cos, sin = rope_angles(cfg, n_text, side, side, "cpu")
    got = plain(img, text, sigma, cos.expand(B, -1, -1), sin.expand(B, -1, -1))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["lora/minimal/latent_text/cap4", "lora/auto/none/cap24"])
def test_a_capped_row_on_the_gpu_is_the_components_cap_and_plan(tmp_path, name):
    """A capped row (its own process: the cap is the process's) runs under CARD_GB's cap, its DiT built
    on the host and drawn on the GPU by build_components, its plan line the trainer's."""
    from kohakumoss.train.components import build_plan

    out = tmp_path / "row.json"
    cmd = [sys.executable, str(SCRIPT), "--row", name, "--row-out", str(out), "--preset", "tiny", "--device", "cuda",
           "--steps", "2", "--warmup", "1", "--cap-steps", "2", "--smi-interval", "0"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "is capped at" in proc.stderr + proc.stdout  # cap_to_card's line
    row = json.loads(out.read_text())
    assert row["error"] == "" and row["steps_done"] == 3 and row["under_cap"] is True, row
    ts = load_script()
    k = ts.row_config(ts.parse_args(["--preset", "tiny", "--device", "cuda"]), ts.parse_row(name))
    assert row["notes"][0] == f"plan: {build_plan(k, torch.device('cuda'))[1]}"
    assert any("build device: host" in note for note in row["notes"])
    assert row["predicted_gib"] is not None and row["step_peak_gib"] <= row["cap_gib"]


def test_an_edit_row_on_the_cpu(tmp_path):
    """--references 1: every sample brings one reference of the target's size; the row counts its
    tokens, the FLOPs are the edit layout's, and the cache 'none' row runs too."""
    from kohakumoss.memory.flops import step_flops
    from kohakumoss.model import get_preset

    out = tmp_path / "train_step.json"
    rows = ["lora/speed/latent_text", "lora/minimal/none"]
    cmd = [
        sys.executable,
        str(SCRIPT),
        "--preset",
        "tiny",
        "--device",
        "cpu",
        "--steps",
        "1",
        "--warmup",
        "1",
    ]
    cmd += ["--references", "1", "--rows", ",".join(rows), "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    for r in data["rows"]:
        assert r["error"] == "" and r["steps_done"] == 2 and r["reference_tokens_per_step"] == 2 * 64, r
        assert r["samples_per_s"] == pytest.approx(r["tokens_per_s"] * 2 / (2 * (64 + 8 + 64)))
        assert r["image_tokens_per_s"] == pytest.approx(r["tokens_per_s"] * 64 / (64 + 8 + 64))
        assert any("references: 1 per sample" in n for n in r["notes"])
    ts = load_script()
    a = ts.parse_args(["--preset", "tiny", "--references", "1"])
    tiny = get_preset("tiny")
    assert ts.row_flops(a, tiny, [136, 136], False) == step_flops(
        tiny, [64, 64], [8, 8], False, outside_trains=False, ref_lens=[64, 64]
    )
    with pytest.raises(SystemExit, match="no --references"):
        ts.run_baseline_row(a, ts.parse_row("baseline/eager"))


@pytest.mark.parametrize("references", [0, 1])
def test_an_auto_row_under_a_cap_plans_its_references(references):
    """`--rows lora/auto/latent_text/cap79,lora/auto/latent_text/cap23 --references N` (the GPU call's
    edit rows): the rows parse and are kept on a GPU, each row's TOKENS_PER_STEP holds its references'
    tokens, and the catalog's fastest fit for the cap is picked and predicted under it (the plan's
    work only: no 5B step on the CPU)."""
    from kohakumoss.train.components import predicted_peak_gib

    ts = load_script()
    rows = "lora/auto/latent_text/cap79,lora/auto/latent_text/cap23"
    a = ts.parse_args(["--rows", rows, "--references", str(references)])
    assert ts.selected_rows(a) == rows.split(",")
    for name, cap in zip(rows.split(","), (79, 23)):
        child = ts.child_argv(a, name, "row.json")  # each row runs in its own process on the GPU
        assert child[child.index("--references") + 1] == str(references)
        assert ts.parse_args(child[2:]).references == references
        cfg = ts.row_config(a, ts.parse_row(name))
        assert cfg.data.tokens_per_step == 2 * (4096 + 256 + references * 4096)
        plan, why = row_plan(ts, a, name)
        assert why.startswith("auto: catalog entry") and f"fits {cap} GiB" in why, why
        assert predicted_peak_gib(cfg, plan) <= cap


def test_an_edit_row_sets_the_trainers_allocator_setting_and_prices_its_references(monkeypatch):
    """--references N > 0: main goes through the trainer's allocator function before any row (so the row
    subprocesses inherit it), and the row's config names references for the memory estimate."""
    from kohakumoss.memory.allocator import dataset_has_references

    ts = load_script()
    calls = []

    def stop(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr(ts, "allocator_for_references", lambda has: calls.append(has))
    monkeypatch.setattr(ts, "run_row", stop)
    for references in (1, 0):
        with pytest.raises(KeyboardInterrupt):
            ts.main(["--row", "lora/speed/latent_text", "--references", str(references)])
        a = ts.parse_args(["--references", str(references)])
        cfg = ts.row_config(a, ts.parse_row("lora/speed/latent_text"))
        assert dataset_has_references(cfg.data.dataset) == bool(references)
    assert calls == [True, False]

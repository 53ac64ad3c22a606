"""scripts/bench/user_runs.py: rows, the knobs it hands kogine, and what it reads back from a run folder."""

from __future__ import annotations

import json

import pytest

from .scripts import load_bench


@pytest.fixture(scope="module")
def ur():
    return load_bench("user_runs")


def args(ur, **over):
    """The script's options for a 5B row on the GPU, as its command line would give them."""
    base = dict(preset="moss-image-5b", device="cuda", size=1024, text_tokens=256, steps=20, rank=0, set=[],
                images=16, caption_words="3-40")  # fmt: skip
    return ur.argparse.Namespace(**{**base, **over})


@pytest.fixture(autouse=True)
def _h200(ur, monkeypatch):
    """The card present, as nvidia-smi would say on the H200 (no GPU here)."""
    monkeypatch.setattr(ur, "card_gb", lambda device: 139.8 if device.startswith("cuda") else 0.0)


def test_rows_parse_and_become_the_trainers_knobs(ur, tmp_path):
    row = ur.parse_row("card24/lora/4/fp8")
    assert (row.card_gb, row.adapter, row.images, row.online, row.fp8) == (24.0, "lora", 4, False, True)
    a = args(ur, set=["GC_EVERY=1"])
    k = ur.knobs(a, row, tmp_path)
    assert k["DATASET"]["path"] == str(tmp_path / "data-16x1024-3-40")  # one folder per dataset shape
    assert "GC_EVERY=1" in ur.kogine_argv(k)  # --set: every row's extra knob, handed over as given
    assert k["CARD_GB"] == 24.0 and k["BASE_PRECISION"] == "fp8" and k["TOKENS_PER_STEP"] == 4 * (4096 + 256)
    # the adapter `new train` writes for a 24 GB card: gpu/vram_24g under algo/lora, the schema's defaults
    assert (k["ALGO"], k["RANK"], k["ALPHA"], k["LR"]) == ("lora", 32, 32.0, 1e-4)
    assert "TARGET_PRESET" not in k and "BYPASS" not in k  # the trainer's defaults: attn-mlp, 'auto'
    argv = ur.kogine_argv(k)
    assert "ALGO=lora" in argv and "CARD_GB=24.0" in argv  # strings bare, the rest as literals
    online = ur.knobs(a, ur.parse_row("whole/full/2/online"), tmp_path)
    assert online["CARD_GB"] == 0.0 and online["VAE_ENCODE"] == "online" and online["LR"] == 1e-5
    # encoders online: the real architectures with random weights; cached rows keep the free stand-ins
    assert online["TEXT_ENCODER"] == online["VAE"] == "random" and online["TEXT_ENCODE"] == "online"
    assert k["TEXT_ENCODER"] == k["VAE"] == "synthetic"
    for bad in ("card24/lora", "gpu24/lora/2", "card24/lora/2/turbo", "card24/dora/2", "whole/full/2/legacy",
                "card24/lora/2/legacy/merged"):  # fmt: skip
        with pytest.raises(SystemExit):
            ur.parse_row(bad)


def test_the_whole_card_takes_its_layer_and_a_forward_part_its_adapter(ur, tmp_path):
    """`whole` is the card present's layer (the H200: vram_80g, rank 64); `legacy` is the adapter these rows
    ran before (r32 on every DiT linear, BYPASS=True), `bypass` / `merged` the shipped one's forwards."""
    a = args(ur)
    whole = ur.knobs(a, ur.parse_row("whole/lora/2"), tmp_path)
    assert (whole["RANK"], whole["ALPHA"], whole["CARD_GB"]) == (64, 64.0, 0.0)
    legacy = ur.knobs(a, ur.parse_row("whole/lora/2/legacy"), tmp_path)
    assert (legacy["RANK"], legacy["ALPHA"], legacy["TARGET_PRESET"], legacy["BYPASS"]) == (
        32,
        32.0,
        "full",
        True,
    )
    merged = ur.knobs(a, ur.parse_row("card24/lora/2/merged"), tmp_path)
    assert (merged["RANK"], merged["BYPASS"], "TARGET_PRESET" in merged) == (32, False, False)
    assert ur.knobs(a, ur.parse_row("card24/lora/2/bypass"), tmp_path)["BYPASS"] is True
    assert ur.knobs(args(ur, rank=16), ur.parse_row("whole/lora/2"), tmp_path)["RANK"] == 16  # --rank
    assert ur.knobs(args(ur, device="cpu"), ur.parse_row("whole/lora/2"), tmp_path)["RANK"] == 16  # vram_6g
    small = ur.knobs(a, ur.parse_row("card6/lora/1"), tmp_path)  # its layer asks for the offline caches
    assert "VAE_ENCODE" not in small and "TEXT_ENCODE" not in small  # the row fills them before step 1
    assert ur.GROUPS["fastpath"].split(",") == [
        "card24/lora/2", "card24/lora/2/legacy", "whole/lora/2", "whole/lora/2/legacy"
    ]  # fmt: skip
    bench = {"rows": [{"row": "lora/speed/latent_text", "tokens_per_s": 2000.0},
                      {"row": "lora/speed/latent_text/legacy", "tokens_per_s": 1000.0}]}  # fmt: skip
    speed = {"plan": "profile 'speed'", "tokens_per_s": 990.0}
    assert ur.bench_ratio({**speed, "row": "whole/lora/2/legacy"}, bench) == pytest.approx(0.99)
    assert ur.bench_ratio({**speed, "row": "whole/lora/2"}, bench) == pytest.approx(0.495)


def test_a_run_folder_reads_back_as_a_row(ur, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    steps = [
        dict(
            step=s,
            tokens_per_s=1000.0 + s,
            step_s=0.5,
            tokens=8200 + s,
            peak_mem_gib=10.0 + s / 10,
            peak_reserved_gib=11.0 + s,
        )
        for s in range(1, 9)
    ]
    steps[0]["step_s"] = 42.0
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(m) for m in steps))
    (run / "log.txt").write_text(
        "memory plan: auto: catalog entry c0250, no ckpt; predicted peak 12.3 GiB\n"
        "kernel prewarm: timed 48 new shape keys and 12 launch configs in 61 s; kept in x.json (later runs reuse them)\n"
    )
    got = ur.read_run(run, warmup=4)
    assert got["steps"] == 8 and got["tokens_per_s"] == 1006.5  # median of steps 5..8
    assert got["tokens_per_step"] == 8206.5
    assert (
        got["peak_gib"] == pytest.approx(10.8) and got["reserved_gib"] == 19.0 and got["first_step_s"] == 42.0
    )
    assert (
        got["predicted_gib"] == 12.3
        and got["prewarm"] == "48 keys, 12 launch configs, 61 s"
        and got["stopped"] is None
    )
    bench = {"rows": [{"row": "lora/speed/latent_text", "tokens_per_s": 2000.0, "step_s": 0.48}]}
    assert ur.bench_ratio({"row": "whole/lora/2", "tokens_per_s": 1940.0}, bench) == pytest.approx(0.97)
    # fewer tokens per step, the same step time: 0.95 in tokens/s, 1.00 in s/step
    same_step = {"row": "whole/lora/2", "tokens_per_s": 1900.0, "step_s": 0.48}
    assert ur.bench_step_ratio(same_step, bench) == pytest.approx(1.0)
    assert ur.bench_step_ratio({"row": "card24/lora/2", "step_s": 0.4}, bench) is None
    assert "1.00" in ur.table([{**same_step, "completed": True, "steps": 8, "bench_step_ratio": 1.0}])[1]
    assert ur.bench_ratio({"row": "card24/lora/2", "tokens_per_s": 1940.0}, bench) is None


def test_a_named_profile_is_the_runs_plan_and_picks_its_benchmark_row(ur, tmp_path):
    a = args(ur)
    row = ur.parse_row("whole/lora/2/low_vram")
    assert row.profile == "low_vram" and ur.knobs(a, row, tmp_path)["MEMORY_PROFILE"] == "low_vram"
    assert ur.knobs(a, ur.parse_row("whole/lora/2"), tmp_path)["MEMORY_PROFILE"] == "auto"  # the layer's
    with pytest.raises(SystemExit):
        ur.parse_row("whole/lora/2/speed/minimal")
    bench = {
        "rows": [
            {"row": "lora/speed/latent_text", "tokens_per_s": 2000.0},
            {"row": "lora/low_vram/latent_text", "tokens_per_s": 1000.0},
            {"row": "full/balanced/latent_text", "tokens_per_s": 500.0},
        ]
    }
    assert ur.bench_ratio({"row": "whole/lora/2/low_vram", "tokens_per_s": 990.0}, bench) == pytest.approx(
        0.99
    )
    # 'auto' compares with the profile it picked, as the log names it
    picked = {
        "row": "whole/full/2",
        "tokens_per_s": 450.0,
        "plan": "auto: catalog entry c0007 (profile 'balanced')",
    }
    assert ur.bench_ratio(picked, bench) == pytest.approx(0.9)
    assert ur.bench_ratio({"row": "whole/lora/4/low_vram", "tokens_per_s": 990.0}, bench) is None  # 4 images
    assert [r.name for r in map(ur.parse_row, ur.GROUPS["profiles"].split(","))][-1] == "whole/full/2/speed"


def test_a_row_runs_the_trainer_again_over_the_same_work_folder(ur, tmp_path):
    """The trainer through kogine, tiny preset on the CPU, twice over one work folder (a machine kept warm
    between calls): each time a fresh run completes, and --set reaches the trainer (PROFILE_STEPS)."""
    out = tmp_path / "rows.json"
    argv = ["--preset", "tiny", "--device", "cpu", "--rows", "whole/lora/1", "--steps", "2", "--warmup", "0",
            "--images", "2", "--work", str(tmp_path / "work"), "--out", str(out), "--row-timeout", "300",
            "--set", "PROFILE_STEPS=[2,2]", "--caption-words", "5"]  # fmt: skip
    for _ in range(2):
        ur.main(argv)
        (row,) = json.loads(out.read_text())["rows"]
        assert row["completed"] and row["steps"] == 2, row
    run = tmp_path / "work" / "runs" / "whole-lora-1"
    assert (run / "profile" / "kernels.txt").exists() and (run / "metrics.jsonl").exists()
    assert not (run / "checkpoints").exists() and not (run / "export").exists()  # the next row's disk
    captions = sorted((tmp_path / "work" / "data-2x128-5" / "1_smoke").glob("*.txt"))
    assert len(captions) == 2 and all(len(c.read_text().split()) == 5 for c in captions)  # one length


def test_an_engine_row_runs_on_several_gpus_and_scales_against_its_one_gpu_row(ur, tmp_path):
    row = ur.parse_row("whole/lora/2/speed/ddp2")
    assert (row.engine, row.gpus, row.profile) == ("ddp", 2, "speed")
    k = ur.knobs(args(ur), row, tmp_path)
    # images per GPU: the whole step holds both ranks' tokens
    assert k["DISTRIBUTED"] == "ddp" and k["DEVICES"] == 2 and k["TOKENS_PER_STEP"] == 2 * 2 * (4096 + 256)
    assert ur.knobs(args(ur, device="cpu"), row, tmp_path)["DEVICES"] == ["cpu", "cpu"]
    assert "DISTRIBUTED" not in ur.knobs(args(ur), ur.parse_row("whole/lora/2/speed"), tmp_path)
    assert ur.single_gpu_row("whole/full/2/fsdp2") == "whole/full/2"
    for bad in ("whole/lora/2/ddp1", "whole/lora/2/ddp2/fsdp2", "whole/lora/2/zero2"):
        with pytest.raises(SystemExit):
            ur.parse_row(bad)
    results = [
        {"row": "whole/lora/2/speed/ddp2", "tokens_per_s": 1900.0},
        {"row": "whole/lora/2/speed", "tokens_per_s": 1000.0},
        {"row": "whole/full/2/fsdp2", "tokens_per_s": 900.0},  # its one-GPU row did not run
    ]
    assert ur.scaling(results[0], results) == pytest.approx(0.95)
    assert ur.scaling(results[1], results) is None and ur.scaling(results[2], results) is None
    assert (
        ur.bench_ratio(results[0], {"rows": [{"row": "lora/speed/latent_text", "tokens_per_s": 1.0}]}) is None
    )
    assert [ur.parse_row(n).gpus for n in ur.GROUPS["scaling"].split(",")].count(2) >= 4


def test_a_ddp_row_runs_the_trainer_on_two_cpu_ranks(ur, tmp_path):
    """The row's DISTRIBUTED and DEVICES reach the trainer: two CPU ranks (gloo) train the tiny preset,
    each rank's peak in the run's metrics, and the scaling column against the one-process row."""
    out = tmp_path / "rows.json"
    argv = ["--preset", "tiny", "--device", "cpu", "--rows", "whole/lora/1,whole/lora/1/ddp2", "--steps", "2",
            "--warmup", "0", "--images", "2", "--work", str(tmp_path / "work"), "--out", str(out),
            "--row-timeout", "300", "--caption-words", "5", "--set", "DIST_TIMEOUT=120"]  # fmt: skip
    ur.main(argv)
    one, two = json.loads(out.read_text())["rows"]
    assert one["completed"] and two["completed"], (one, two)
    assert two["scaling"] is not None and one["scaling"] is None
    assert two["tokens_per_step"] == 2 * one["tokens_per_step"]
    metrics = (tmp_path / "work" / "runs" / "whole-lora-1-ddp2" / "metrics.jsonl").read_text().splitlines()
    assert len(json.loads(metrics[-1])["peak_mem_gib_ranks"]) == 2


def test_first_step_phases_start_from_the_caches_they_name(ur, tmp_path, monkeypatch):
    """cold: an empty cache; warm: the cold one as it was left; shipped: a fresh one with only the cold
    run's tuning table. A phase's compilers write into its own cache; without phases, rows share theirs."""
    a = args(ur, seed_cache=None, empty_table=False)
    row = ur.parse_row("card24/lora/2")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "parent-triton"))  # e.g. the caller's own
    cold = ur.phase_cache(a, row, tmp_path, "cold")
    assert not cold.exists()
    (cold / "tuning").mkdir(parents=True)
    (cold / "tuning" / "GPU.json").write_text("{}")
    (cold / "tuning" / "GPU.json.lock").write_text("")
    (cold / "lycoris" / "kernels").mkdir(parents=True)
    (cold / "lycoris" / "kernels" / "sm90-gpu.json").write_text("{}")
    (cold / "triton").mkdir()
    assert ur.phase_cache(a, row, tmp_path, "warm") == cold
    shipped = ur.phase_cache(a, row, tmp_path, "shipped")
    assert shipped != cold
    assert sorted(str(p.relative_to(shipped)) for p in shipped.rglob("*.json")) == [
        "lycoris/kernels/sm90-gpu.json",
        "tuning/GPU.json",
    ]  # the tables, no compiled kernel, no lock
    assert not (shipped / "triton").exists() and not (shipped / "tuning" / "GPU.json.lock").exists()
    env = ur.row_env(a, cold, tmp_path, "cold")
    assert env["KOHAKUMOSS_CACHE"] == str(cold) and "TRITON_CACHE_DIR" not in env  # the run sets its own
    assert env["LYCORIS_KERNEL_CACHE_DIR"] == str(cold / "lycoris")
    assert ur.row_env(a, cold, tmp_path, None)["TRITON_CACHE_DIR"] == str(tmp_path / "compiled" / "triton")
    assert (
        ur.row_env(args(ur, seed_cache=None, empty_table=True), cold, tmp_path, "cold")[
            "KOHAKUMOSS_SHIPPED_TABLES"
        ]
        == "0"
    )
    assert ur.knobs(a, row, tmp_path, "warm")["RUN_NAME"] == "card24-lora-2-warm"
    run = tmp_path / "run"
    run.mkdir()
    (run / "log.txt").write_text("first micro-step: Triton compiled 120 kernels in 47 s of its 80 s\n")
    got = ur.read_run(run, warmup=1)
    assert (got["triton_compiles"], got["triton_compile_s"]) == (120, 47.0)
    lines = ur.first_step_table(
        [{**got, "row": row.name, "phase": "cold", "completed": True, "wall_s": 99.0}]
    )
    assert "cold" in lines[1] and "120" in lines[1]


def test_first_step_runs_each_phase_as_its_own_process(ur, tmp_path):
    """The tiny preset on the CPU: cold and warm each complete as a run of its own (the warm one over the
    cache the cold one left), each phase with its own logs."""
    out = tmp_path / "rows.json"
    argv = ["--preset", "tiny", "--device", "cpu", "--rows", "whole/lora/1", "--steps", "1", "--warmup", "0",
            "--images", "2", "--work", str(tmp_path / "work"), "--out", str(out), "--row-timeout", "300",
            "--caption-words", "5", "--first-step", "--phases", "warm,cold", "--logs", str(tmp_path / "logs")]  # fmt: skip
    ur.main(argv)
    rows = json.loads(out.read_text())["rows"]
    assert [(r["row"], r["phase"], r["completed"]) for r in rows] == [
        ("whole/lora/1", p, True)
        for p in ("cold", "warm")  # in PHASES' order, whatever --phases says
    ]
    assert all(r["first_step_s"] > 0 for r in rows)
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["whole-lora-1-cold", "whole-lora-1-warm"]
    with pytest.raises(SystemExit):
        ur.main([*argv, "--phases", "cold,lukewarm"])


def test_int8_base_rows_load_the_convrot_file_beside_the_bf16_file_of_the_same_weights(ur, tmp_path):
    names = ur.GROUPS["int8_base"].split(",")
    rows = [ur.parse_row(n) for n in names]
    assert {r.card_gb for r in rows} == {0.0, 24.0, 16.0, 12.0}
    assert {(r.weights, r.base) for r in rows} == {
        ("bf16file", ""),
        ("convrot", "int8"),
        ("convrot", "int8_weight"),
    }
    a = args(ur)
    a.weights_dir = str(tmp_path / "weights")
    int8 = ur.knobs(a, ur.parse_row("card16/lora/2/convrot/int8"), tmp_path)
    bf16 = ur.knobs(a, ur.parse_row("card16/lora/2/bf16file"), tmp_path)
    weights = tmp_path / "weights" / "moss-image-5b"
    assert int8["WEIGHTS"] == str(weights / "moss_image_base_int8_convrot.safetensors")
    assert bf16["WEIGHTS"] == str(weights / "moss_image_base_bf16.safetensors")
    assert int8["MODEL_PRESET"] == bf16["MODEL_PRESET"] == "" and int8["BASE_PRECISION"] == "int8"
    assert "BASE_PRECISION" not in bf16 and int8["CARD_GB"] == 16.0
    assert ur.bench_row(ur.parse_row("whole/lora/2/bf16file"), None) is None  # train_step.py has no such row
    for bad in ("whole/lora/2/int8", "whole/full/2/convrot/int8", "whole/lora/2/convrot/bf16file",
                "whole/lora/2/convrot/int8/int8_weight"):  # fmt: skip
        with pytest.raises(SystemExit):
            ur.parse_row(bad)


def test_an_int8_base_row_trains_from_the_convrot_file_it_wrote(ur, tmp_path):
    """write_weights.py writes the tiny preset's ConvRot file once; the trainer loads it with its int8
    bytes kept (BASE_PRECISION int8_weight, which runs on the CPU) and logs so."""
    out = tmp_path / "rows.json"
    argv = ["--preset", "tiny", "--device", "cpu", "--rows", "whole/lora/1/convrot/int8_weight", "--steps", "2",
            "--warmup", "0", "--images", "2", "--work", str(tmp_path / "work"), "--out", str(out),
            "--row-timeout", "300", "--caption-words", "5", "--logs", str(tmp_path / "logs"),
            "--weights-dir", str(tmp_path / "weights")]  # fmt: skip
    ur.main(argv)
    (row,) = json.loads(out.read_text())["rows"]
    assert row["completed"] and row["steps"] == 2, row
    assert (tmp_path / "weights" / "tiny" / "moss_image_base_int8_convrot.safetensors").exists()
    assert not (tmp_path / "weights" / "tiny" / "moss_image_base_bf16.safetensors").exists()  # not asked
    log = (tmp_path / "logs" / "whole-lora-1-convrot-int8_weight" / "log.txt").read_text()
    assert "BASE_PRECISION int8_weight" in log and "moss_image_base_int8_convrot" in log

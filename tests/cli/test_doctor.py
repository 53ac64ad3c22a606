"""kohakumoss-doctor on faked machines: each missing piece is named with its fix; blocking -> exit 1."""

from __future__ import annotations

from kohakumoss.cli.doctor import DISTRIBUTIONS, Environment, main, report, run_checks


def healthy(**overrides) -> Environment:
    env = Environment(
        python=(3, 12, 1),
        packages={d: "1.0" for d in DISTRIBUTIONS} | {"torch": "2.14.1+cu130"},
        torch_cuda="13.0",
        gpus=[{"name": "NVIDIA GeForce RTX 4090", "capability": (8, 9), "memory": 24 << 30}],
        driver="580.1",
        driver_cuda="13.0",
        nvidia_smi=True,
        host_ram=64 << 30,
        free_disk=500 << 30,
        qwen3_5=True,
        flux2_vae=True,
    )
    for k, v in overrides.items():
        setattr(env, k, v)
    return env


def test_healthy_machine_is_ready():
    text, code = report(run_checks(healthy()))
    assert code == 0 and "ready to train" in text and "sm89" in text and "fp8 compute available" in text
    assert "layer vram_24g, LoRA on moss-image-5b: MEMORY_PROFILE 'auto' picks c" in text


def test_memory_plan_follows_the_card():
    small = report(run_checks(healthy(gpus=[{"name": "RTX 3050", "capability": (8, 6), "memory": 8 << 30}])))[
        0
    ]
    big = report(run_checks(healthy(gpus=[{"name": "H200", "capability": (9, 0), "memory": 141 << 30}])))[0]
    assert "layer vram_8g" in small and "stream" in small.split("memory plan")[1].splitlines()[0]
    assert "layer vram_80g" in big and "picks c0000 (no ckpt, opt gpu)" in big


def test_missing_lycoris_blocks_with_fix():
    env = healthy(packages={d: "1.0" for d in DISTRIBUTIONS} | {"torch": "2.14.1", "lycoris-lora": None})
    text, code = report(run_checks(env))
    assert code == 1 and 'pip install "lycoris-lora"' in text and "blocked by: lycoris-lora" in text


def test_cpu_torch_on_gpu_machine_names_the_index():
    env = healthy(gpus=[], torch_cuda=None, driver_cuda="12.8")
    text, code = report(run_checks(env))
    assert "whl/cu128" in text and "torch does not" in text and code == 0


def test_old_driver_and_old_python_block():
    text, code = report(run_checks(healthy(driver_cuda="12.2", python=(3, 9, 0))))
    assert code == 1 and "CUDA 12.6 or newer" in text and "Python 3.12" in text


def test_turing_card_wants_tilelang():
    env = healthy(gpus=[{"name": "RTX 2080 Ti", "capability": (7, 5), "memory": 11 << 30}])
    env.packages["tilelang"] = None
    text, _ = report(run_checks(env))
    assert "no bf16" in text and "pip install tilelang" in text


def test_real_machine_runs(capsys):
    assert main() in (0, 1)
    assert "python" in capsys.readouterr().out

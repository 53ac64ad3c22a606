"""`kohakumoss-config check` refuses what the trainer would refuse at setup, in the trainer's words."""

from __future__ import annotations

from kohakumoss.cli.config_check import check_config


def write(tmp_path, kohya_dir, body: str):
    cfg = tmp_path / "cfg.py"
    cfg.write_text(f"DATASET = {{'kind': 'kohya', 'path': {str(kohya_dir)!r}}}\nDEVICE = 'cpu'\n{body}")
    return cfg


def test_a_config_without_weights_is_refused(kohya_dir, tmp_path):
    res = check_config(write(tmp_path, kohya_dir, "MODEL_PRESET = ''\n"), kind="train")
    assert ("WEIGHTS", "set WEIGHTS to a DiT checkpoint (or MODEL_PRESET for random weights)") in res.problems
    assert not res.text().endswith("ok")


def test_setup_refusals_are_named(kohya_dir, tmp_path):
    body = "MODEL_PRESET = 'tiny'\nPRECISION = 'fp16'\nRESUME = '/no/such/run/checkpoints/step_00000010'\n"
    res = check_config(write(tmp_path, kohya_dir, body), kind="train")
    problems = dict(res.problems)
    assert problems["PRECISION"] == "fp16 needs a GPU; use bf16 or fp32 on the CPU"
    assert problems["RESUME"] == "no checkpoint at '/no/such/run/checkpoints/step_00000010'"
    assert "WEIGHTS" not in problems


def test_a_config_the_trainer_takes_passes(kohya_dir, tmp_path):
    res = check_config(write(tmp_path, kohya_dir, "MODEL_PRESET = 'tiny'\nRESUME = 'latest'\n"), kind="train")
    assert res.problems == [], res.text()

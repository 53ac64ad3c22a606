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
    body = "MODEL_PRESET = 'tiny'\nRESUME = 'latest'\nTEXT_ENCODER = 'synthetic'\nVAE = 'synthetic'\n"
    res = check_config(write(tmp_path, kohya_dir, body), kind="train")
    assert res.problems == [], res.text()


def test_check_refuses_what_the_trainer_refuses_before_loading(kohya_dir, tmp_path):
    """Empty encoders (the trainer once raised AttributeError after the checks said ok), ALGO_ARGS the
    algorithm ignores and a RANK wider than a targeted layer: one list, kohakumoss-config check and the
    trainer's (train/preflight.run_problems) alike, in the same words."""
    from kohakumoss.config.train import TRAIN_SCHEMA, TrainConfig
    from kohakumoss.train.preflight import run_problems

    body = "MODEL_PRESET = 'tiny'\nALGO = 'lora'\nALGO_ARGS = {'factor': 4}\nRANK = 300\n"
    res = check_config(write(tmp_path, kohya_dir, body), kind="train")
    problems = dict(res.problems)
    assert problems["TEXT_ENCODER"].startswith("training needs TEXT_ENCODER") and "VAE" in problems
    assert "does not use ['factor']" in problems["ALGO_ARGS"] and "lokr" in problems["ALGO_ARGS"]
    assert "narrowest targeted layer" in problems["RANK"] and "RANK <= 256" in problems["RANK"]
    knobs = TRAIN_SCHEMA.validate(
        {
            "MODEL_PRESET": "tiny",
            "ALGO_ARGS": {"factor": 4},
            "RANK": 300,
            "DATASET": [{"kind": "kohya", "path": str(kohya_dir)}],
        }
    )
    trainer = dict(run_problems(TrainConfig.from_knobs(knobs)))
    assert {k: trainer[k] for k in ("TEXT_ENCODER", "VAE", "ALGO_ARGS", "RANK")} == {
        k: problems[k] for k in ("TEXT_ENCODER", "VAE", "ALGO_ARGS", "RANK")
    }

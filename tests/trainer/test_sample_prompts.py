"""A tiny run's sample grid from SAMPLE_PROMPTS_FILE: one column per line, each at its own size."""

from __future__ import annotations

from PIL import Image

from kohakumoss.train.loop import train

from .conftest import tiny_knobs


def test_trainer_draws_the_prompt_files_lines(train_world, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(
        "# the grid\nblue glass hexagons --w 48 --h 32 --d 3\n\ngolden square grid --s 3 --l 1\n"
    )
    run = train(tiny_knobs(train_world, "prompt-file", STEPS=1, SAMPLE_PROMPTS_FILE=str(prompts)))
    base = sorted((run / "samples" / "base").glob("base_*.png"))
    assert [Image.open(p).size for p in base] == [(48, 32), (32, 32)]
    assert (run / "samples" / "grid_step_00000001.png").exists()

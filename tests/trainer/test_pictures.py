"""The pictures people read: loss.png's axes and curves, grids at true relative sizes with whole captions,
the trainer's timeline grid and the prompt metadata of every sample PNG."""

from __future__ import annotations

import json

from PIL import Image

from kohakumoss.diffusion.grid import grid
from kohakumoss.train.logbook import loss_figure
from kohakumoss.train.loop import train

from .conftest import tiny_knobs


def test_loss_figure_has_axes_validation_and_lr():
    records = [{"step": s, "loss": 1.0 / s, "lr": 1e-4 * min(1.0, s / 3)} for s in range(1, 11)]
    records[4]["val_loss"], records[9]["val_loss"] = 0.3, 0.2
    fig = loss_figure(records)
    ax, lr_ax = fig.axes
    assert (ax.get_xlabel(), ax.get_ylabel(), lr_ax.get_ylabel()) == ("step", "loss", "LR")
    labels = [line.get_label() for line in ax.get_lines()]
    assert "validation loss" in labels and len(ax.get_xticks()) > 2
    val = next(line for line in ax.get_lines() if line.get_label() == "validation loss")
    assert list(val.get_xdata()) == [5, 10] and list(lr_ax.get_lines()[0].get_ydata())[-1] == 1e-4


def test_grid_keeps_relative_sizes_and_whole_captions():
    square, tall = Image.new("RGB", (64, 64), "red"), Image.new("RGB", (64, 128), "blue")
    caption = "a lighthouse on a cliff at dusk, watercolor, soft light, seen from the sea at low tide"
    image = grid([("base", [square, tall])], [caption, "tall"], cell=128)
    # one scale for all: both 128 px wide, the tall one twice as high (it was drawn larger, not scaled down)
    label_w = image.width - 256
    column = [image.getpixel((label_w + 140, y)) for y in range(image.height)]
    assert column.count((0, 0, 255)) == 256
    assert [image.getpixel((label_w + 10, y)) for y in range(image.height)].count((255, 0, 0)) == 128
    header = image.height - 256  # the caption is wrapped, not cut: several lines above the images
    assert header > 4 * 13


def test_training_samples_carry_their_settings_and_a_timeline(train_world):
    run = train(
        tiny_knobs(
            train_world, "pictures", STEPS=4, SAMPLE_EVERY=2, SAMPLE_PROMPTS=["a red bird --d 7 --l 2.5"]
        )
    )
    for png in (
        run / "samples" / "base" / "base_00.png",
        run / "samples" / "step_00000004" / "sample_00.png",
    ):
        text = Image.open(png).text
        settings = json.loads(text["kohakumoss"])
        assert text["prompt"] == "a red bird" and (settings["seed"], settings["cfg"]) == (7, 2.5)
        assert settings["steps"] == 2 and "Seed: 7" in text["parameters"]
    timeline = Image.open(run / "samples" / "timeline.png")
    step_grid = Image.open(run / "samples" / "grid_step_00000004.png")
    assert timeline.height > step_grid.height  # base, step 2 and step 4 rows: one more than the grid
    assert (run / "loss.png").exists()

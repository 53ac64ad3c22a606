"""An edit (reference-image) run end to end: kohya targets with a references folder, the tiny model,
the trainer; the batch's references reach the model, the loss covers the target tokens, resume is exact."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from PIL import Image, ImageOps

from kohakumoss.encoders.tiny import write_tiny_text_encoder
from kohakumoss.train.loop import train
from kohakumoss_common.errors import ConfigError

from .conftest import SIZE, tiny_knobs
from .test_loop import losses


@pytest.fixture(scope="module")
def edit_world(train_world, tmp_path_factory) -> dict:
    """The training world's pictures as targets, each with its mirror image as the reference (one of
    them with a second, smaller reference); the tiny text encoder with a vision tower, so the references
    go into the prompt too (REFERENCES_IN_PROMPT's default)."""
    root = tmp_path_factory.mktemp("edit")
    data, refs = root / "data", root / "refs" / "2_style"
    shutil.copytree(Path(train_world["DATASET"]["path"]), data)
    refs.mkdir(parents=True)
    for i, target in enumerate(sorted((data / "2_style").glob("*.png"))):
        im = Image.open(target)
        ImageOps.mirror(im).save(refs / target.name)
        if i == 0:
            im.resize((SIZE // 2, SIZE)).save(refs / f"{target.stem}_1.png")
    captions = [p.read_text() for p in sorted((data / "2_style").glob("*.txt"))]
    text = write_tiny_text_encoder(root / "text", captions, vision=True)
    return {
        **train_world,
        "DATASET": {"kind": "kohya", "path": str(data), "references": str(refs.parent)},
        "TEXT_ENCODER": text.path,
        "TOKENIZER": text.tokenizer_path,
    }


TEXT_LENS: list[tuple[int, ...]] = []  # the straight run's text tokens per sample, per step
IMAGE_TOKENS: list[int] = []  # the straight run's target tokens, per step


def edit_knobs(world: dict, name: str, **overrides) -> dict:
    # two targets of 16 tokens, up to 24 reference tokens each, the captions
    return tiny_knobs(world, name, STEPS=4, TOKENS_PER_STEP=2 * (3 * SIZE * SIZE // 256 + 16), **overrides)


@pytest.fixture(scope="module")
def straight(edit_world) -> tuple[Path, list]:
    """The plain edit run, and what each step's loss saw: (ref_sizes, refs' shape)."""
    from kohakumoss.train import trainer

    real, seen = trainer.flow_loss, []

    def spy(model, batch, *args, **kwargs):
        seen.append((batch.seq.ref_sizes, None if batch.refs is None else tuple(batch.refs.shape)))
        TEXT_LENS.append(batch.seq.text_lens)
        IMAGE_TOKENS.append(sum(batch.seq.img_lens))
        return real(model, batch, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trainer, "flow_loss", spy)
        run = train(edit_knobs(edit_world, "edit-straight", MEMORY_PROFILE="speed"))
    return run, seen


def test_edit_run_trains_on_references_and_resumes_exactly(edit_world, straight):
    straight, seen = straight
    assert len(seen) == 4 and all(refs is not None for _, refs in seen)
    assert all(all(len(r) >= 1 for r in sizes) for sizes, _ in seen)  # every sample brought its reference
    assert any(len(r) == 2 for sizes, _ in seen for r in sizes)  # the target with two, in order
    for sizes, shape in seen:
        assert shape == (sum(h * w for refs in sizes for h, w in refs), 128)
    train(edit_knobs(edit_world, "edit-halves", MEMORY_PROFILE="speed", STOP_AT=2))
    resumed = train(edit_knobs(edit_world, "edit-halves", MEMORY_PROFILE="speed", RESUME="latest"))
    assert len(losses(straight)) == 4
    assert losses(straight) == losses(resumed)  # bit for bit at every step


def test_the_metrics_count_the_reference_tokens_and_say_so(straight):
    """metrics.jsonl's `tokens` (what tokens/s divides) is every token of the step: targets, captions and
    references; `reference_tokens` is the references' share."""
    import json

    run, seen = straight
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == len(seen) == 4  # one micro-step per step, a record per step
    for i, (record, (sizes, _)) in enumerate(zip(records, seen, strict=True)):
        refs = sum(h * w for r in sizes for h, w in r)
        assert refs > 0 and record["reference_tokens"] == refs
        assert record["tokens"] == IMAGE_TOKENS[i] + sum(TEXT_LENS[i]) + refs


def test_the_text_encoder_saw_each_samples_references(edit_world, straight):
    """REFERENCES_IN_PROMPT='picture': every caption's prompt held `Picture N:` and its references'
    vision tokens, so each sample's text is its caption's prompt plus, per reference, 4 tokens
    ("picture", "n:", vision start and end) and the reference's vision tokens, cut at MAX_TEXT_TOKENS."""
    from kohakumoss.config.train import TrainConfig
    from kohakumoss.encoders import TextEncoder
    from kohakumoss.train.cache_identity import text_settings

    knobs = edit_knobs(edit_world, "lens")
    cap = knobs["MAX_TEXT_TOKENS"]  # the prompt is cut on the right there, references and all
    settings = text_settings(TrainConfig.from_knobs(knobs))
    assert settings.reference_prompt == "picture"
    encoder = TextEncoder.load(settings)
    data = Path(edit_world["DATASET"]["path"]) / "2_style"
    refs = Path(edit_world["DATASET"]["references"]) / "2_style"
    plain, want = set(), set()
    for target in sorted(data.glob("*.png")):
        n = len(encoder.prompts((data / f"{target.stem}.txt").read_text()))
        images = [Image.open(p) for p in sorted(refs.glob(f"{target.stem}*.png"))]
        _, _, counts = encoder.vision.prepare(images)
        plain.add(min(n, cap))
        want.add(min(n + sum(4 + c for c in counts), cap))
    _, seen = straight
    lens = [n for step in TEXT_LENS[: len(seen)] for n in step]
    assert lens and all(n in want and n not in plain for n in lens), (lens, want, plain)


@pytest.mark.parametrize(
    "profile, extra",
    [
        ("minimal", {}),
        ("low_vram", {"STREAM_BLOCKS": 3, "OPTIMIZER_PLACEMENT": "stream", "CHECKPOINTING": "full"}),
    ],
    ids=["minimal", "low_vram-streamed"],
)
def test_memory_profiles_train_the_same_edit_model(edit_world, straight, profile, extra):
    """Checkpointing, weight streaming and offload run the blocks on the edit layout: the plain run's losses."""
    run = train(edit_knobs(edit_world, f"edit-{profile}", MEMORY_PROFILE=profile, **extra))
    log = (run / "log.txt").read_text()
    assert f"memory plan: profile '{profile}'" in log and "weight streaming:" in log  # the engines ran
    for a, b in zip(losses(straight[0]), losses(run), strict=True):
        assert a == pytest.approx(b, rel=1e-5)


@pytest.mark.parametrize("engine", ["pipeline", "threaded"])
def test_pipeline_engines_refuse_an_edit_dataset_before_anything_loads(edit_world, monkeypatch, engine):
    from kohakumoss.config.train import TrainConfig
    from kohakumoss.train import trainer
    from kohakumoss.train.preflight import run_problems

    monkeypatch.setattr(trainer, "build_components", lambda *a, **k: pytest.fail("components were built"))
    with pytest.raises(ConfigError, match="DISTRIBUTED: the pipeline engines .* without reference images"):
        train(edit_knobs(edit_world, f"edit-{engine}", DISTRIBUTED=engine, DEVICES=["cpu", "cpu"]))
    plain = {**edit_knobs(edit_world, "plain"), "DISTRIBUTED": engine, "DEVICES": ["cpu", "cpu"]}
    plain["DATASET"] = {k: v for k, v in plain["DATASET"].items() if k != "references"}
    assert not [k for k, _ in run_problems(TrainConfig.from_knobs(plain)) if k == "DISTRIBUTED"]


def test_references_over_the_token_cap_refused_before_the_first_step(edit_world):
    """REFERENCES_IN_PROMPT='picture' with MAX_TEXT_TOKENS too small for the references' vision tokens:
    named per item before any step (the 64 px mirrors take 9 tokens up to their last vision token)."""
    with pytest.raises(
        ConfigError, match=r"MAX_TEXT_TOKENS: .*reference images take more prompt tokens than the 8"
    ):
        train(edit_knobs(edit_world, "edit-cap", MAX_TEXT_TOKENS=8))


def test_the_run_plans_the_prompt_tokens_its_references_take(edit_world):
    """REFERENCES_IN_PROMPT='picture': each planned item's text tokens (what TOKENS_PER_STEP packs) hold
    its references' `Picture N:` labels and vision tokens, as the encoder that shows them counts them."""
    import dataclasses

    from kohakumoss.config.train import TrainConfig
    from kohakumoss.encoders import TextEncoder
    from kohakumoss.train.cache_identity import text_settings
    from kohakumoss.train.data import open_run_data
    from kohakumoss_data.plan import text_tokens

    cfg = TrainConfig.from_knobs(
        {**edit_knobs(edit_world, "plan"), "MAX_TEXT_TOKENS": 64, "TOKENS_PER_STEP": 512}
    )
    encoder = TextEncoder.load(text_settings(cfg))
    data = open_run_data(cfg, None, encoder)
    sizes = {it.key: tuple((r["width"], r["height"]) for r in it.references) for it in data.catalog.usable}
    caption_only = dataclasses.replace(data.plan.knobs, reference_prompt_tokens=None)
    items = [it for step in data.plan.steps for it in step]
    assert items and all(len(sizes[it.key]) >= 1 for it in items)
    for it in items:
        shown = encoder.reference_prompt_tokens(sizes[it.key])
        assert shown >= 4 + 4 and it.text_tokens == text_tokens(it.caption, caption_only) + shown
    assert max(data.plan.step_tokens()) <= 512

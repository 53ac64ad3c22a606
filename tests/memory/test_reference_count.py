"""The estimate prices the most reference images any item of an edit dataset has, read from the scan the
trainer runs before it plans memory (the dataset's catalog cache); one per target before any scan."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

from kohakumoss.config.train import TrainConfig
from kohakumoss.memory import MemoryPlan, estimate_plan
from kohakumoss.memory.calibration import ASSUMED_REFERENCES
from kohakumoss.memory.estimate import reference_tokens, references_per_target
from kohakumoss.memory.profiles import rank_share
from kohakumoss.model.presets import get_preset
from kohakumoss.train.data import scan_dataset
from kohakumoss_data import PlanKnobs, build_plan

MOSS = get_preset("moss-image-5b")
KNOBS = {"TOKENS_PER_STEP": 4 * (2 * 4096 + 256), "AREA": 1024 * 1024, "MAX_TEXT_TOKENS": 256}


def png(seed: int) -> bytes:
    buf = io.BytesIO()
    pixels = np.random.default_rng(seed).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(buf, "PNG")
    return buf.getvalue()


def edit_dataset(root: Path, references: list[int]) -> dict:
    """A folder dataset of one 64 x 64 image per entry of `references`, each with that many references
    (`<stem>_<n>.png` in `refs/`); the DATASET entry, with no `references` option when none has any."""
    images, refs = root / "images", root / "refs"
    images.mkdir(parents=True)
    refs.mkdir()
    for i, count in enumerate(references):
        (images / f"img{i}.png").write_bytes(png(i))
        (images / f"img{i}.txt").write_text(f"caption {i}")
        for n in range(1, count + 1):
            (refs / f"img{i}_{n}.png").write_bytes(png(100 * i + n))
    spec = {"kind": "folder", "path": str(images)}
    return {**spec, "references": str(refs)} if any(references) else spec


def run_config(root: Path, references: list[int], **knobs) -> TrainConfig:
    dataset = edit_dataset(root, references)
    return TrainConfig.from_knobs(
        {**KNOBS, "DATASET": dataset, "CATALOG_DIR": str(root / "catalogs"), **knobs}
    )


def test_a_plan_whose_items_have_two_references_is_priced_as_two(tmp_path):
    """Before a scan the estimate assumes one reference per target; the trainer's scan (run before it plans
    memory) gives the most any item has, which is the most any item of the plan carries."""
    cfg = run_config(tmp_path, [2, 1, 2])
    assert references_per_target(cfg) == ASSUMED_REFERENCES == 1  # nothing scanned yet
    _, catalog = scan_dataset(cfg)
    plan = build_plan(catalog, 0, PlanKnobs(area=64 * 64, tokens_per_step=200))
    assert plan.most_references() == catalog.most_references == 2
    assert references_per_target(cfg) == 2
    image, text = 4096, 256
    assert reference_tokens(cfg) == KNOBS["TOKENS_PER_STEP"] * 2 * image / (3 * image + text)


def test_zero_one_and_two_references_per_target_predict_increasing_peaks(tmp_path):
    """The same step with 0, 1 and 2 references per target (scanned): the attention keeps more gathered
    keys and values, and a DDP rank's largest sample grows by a target's area per reference."""
    peaks, shares = [], []
    for count in (0, 1, 2):
        cfg = run_config(tmp_path / str(count), [count, count], DISTRIBUTED="ddp")
        scan_dataset(cfg)
        assert references_per_target(cfg) == count
        share, shards = rank_share(cfg, 2)
        shares.append(share.data.tokens_per_step)
        peaks.append(estimate_plan(MemoryPlan(checkpointing="mlp"), share, MOSS, shards=shards).total)
    assert peaks[0] < peaks[1] < peaks[2], peaks
    assert shares[1] - shares[0] == shares[2] - shares[1] == 4096 // 2  # (1 - 1/2) of a target's area


def test_a_mixed_list_prices_its_edit_entry(tmp_path):
    """A text-to-image entry beside an edit entry with two references per target: priced as two."""
    t2i = edit_dataset(tmp_path / "t2i", [0, 0])
    edit = edit_dataset(tmp_path / "edit", [2])
    cfg = TrainConfig.from_knobs({**KNOBS, "DATASET": [t2i, edit], "CATALOG_DIR": str(tmp_path / "catalogs")})
    scan_dataset(cfg)
    assert references_per_target(cfg) == 2


def test_config_check_says_what_it_priced(tmp_path):
    """`kohakumoss-config check` names the count it priced and where it came from."""
    from kohakumoss.cli.config_check import _references_note

    cfg = run_config(tmp_path, [2, 2])
    assert "1 reference image per target assumed (no scan of the dataset yet)" in _references_note(cfg)
    scan_dataset(cfg)
    assert _references_note(cfg) == "memory estimate: 2 reference image(s) per target (the dataset's scan)"
    assert _references_note(TrainConfig.from_knobs(KNOBS)) is None

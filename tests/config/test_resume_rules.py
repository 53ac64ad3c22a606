"""The resume rule of a training knob is an argument of its declaration, `knob(..., resume=...)`: resume's
RESUME_FIXED / RESUME_SAFE / LENGTH_KNOBS are derived from those, and a knob without a rule fails here."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from kohakumoss.config.train import (
    LENGTH_KNOBS,
    RESUME_FIXED,
    RESUME_SAFE,
    TRAIN_KNOBS,
    TrainConfig,
    allow_changes_problem,
)
from kohakumoss.data_knobs import PLAN_KNOBS, SCAN_KNOBS
from kohakumoss_common.typed_config import RESUME_RULES, UNDECLARED, knob, resume_knobs, resume_rules

# the hand-kept lists of config/rules.py before the rules moved onto knob(), as they were
HAND_FIXED = {
    "MODEL_PRESET", "TEXT_TEMPLATE", "TEXT_LAYERS", "TEXT_ENCODER_QUANT", "REFERENCES_IN_PROMPT",
    "ENCODER_PRECISION", "PRECISION", "BASE_PRECISION", "ALGO", "RANK", "ALPHA", "ALGO_ARGS",
    "TARGET_PRESET", "TARGET_PATTERNS", "BYPASS", "USE_MUON", "DATASET", "BUCKETS", "MAX_PIXELS",
    "MIN_SIDE", "MISSING_CAPTION", "AREA", "MULTIPLE", "MIN_ASPECT", "MAX_ASPECT", "NO_UPSCALE", "CROP",
    "TOKENS_PER_STEP", "MAX_TEXT_TOKENS", "CHARS_PER_TOKEN", "FLIP_PROB", "CAPTION_DROPOUT",
    "SHUFFLE_CAPTION", "KEEP_TOKENS", "CAPTION_SEPARATOR", "TAG_DROPOUT", "CAPTION_FORMAT", "SHUFFLE",
    "DROP_LAST", "VAL_ITEMS", "GRAD_ACCUM", "SEED", "EMA", "TIMESTEP_SAMPLING", "LOGIT_MEAN", "LOGIT_STD",
    "TIMESTEP_SHIFT", "STATIC_SHIFT", "LOSS_WEIGHTING", "LOSS_REDUCTION", "MODE_SCALE", "MIN_SNR_GAMMA",
    "LOSS_TYPE", "HUBER_C", "OPTIMIZER",
}  # fmt: skip
HAND_SAFE = {
    "WEIGHTS", "TEXT_ENCODER", "TOKENIZER", "VAE", "DROPOUT", "RANK_DROPOUT", "MODULE_DROPOUT",
    "LORA_PLUS_RATIO", "LR", "MUON_LR", "WEIGHT_DECAY", "OPTIMIZER_ARGS", "LR_SCHEDULE", "LR_WARMUP_STEPS",
    "LR_MIN_RATIO", "LR_CYCLES", "LR_POWER", "STEPS", "EPOCHS", "GRAD_CLIP", "EMA_DECAY", "EMA_WARMUP",
    "EMA_EVERY",
}  # fmt: skip
HAND_LENGTH = ("STEPS", "EPOCHS")
# plan settings the hand list took from data_knobs' tables though no training knob sets them: absent from a
# run's knobs and its checkpoint's, so resume never compared them
NOT_TRAINING_KNOBS = {"MULTIPLE", "CHARS_PER_TOKEN", "CAPTION_SEPARATOR", "SHUFFLE", "DROP_LAST"}
# knobs that set a data settings field without changing the plan, each with why
PLAN_NEUTRAL = {"SCAN_WORKERS": "threads that probe images: the same catalog, sooner"}


def test_the_derived_rules_are_the_hand_lists_they_replace():
    names = {k.name for k in TRAIN_KNOBS}
    assert not NOT_TRAINING_KNOBS & names
    assert set(RESUME_FIXED) == HAND_FIXED - NOT_TRAINING_KNOBS
    assert set(RESUME_SAFE) == HAND_SAFE and LENGTH_KNOBS == HAND_LENGTH
    assert len(RESUME_FIXED) == len(set(RESUME_FIXED)) and not set(RESUME_FIXED) & set(RESUME_SAFE)


def test_every_training_knob_declares_its_resume_rule():
    rules = resume_rules(TrainConfig)
    assert list(rules) == [k.name for k in TRAIN_KNOBS]
    undeclared = [name for name, rule in rules.items() if rule == UNDECLARED]
    assert not undeclared, (
        f"declare knob(..., resume=...) for {undeclared}: one of {list(RESUME_RULES)} "
        "(None: not compared on resume)"
    )
    assert all(rule in RESUME_RULES for rule in rules.values())


def test_a_knob_that_sets_the_data_plan_is_fixed_on_resume():
    rules = resume_rules(TrainConfig)
    for name in (*SCAN_KNOBS, *PLAN_KNOBS):
        if name in rules and name not in PLAN_NEUTRAL:
            assert rules[name] in ("fixed", "length"), f"{name} decides the data plan: resume='fixed'"
    assert all(rules[name] is None for name in PLAN_NEUTRAL)


def test_the_rule_is_read_from_the_declaration_and_a_wrong_one_refused():
    @dataclass(frozen=True)
    class Section:
        a: int = knob(1, "a", resume="fixed")
        b: int = knob(2, "b", resume="length")
        c: int = knob(3, "c", resume=None)
        d: int = knob(4, "d")

    assert resume_rules(Section) == {"A": "fixed", "B": "length", "C": None, "D": UNDECLARED}
    assert resume_knobs(Section, "safe", "length") == ("B",)
    with pytest.raises(ValueError, match="resume='sometimes' is not one of"):
        knob(0, "x", resume="sometimes")


def test_allow_changes_takes_only_safe_knobs():
    assert allow_changes_problem(["LR", "STEPS"]) is None
    assert "['RANK'] change the trained function" in allow_changes_problem(["RANK"])
    assert "['WORKERS'] are not compared" in allow_changes_problem(["WORKERS"])

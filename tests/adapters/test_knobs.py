"""Every dropout knob through every forward (merged weights, bypass, an fp8 base's forced bypass) of every
algorithm: it changes the training forward's output, or the builder refuses it by name. The table in
adapters/dropouts.py is checked both ways against lycoris itself."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import kohakumoss.adapters.builder as builder
from kohakumoss.adapters import build_adapter
from kohakumoss.adapters.algos import ALGOS as RECORDS
from kohakumoss.adapters.dropouts import KNOBS
from kohakumoss.precision import quantize_frozen_linears
from kohakumoss_common.errors import ConfigError

from .helpers import TINY_ARGS as ARGS
from .helpers import algo_names, flow_batch, forward, tiny_model

ALGOS = algo_names()
MODES = ["merged", "bypass", "fp8", "int8"]  # the quantized bases run lycoris's bypass forward
CASES = [
    (algo, knob, mode)
    for algo in ALGOS
    for knob in KNOBS
    for mode in MODES
    if mode in ("merged", "bypass") or RECORDS[algo].runs_on_quantized_base({})
]


def _build(algo, knob, mode, value=0.5):
    model = tiny_model()
    if mode in ("fp8", "int8"):
        model.requires_grad_(False)
        quantize_frozen_linears(model, f"{mode}_weight")
    net = build_adapter(
        model,
        algo,
        rank=8,
        alpha=4,
        preset="attn",
        bypass=mode == "bypass",
        **{knob: value},
        **ARGS.get(algo, {}),
    )
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.05)
    return model, net


def _acts(model, net) -> bool:
    """Whether the training forward differs from the eval forward (the dropout drew something)."""
    batch = flow_batch()
    torch.manual_seed(0)
    with torch.no_grad():
        net.train()
        trained = forward(model, batch)
        net.eval()
        return not torch.allclose(trained, forward(model, batch))


@pytest.fixture(autouse=True)
def _no_gc(monkeypatch):
    monkeypatch.setattr("lycoris.modules.tlora.gc.collect", lambda *a: 0)


@pytest.mark.parametrize("algo,knob,mode", CASES, ids=["-".join(c) for c in CASES])
def test_every_dropout_acts_or_is_refused_by_name(algo, knob, mode):
    try:
        model, net = _build(algo, knob, mode)
    except ConfigError as e:
        assert e.knob in (knob.upper(), "BYPASS"), e  # BYPASS: that forward is refused for the algorithm
        assert str(e).startswith(e.knob)
        return
    assert _acts(model, net), f"{knob} accepted for {algo} ({mode}) but the output does not change"


@pytest.mark.parametrize("algo", ALGOS)
def test_the_table_is_what_lycoris_does(monkeypatch, algo):
    """With the check off, a knob the table says a forward skips really is skipped (or fails) there, so
    the refusals refuse nothing lycoris would apply."""
    monkeypatch.setattr(builder, "resolve_bypass", lambda a, bypass, forced, v, auto=False: bypass or forced)
    monkeypatch.setattr(builder, "_check_bypass", lambda *a: None)
    record = RECORDS[algo]
    for mode, applied in zip(("merged", "bypass"), record.dropouts, strict=True):
        if mode == "bypass" and (record.dora() or record.bypass_refused):  # refused outright
            continue
        for knob in KNOBS:
            try:
                model, net = _build(algo, knob, mode)
                acts = _acts(model, net)
            except Exception:  # lycoris fails with it there (diag-OFT's bypass dropout)
                acts = False
            assert acts == (knob in applied), (algo, mode, knob)


def test_merged_forward_dropout_switches_to_the_bypass_forward():
    model, net = _build("lora", "dropout", "merged")
    assert all(m.bypass_mode for m in net.loras)
    assert _acts(model, net)


def test_an_int8_base_runs_the_bypass_forward_whatever_bypass_says():
    """lycoris would run its merged-weight forward on an Int8Linear's raw int8 values with BYPASS=False."""
    outs = []
    for bypass in (False, True):
        model = tiny_model()
        model.requires_grad_(False)
        quantize_frozen_linears(model, "int8_weight")
        net = build_adapter(model, "lora", rank=4, preset="attn", bypass=bypass)
        assert all(m.bypass_mode for m in net.loras)
        with torch.no_grad():
            for p in net.parameters():
                p.add_(0.01)
            outs.append(forward(model, flow_batch()))
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)


def test_zero_dropouts_keep_the_forward_asked():
    model = tiny_model()
    net = build_adapter(model, "lora", rank=4, preset="attn", bypass=False)
    assert not any(m.bypass_mode for m in net.loras)


def test_the_config_check_names_the_same_refusal():
    from kohakumoss.adapters.config import AdapterConfig
    from kohakumoss.adapters.dropouts import dropout_check

    boft = AdapterConfig(algo="boft", dropout=0.1, bypass=False)
    with pytest.raises(ConfigError) as built:
        _build("boft", "dropout", "merged", 0.1)
    knob, message = dropout_check(boft, "same")
    assert f"{knob}: {message}" == str(built.value)
    assert dropout_check(dataclasses.replace(boft, algo="lora"), "same") is None  # the bypass forward
    assert dropout_check(AdapterConfig(algo="lokr", rank_dropout=0.1), "fp8")[0] == "RANK_DROPOUT"
    assert dropout_check(AdapterConfig(algo="full", dropout=0.1), "same") is None


def test_the_trainer_refuses_a_dropout_before_anything_loads():
    from kohakumoss.config.train import TRAIN_SCHEMA, TrainConfig
    from kohakumoss.train.components import build_components

    knobs = {"ALGO": "boft", "DROPOUT": 0.1, "BYPASS": False, "MODEL_PRESET": "tiny", "DEVICE": "cpu"}
    full = {**TRAIN_SCHEMA.defaults(), **knobs}
    with pytest.raises(ConfigError, match="^DROPOUT: "):
        build_components(TrainConfig.from_knobs(full))


def test_dora_with_per_column_norms_is_refused():
    """lycoris writes such a file but cannot load it back (its loader sizes dora_scale per output row)."""
    with pytest.raises(ConfigError, match="ALGO_ARGS: DoRA with wd_on_output=False"):
        build_adapter(tiny_model(), "dora", rank=4, preset="attn", wd_on_output=False)


def test_auto_takes_the_merged_forward_for_a_dropout_only_it_applies():
    """LoKr's bypass forward skips rank dropout: BYPASS 'auto' (bypass for LoKr) then trains the merged one."""
    model = tiny_model()
    net = build_adapter(model, "lokr", rank=8, alpha=4, preset="attn", rank_dropout=0.5, **ARGS["lokr"])
    assert not any(m.bypass_mode for m in net.loras)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.05)
    assert _acts(model, net)
    plain = build_adapter(tiny_model(), "lokr", rank=8, alpha=4, preset="attn", **ARGS["lokr"])
    assert all(m.bypass_mode for m in plain.loras)


def test_the_docs_table_is_the_registry():
    """docs/concepts/adapters.md's dropout table says what each algorithm's `Algo.dropouts` says."""
    from pathlib import Path

    docs = Path(__file__).resolve().parents[2] / "docs" / "concepts" / "adapters.md"
    words = {"dropout": "dropout", "rank": "rank_dropout", "module": "module_dropout"}

    def applied(cell: str) -> frozenset | None:
        if "refused" in cell:
            return None
        return frozenset(words[w.strip()] for w in cell.split("(")[0].split(",") if w.strip() in words)

    lines = docs.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| `ALGO` | merged-weight forward"))
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        for name in cells[0].replace("`", "").split(","):
            rows[name.strip()] = (applied(cells[1]), applied(cells[2]))
    assert set(rows) == set(ALGOS)
    for name, (merged, bypassed) in rows.items():
        record = RECORDS[name]
        assert merged == record.dropouts[0], name
        refused = record.dora() or bool(record.bypass_refused)
        assert (bypassed is None) == refused and (refused or bypassed == record.dropouts[1]), name

"""Named profiles and MEMORY_PROFILE resolution."""

from __future__ import annotations

import pytest
import torch

from kohakumoss.config.train import TrainConfig
from kohakumoss.memory import PROFILES, MemoryPlan, catalog, estimate_plan, fastest_fit, resolve_plan
from kohakumoss.memory.calibration import GIB
from kohakumoss.memory.plan import FIELD_KNOBS, ON_CARD
from kohakumoss.model.presets import get_preset
from kohakumoss_common.errors import ConfigError
from kohakumoss_common.typed_config import with_knobs

MOSS = get_preset("moss-image-5b")
KNOBS = {"RANK": 32, "TOKENS_PER_STEP": 8704, "PRECISION": "bf16", "TARGET_PRESET": "attn-mlp"}


@pytest.mark.parametrize("algo", ["lora", "full"])
def test_named_profiles_ordered_by_peak(algo):
    knobs = {**KNOBS, "ALGO": algo}
    peaks = [
        estimate_plan(PROFILES[n], TrainConfig.from_knobs(knobs), MOSS).total
        for n in ("speed", "balanced", "low_vram", "minimal")
    ]
    assert peaks[0] > peaks[1] > peaks[2] > peaks[3], [p / GIB for p in peaks]
    assert PROFILES["speed"] == MemoryPlan()
    assert PROFILES["minimal"].text_encoder == "off" and PROFILES["minimal"].stream_blocks == -1


def test_resolve_named_entry_and_overrides():
    plan, why = resolve_plan(
        TrainConfig.from_knobs({**KNOBS, "MEMORY_PROFILE": "low_vram"}), MOSS, 24.0, False
    )
    assert plan == PROFILES["low_vram"] and "profile 'low_vram'" in why
    plan, why = resolve_plan(
        TrainConfig.from_knobs({**KNOBS, "MEMORY_PROFILE": "balanced", "CHECKPOINT_EVERY": 3}),
        MOSS,
        24.0,
        False,
    )
    assert plan.checkpointing == "full" and plan.checkpoint_every == 3 and "CHECKPOINT_EVERY=3" in why
    entry = catalog(MOSS, TrainConfig.from_knobs(KNOBS))[123]
    plan, why = resolve_plan(TrainConfig.from_knobs({**KNOBS, "MEMORY_PROFILE": "c0123"}), MOSS, None, False)
    assert plan == entry.plan and "catalog entry c0123" in why


def test_auto_is_the_fastest_fit_and_speed_without_a_gpu():
    for gb in (8.0, 24.0, 141.0):
        plan, why = resolve_plan(TrainConfig.from_knobs({**KNOBS, "MEMORY_PROFILE": "auto"}), MOSS, gb, False)
        best = fastest_fit(catalog(MOSS, TrainConfig.from_knobs(KNOBS)), gb * GIB)
        assert (
            plan == best.plan
            and best.id in why
            and estimate_plan(plan, TrainConfig.from_knobs(KNOBS), MOSS).total < gb * GIB
        )
    assert resolve_plan(TrainConfig.from_knobs(KNOBS), MOSS, None, False)[0] == PROFILES["speed"]
    with pytest.raises(ConfigError, match="MEMORY_PROFILE: 'auto' found no memory plan that fits"):
        resolve_plan(TrainConfig.from_knobs(KNOBS), MOSS, 0.5, False)
    # a full fine-tune needs a different plan than an adapter on the same card
    assert (
        resolve_plan(TrainConfig.from_knobs(KNOBS), MOSS, 24.0, True)[0]
        != resolve_plan(TrainConfig.from_knobs(KNOBS), MOSS, 24.0, False)[0]
    )


def test_auto_respects_pins():
    plan, _ = resolve_plan(TrainConfig.from_knobs({**KNOBS, "CHECKPOINTING": "mlp"}), MOSS, 16.0, False)
    assert (
        plan.checkpointing == "mlp"
        and estimate_plan(plan, TrainConfig.from_knobs(KNOBS), MOSS).total < 16 * GIB
    )


def test_bad_values_name_the_knob():
    with pytest.raises(ConfigError, match="MEMORY_PROFILE"):
        resolve_plan(TrainConfig.from_knobs({**KNOBS, "MEMORY_PROFILE": "fast"}), MOSS, 24.0, False)
    with pytest.raises(ConfigError, match="MEMORY_PROFILE: no catalog entry 'c0999'"):
        resolve_plan(TrainConfig.from_knobs({**KNOBS, "MEMORY_PROFILE": "c0999"}), MOSS, 24.0, False)
    with pytest.raises(ConfigError, match="GRAD_OFFLOAD"):
        resolve_plan(
            TrainConfig.from_knobs({**KNOBS, "MEMORY_PROFILE": "speed", "GRAD_OFFLOAD": True}),
            MOSS,
            24.0,
            False,
        )
    with pytest.raises(ConfigError, match="TEXT_ENCODER_PLACEMENT: 'off'.*TEXT_ENCODE is 'online'"):
        resolve_plan(
            TrainConfig.from_knobs({**KNOBS, "MEMORY_PROFILE": "minimal", "TEXT_ENCODE": "online"}),
            MOSS,
            8.0,
            False,
        )
    with pytest.raises(ConfigError, match="OPTIMIZER_PLACEMENT: a full fine-tune with streamed blocks"):
        resolve_plan(
            TrainConfig.from_knobs({**KNOBS, "MEMORY_PROFILE": "speed", "STREAM_BLOCKS": 4}), MOSS, 80.0, True
        )


TE = 18 * GIB  # a text encoder that runs in the step (TEXT_ENCODE 'online'), resident


def refusal(knobs: dict, gb: float, te: int = TE) -> str:
    with pytest.raises(ConfigError) as e:
        resolve_plan(
            TrainConfig.from_knobs({**knobs, "MEMORY_PROFILE": "auto"}),
            MOSS,
            gb,
            False,
            text_encoder_bytes=te,
        )
    assert e.value.knob == "MEMORY_PROFILE"
    return str(e.value)


def fits(knobs: dict, gb: float, te: int = TE) -> bool:
    try:
        resolve_plan(
            TrainConfig.from_knobs({**knobs, "MEMORY_PROFILE": "auto"}),
            MOSS,
            gb,
            False,
            text_encoder_bytes=te,
        )
    except ConfigError:
        return False
    return True


def test_auto_refuses_when_nothing_fits_and_lists_the_changes_that_do():
    """24 GiB with the text encoder online: caching the text fits, and so does the mildest token count;
    a smaller rank alone does not, so it is not offered."""
    knobs = {**KNOBS, "TEXT_ENCODE": "online"}
    assert not fits(knobs, 24.0)
    msg = refusal(knobs, 24.0)
    assert "smallest predicted peak is catalog entry" in msg
    assert "TEXT_ENCODE='cache' (encode the captions first: scripts/data/cache_text.py) -> c" in msg
    assert fits({**knobs, "TEXT_ENCODE": "cache"}, 24.0)
    assert "TOKENS_PER_STEP=4352 ->" in msg  # the mildest halving that fits
    assert fits({**knobs, "TOKENS_PER_STEP": 4352}, 24.0) and not fits(
        {**knobs, "TOKENS_PER_STEP": 8703}, 24.0
    )
    assert "RANK=" not in msg and not fits({**knobs, "RANK": 1}, 24.0)


def test_every_kind_of_change_is_offered_when_it_fits():
    """Each change the refusal can name, each listed with the mildest value that alone fits."""
    knobs = {**KNOBS, "TEXT_ENCODE": "cache", "RANK": 256, "EMA": True, "STREAM_BLOCKS": 0}
    msg = refusal(knobs, 18.0)
    offered = {
        "TOKENS_PER_STEP=4352 ->": {"TOKENS_PER_STEP": 4352},
        "BASE_PRECISION='fp8' (sm89+": {"BASE_PRECISION": "fp8"},
        "RANK=128 ->": {"RANK": 128},
        "EMA=False ->": {"EMA": False},
        "another profile: unset STREAM_BLOCKS": {"STREAM_BLOCKS": None},
    }
    for text, change in offered.items():
        assert text in msg and fits({**knobs, **change}, 18.0), text
    assert "RANK=64" not in msg and "TOKENS_PER_STEP=2176" not in msg  # only the mildest halving that fits
    # the text encoder quantized and the latents cached, when they run in the step
    online = {**KNOBS, "TEXT_ENCODE": "online", "VAE_ENCODE": "online"}
    with pytest.raises(ConfigError) as e:
        resolve_plan(
            TrainConfig.from_knobs({**online, "MEMORY_PROFILE": "auto"}),
            MOSS,
            22.0,
            False,
            None,
            14 * GIB,
            4 * GIB,
        )
    assert "TEXT_ENCODER_QUANT='fp8'" in str(e.value) and "VAE_ENCODE='cache'" in str(e.value)


def test_full_fine_tunes_are_not_offered_an_8bit_base_or_a_rank():
    msg = refusal({**KNOBS, "ALGO": "full", "TEXT_ENCODE": "cache"}, 4.0)
    assert "BASE_PRECISION" not in msg and "RANK=" not in msg


def test_no_single_change_fits_but_several_together_do():
    knobs = {**KNOBS, "TEXT_ENCODE": "online", "CHECKPOINTING": "none"}
    msg = refusal(knobs, 8.0)
    assert "No single change fits; these together do" in msg
    assert "TEXT_ENCODE='cache'" in msg and "unset CHECKPOINTING" in msg
    assert fits({**knobs, "TEXT_ENCODE": "cache", "CHECKPOINTING": None}, 8.0)


def test_nothing_the_estimate_knows_fits():
    assert "No change the estimate knows of fits" in refusal(KNOBS, 1.0, te=0)


def test_an_explicit_profile_above_the_card_runs_with_a_warning():
    plan, why = resolve_plan(TrainConfig.from_knobs({**KNOBS, "MEMORY_PROFILE": "speed"}), MOSS, 24.0, False)
    peak = estimate_plan(PROFILES["speed"], TrainConfig.from_knobs(KNOBS), MOSS).total / GIB
    assert plan == PROFILES["speed"]
    assert f"WARNING: predicted peak {peak:.1f} GiB above the card's 24 GiB" in why
    _, why = resolve_plan(TrainConfig.from_knobs({**KNOBS, "MEMORY_PROFILE": "speed"}), MOSS, 141.0, False)
    assert "WARNING" not in why
    _, why = resolve_plan(TrainConfig.from_knobs({**KNOBS, "MEMORY_PROFILE": "c0000"}), MOSS, None, False)
    assert "WARNING" not in why  # no card known: nothing to compare with


def test_a_data_parallel_rank_plans_for_its_share_of_the_step():
    """DDP / FSDP split the step's images over the ranks: each plans for at most the mean plus
    (1 - 1/world) of one sample (list scheduling's bound on `distributed.shard.assign`), never more than
    the step; a pipeline and one rank plan for the whole step."""
    from kohakumoss.distributed.shard import assign
    from kohakumoss.memory.profiles import rank_share

    def tokens(knobs: dict, world: int) -> int:
        return rank_share(TrainConfig.from_knobs(knobs), world)[0].data.tokens_per_step

    sample = 4096 + 256  # 1 MP and the caption budget
    knobs = {"DISTRIBUTED": "ddp", "TOKENS_PER_STEP": 4 * sample, "AREA": 1024 * 1024, "MAX_TEXT_TOKENS": 256}
    assert tokens(knobs, 2) == 2 * sample + sample // 2
    whole = TrainConfig.from_knobs(knobs)
    assert (
        rank_share(whole, 1) == (whole, 1) and tokens({**knobs, "DISTRIBUTED": "pipeline"}, 2) == 4 * sample
    )
    assert tokens({**knobs, "TOKENS_PER_STEP": sample}, 8) == sample  # capped
    # the bound holds for what assign gives: mixed sizes up to one sample each, over 2..4 ranks
    g = torch.Generator().manual_seed(0)
    for world in (2, 3, 4):
        for _ in range(50):
            items = torch.randint(
                sample // 8, sample + 1, (int(torch.randint(world, 12, (1,), generator=g)),), generator=g
            ).tolist()
            step = {**knobs, "TOKENS_PER_STEP": sum(items), "DISTRIBUTED": "fsdp"}
            worst = max(sum(items[i] for i in share) for share in assign(items, world))
            assert worst <= tokens(step, world)


def test_a_rank_of_an_edit_run_plans_for_the_references_of_its_largest_sample():
    """An edit dataset's samples carry their references in the tokens `assign` weighs (a planned item's
    `tokens`: target, caption and references, each reference at the target's area), so a DDP / FSDP
    rank's share counts them: three 1 MP edit samples over two ranks put two whole samples on one."""
    from kohakumoss.distributed.shard import step_shares
    from kohakumoss.memory.profiles import rank_share
    from kohakumoss_data.plan import PlannedItem, PlannedReference

    ref = PlannedReference("r", (1024, 1024), (1024, 1024), (0, 0), 4096)
    item = PlannedItem(
        "k", "h", "c", (1024, 1024), (1024, 1024), (0, 0), False, 4096, 256, 0, references=(ref,)
    )
    step = [item] * 3
    held = max(sum(step[i].tokens for i in share) for share in step_shares(step, 2))
    assert held == 2 * (2 * 4096 + 256)
    knobs = {"TOKENS_PER_STEP": 3 * item.tokens, "AREA": 1024 * 1024, "MAX_TEXT_TOKENS": 256}
    edit = {**knobs, "DATASET": {"kind": "kohya", "path": "d", "references": "r"}}
    for mode in ("ddp", "fsdp"):
        share = rank_share(TrainConfig.from_knobs({**edit, "DISTRIBUTED": mode}), 2)[0]
        plain = rank_share(TrainConfig.from_knobs({**knobs, "DISTRIBUTED": mode}), 2)[0]
        assert share.data.tokens_per_step == held > plain.data.tokens_per_step


def test_an_fsdp_rank_prices_its_shards_and_auto_picks_a_plan_fsdp_runs():
    """FSDP2 over 4 ranks: a full fine-tune's fp32 weights, grads and states are a quarter on each rank,
    with a couple of blocks and the root gathered in bf16; 'auto' offers only the plans FSDP2 runs (no
    streaming, no offload, whole-block checkpointing), so a 24 GiB card gets one instead of a refusal
    in the worker."""
    from kohakumoss.memory.profiles import rank_share

    knobs = {**KNOBS, "ALGO": "full", "DISTRIBUTED": "fsdp", "TOKENS_PER_STEP": 4 * 4352, "AREA": 1024 * 1024}
    one = estimate_plan(MemoryPlan(), TrainConfig.from_knobs({**knobs, "DISTRIBUTED": "none"}), MOSS)
    four, shards = rank_share(TrainConfig.from_knobs(knobs), 4)
    assert shards == 4 and rank_share(TrainConfig.from_knobs({**knobs, "DISTRIBUTED": "ddp"}), 4)[1] == 1
    sharded = estimate_plan(MemoryPlan(), four, MOSS, shards=shards)
    for part in ("grads", "optimizer states"):
        assert sharded.parts[part] == pytest.approx(one.parts[part] / 4)
    assert sharded.parts["DiT weights (FSDP shards)"] == pytest.approx(one.parts["DiT weights (fp32)"] / 4)
    assert (
        sharded.parts["FSDP gathered blocks"] > 0 and not sharded.forward_parts
    )  # bf16 gathered: no autocast copies
    assert sharded.total < one.total / 2
    plan, why = resolve_plan(four, MOSS, 24.0, True, shards=shards)
    assert plan.fsdp_refusal() is None and "auto: catalog entry" in why, why
    with pytest.raises(ConfigError, match="STREAM_BLOCKS: 32 with DISTRIBUTED='fsdp'"):
        low_vram = with_knobs(four, {"MEMORY_PROFILE": "low_vram"})
        resolve_plan(low_vram, MOSS, 24.0, True, shards=shards)
    # a LoRA over a sharded base: the base is sharded, the adapter whole on every rank
    lora, shards = rank_share(TrainConfig.from_knobs({**knobs, "ALGO": "lora"}), 4)
    base = estimate_plan(MemoryPlan(), lora, MOSS)
    shard = estimate_plan(MemoryPlan(), lora, MOSS, shards=shards)
    assert shard.parts["trainable weights"] == base.parts["trainable weights"]
    assert shard.parts["grads"] == base.parts["grads"]
    assert shard.parts["DiT weights (FSDP shards)"] == pytest.approx(base.parts["DiT weights"] / 4)


@pytest.mark.parametrize("field", [f for f, _ in ON_CARD])
def test_every_engine_that_moves_bytes_off_the_card_refuses_graphs_by_its_knob(field):
    moved = {"stream_blocks": 2, "activation_offload": "on", "optimizer": "host"}
    extra = {"grad_offload": {"grad_offload": True, "optimizer": "stream"}}
    plan = MemoryPlan(**extra.get(field, {field: moved.get(field)}))
    knob = plan.off_card()[0]
    assert knob == FIELD_KNOBS[field]
    assert plan.graph_refusal().startswith(f"{knob}:")


def test_a_profile_graphs_exactly_when_it_keeps_everything_on_the_card():
    for name, plan in PROFILES.items():
        assert (plan.graph_refusal() is None) == (plan.off_card() is None), name
        if plan.checkpointing != "none" and plan.off_card() is None:
            # with dropout the recomputation restores the RNG state: a host read
            assert plan.graph_refusal(draws_random=True).startswith("CHECKPOINTING:")

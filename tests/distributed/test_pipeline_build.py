"""The pipelines build only their own stages (distributed/materialize.py `staged_backbone`): on 2 CPU
ranks (gloo) each rank holds its stages' parameters (stage 0 the embedders and conditioning, the last
stage the head) plus the small video embedder, every other parameter left on the meta device; the held
values, the global generator after the build and an adapter attached next equal the one-process
build's (random preset, and an hf checkpoint in several files written here). 'threaded' materializes
every stage on its own device (here every device is the CPU; test_pipeline_gpu.py has cuda:0 / cuda:1)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from kohakumoss.adapters import build_from_spec
from kohakumoss.config.train import TrainConfig
from kohakumoss.distributed import current
from kohakumoss.distributed.materialize import stage_bytes, staged_backbone
from kohakumoss.distributed.pipeline import owner_stage, stage_starts
from kohakumoss.model import MossBackbone, get_preset
from kohakumoss.model.io import save_backbone

from .knob_run import run_knobs
from .test_materialize import KNOBS, build_backbone, rng_after, same

TINY = get_preset("tiny")  # 4 blocks: stage 0 blocks 0-1, stage 1 blocks 2-3
PIPELINE = dict(DISTRIBUTED="pipeline", DEVICES=2, DEVICE="cpu", DIST_TIMEOUT=120.0)
SPEC = TrainConfig.from_knobs({"MODEL_PRESET": "tiny", "RANK": 4, "ALPHA": 4.0}).adapter.spec()


def adapter_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The LoRA the trainer attaches next (its initial weights come from the global generator)."""
    network = build_from_spec(model, SPEC)
    return {n: p.detach().cpu().clone() for n, p in network.named_parameters()}


def build_each(k: dict) -> dict:
    """On each rank: the staged builds, what each holds and where, the generator and the adapter after."""
    out = {}
    for name, knobs in k["BUILDS"].items():
        torch.manual_seed(11)
        model = staged_backbone(
            TrainConfig.from_knobs({**k, **KNOBS, **knobs}),
            None,
            torch.device("cpu"),
            torch.float32,
            False,
            "eager",
        )
        rng = torch.get_rng_state()
        mine = {
            "devices": {n: str(p.device) for n, p in model.named_parameters()},
            "held": {n: p.detach().clone() for n, p in model.named_parameters() if not p.is_meta},
            "bytes": stage_bytes(model),
            "rng": rng,
            "adapter": adapter_of(model),
        }
        every = [None] * current().size
        dist.all_gather_object(every, mine)
        out[name] = every
    return out


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    root = tmp_path_factory.mktemp("staged")
    hf = MossBackbone(TINY).init_weights(std=0.05, generator=torch.Generator().manual_seed(1))
    save_backbone(hf, root / "hf", layout="hf", max_shard_bytes=2 << 20)  # several shard files
    return {"preset": dict(MODEL_PRESET="tiny"), "hf": dict(WEIGHTS=str(root / "hf"))}


@pytest.fixture(scope="module")
def built(builds):
    return run_knobs({**PIPELINE, "BUILDS": builds}, build_each)


def one_process(knobs: dict) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """The one-process build from seed 11 and the adapter it attaches next."""
    torch.manual_seed(11)
    model = build_backbone({**KNOBS, **knobs}, torch.device("cpu"), torch.float32, False)
    return model, adapter_of(model)


@pytest.mark.parametrize("name", ["preset", "hf"])
def test_a_pipeline_rank_holds_only_its_stages(built, builds, name):
    starts = stage_starts(TINY.depth, 2)
    model, adapter = one_process(builds[name])
    whole = {n: p.detach() for n, p in model.named_parameters()}
    whole_bytes = sum(p.numel() * p.element_size() for p in whole.values())
    held_by = {}
    for rank, got in enumerate(built[name]):
        want = {n for n in whole if owner_stage(n, starts) == rank or n.startswith("video_embedder.")}
        assert set(got["held"]) == want, (rank, sorted(set(got["held"]) ^ want)[:5])
        assert all(got["devices"][n] == "meta" for n in whole if n not in want)
        assert all(got["devices"][n] == "cpu" for n in want)
        same(got["held"], {n: whole[n] for n in want})  # bit for bit the one-process values
        here = sum(whole[n].numel() * whole[n].element_size() for n in want)
        assert got["bytes"]["cpu"] == here < 0.75 * whole_bytes, (got["bytes"], whole_bytes)
        assert got["bytes"]["cpu"] + got["bytes"]["meta"] == whole_bytes
        # the global generator moved as the one-process build moved it: the adapter is the same
        assert torch.equal(got["rng"], rng_after(build_backbone, {**KNOBS, **builds[name]}))
        same(got["adapter"], adapter)
        held_by.update(dict.fromkeys(want, rank))
    assert set(held_by) == set(whole)  # every parameter held by some rank


def test_threaded_builds_every_stage_on_its_device(builds):
    starts = stage_starts(TINY.depth, 3, [0, 1, 3])
    knobs = {**KNOBS, **builds["preset"], "DISTRIBUTED": "threaded", "DEVICES": ["cpu"] * 3}
    knobs["PIPELINE_SPLIT"] = [0, 1, 3]
    torch.manual_seed(11)
    model = staged_backbone(
        TrainConfig.from_knobs(knobs), None, torch.device("cpu"), torch.float32, False, "eager"
    )
    adapter = adapter_of(model)
    ref, ref_adapter = one_process(builds["preset"])
    assert not any(p.is_meta for p in model.parameters())
    same(
        {n: p.detach() for n, p in model.named_parameters()},
        {n: p.detach() for n, p in ref.named_parameters()},
    )
    same(adapter, ref_adapter)
    assert {owner_stage(n, starts) for n, _ in model.named_parameters()} == {0, 1, 2}


def test_no_staged_build_outside_the_pipelines():
    for mode in ("none", "ddp", "fsdp", "pipeline"):  # 'pipeline' on one rank trains as one process
        k = {**KNOBS, "MODEL_PRESET": "tiny", "DISTRIBUTED": mode}
        assert (
            staged_backbone(
                TrainConfig.from_knobs(k), None, torch.device("cpu"), torch.float32, False, "eager"
            )
            is None
        )

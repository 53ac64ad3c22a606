"""DISTRIBUTED='fsdp' builds the backbone on the meta device and materializes only each rank's shards
(2 CPU ranks, gloo): every parameter a DTensor whose local shard is all a rank holds, the gathered
weights equal to the one-process build (random preset, an hf file in several shards, a ComfyUI ConvRot
int8 file with fused qkv), and a worker's host peak RSS at build well below the whole model's bytes,
where building whole and then sharding (the path this replaced) goes above it."""

from __future__ import annotations

import ctypes
import dataclasses
import gc

import pytest
import torch
import torch.distributed as dist

from kohakumoss.config.train import TrainConfig
from kohakumoss.distributed import current
from kohakumoss.distributed.materialize import (
    build_sharded,
    fill_random,
    held_bytes,
    peak_rss_gib,
    reset_peak_rss,
    sharded_backbone,
)
from kohakumoss.distributed.wrap import wrap_fsdp
from kohakumoss.model import MossBackbone, get_preset
from kohakumoss.model.io import load_backbone, save_backbone
from kohakumoss.train.components import build_backbone as build_from_config
from kohakumoss.train.loop import train_on_devices
from kohakumoss_common.errors import ConfigError
from kohakumoss_kernels import OpSet

from ..model.test_convrot import KITCHEN_MARKER, convrot_file
from ..trainer.conftest import tiny_knobs, train_world  # noqa: F401 (the fixture)
from .knob_run import run_knobs
from .test_fsdp_trainer import same_losses
from .test_trainer import records

TINY = get_preset("tiny")
# wide enough that the model (~370 MiB in fp32) dwarfs a worker's noise in RSS; one parameter is 32 MiB
WIDE = dataclasses.replace(TINY, dim=1024, depth=4, num_heads=8, mlp_hidden=4096)
FSDP = dict(DISTRIBUTED="fsdp", DEVICES=2, DEVICE="cpu", DIST_TIMEOUT=120.0)
KNOBS = dict(WEIGHTS="", MODEL_PRESET="", SEED=5, DEVICE="cpu", OPS_BACKEND="eager")


def build_backbone(knobs: dict, device: torch.device, dtype: torch.dtype, fp32_masters: bool, draw=None):
    """The one-process build (train/components.build_backbone) from these knobs' typed config."""
    cfg = TrainConfig.from_knobs(knobs)
    backend, seed = cfg.runtime.ops_backend, cfg.run.seed
    return build_from_config(
        cfg.model, device, dtype, fp32_masters, ops_backend=backend, seed=seed, draw=draw
    )


def settle_rss() -> None:
    """Freed tensors back to the OS (glibc keeps freed pages, which a later build would reuse unseen),
    then a new peak: the next build's rise is its own."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    assert reset_peak_rss(), "needs a resettable peak (Linux clear_refs)"


def rss_now_gib() -> float:
    """The current resident set (not the peak), from /proc."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**30


def report(model: torch.nn.Module) -> dict:
    """What rank 0 hands back: the gathered weights (a collective), and every rank's held bytes."""
    here, whole = held_bytes(model)
    shards = [(n, type(p).__name__, tuple(p.to_local().shape)) for n, p in model.named_parameters()]
    per_rank = [None] * current().size
    dist.all_gather_object(per_rank, (here, whole, shards))
    full = {n: p.full_tensor().cpu().clone() for n, p in model.named_parameters()}
    return {"per_rank": per_rank, "full": full, "bands": model.rope.bands.cpu().clone()}


def build_each(k: dict) -> dict:
    """On each rank: the trainer's sharded builds, then the RSS of a wide build, sharded and whole."""
    device = torch.device("cpu")
    out = {}
    for name, knobs in k["BUILDS"].items():
        torch.manual_seed(11)
        model = sharded_backbone(
            TrainConfig.from_knobs({**k, **KNOBS, **knobs}), None, device, torch.float32, False, "eager"
        )
        out[name] = report(model)
        out[name]["rng"] = torch.get_rng_state()  # what an adapter's initial weights draw from next
        del model
    settle_rss()
    base = rss_now_gib()

    def wide_fill(m):
        fill_random(m, 3, device, torch.float32)

    model = build_sharded(WIDE, OpSet("eager", tune="off"), device, torch.float32, wide_fill)
    sharded_rise = peak_rss_gib() - base
    del model
    settle_rss()
    base = rss_now_gib()
    whole = MossBackbone(WIDE, OpSet("eager", tune="off"))  # the replaced path: whole, then sharded
    whole.init_weights(std=0.02, generator=torch.Generator().manual_seed(3))
    wrap_fsdp(whole)
    whole_rise = peak_rss_gib() - base
    rises = [None] * current().size
    dist.all_gather_object(rises, (sharded_rise, whole_rise))
    out["rises"] = rises
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("materialize")
    hf = MossBackbone(TINY).init_weights(std=0.05, generator=torch.Generator().manual_seed(1))
    save_backbone(hf, root / "hf", layout="hf", max_shard_bytes=2 << 20)  # several shard files
    convrot, _, _ = convrot_file(root, KITCHEN_MARKER, exact=True)
    builds = {
        "preset": dict(MODEL_PRESET="tiny"),
        "hf": dict(WEIGHTS=str(root / "hf")),
        "convrot": dict(WEIGHTS=str(convrot)),
    }
    return run_knobs({**FSDP, "BUILDS": builds}, build_each), builds


def test_every_parameter_is_a_dtensor_and_a_rank_holds_its_shards_only(built):
    out, builds = built
    whole_bytes = sum(p.numel() * 4 for p in MossBackbone(TINY).parameters())
    for name in builds:
        per_rank = out[name]["per_rank"]
        assert len(per_rank) == 2
        for here, whole, shards in per_rank:
            assert whole == whole_bytes
            assert all(kind == "DTensor" for _, kind, _ in shards), name
            # dim 0 split in two (odd row counts round up on rank 0)
            assert here <= whole / 2 + 4 * TINY.dim * len(shards), (name, here, whole)
        assert sum(here for here, _, _ in per_rank) == whole_bytes  # every row held once


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys() and a
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        assert torch.equal(a[key], b[key]), (key, (a[key] - b[key]).abs().max())


def rng_after(build, knobs: dict) -> torch.Tensor:
    """The global generator's state after the one-process build from seed 11."""
    torch.manual_seed(11)
    build(knobs, torch.device("cpu"), torch.float32, False)
    return torch.get_rng_state()


def test_preset_shards_equal_the_one_process_random_weights(built):
    out, _ = built
    one = build_backbone({**KNOBS, "MODEL_PRESET": "tiny"}, torch.device("cpu"), torch.float32, False)
    same(out["preset"]["full"], dict(one.named_parameters()))
    assert torch.equal(out["preset"]["rng"], rng_after(build_backbone, {**KNOBS, "MODEL_PRESET": "tiny"}))
    assert torch.equal(out["preset"]["bands"], one.rope.bands)
    # the check can fail: another seed's weights differ
    other = build_backbone(
        {**KNOBS, "MODEL_PRESET": "tiny", "SEED": 6}, torch.device("cpu"), torch.float32, False
    )
    with pytest.raises(AssertionError):
        same(out["preset"]["full"], dict(other.named_parameters()))


@pytest.mark.parametrize("name", ["hf", "convrot"])
def test_checkpoint_shards_equal_the_one_process_load(built, name):
    """Read slice by slice (several files; fused qkv split, int8 dequantized and un-rotated per row)."""
    out, builds = built
    one = load_backbone(builds[name]["WEIGHTS"], dtype=torch.float32)
    same(out[name]["full"], {n: p.detach() for n, p in one.named_parameters()})
    assert torch.equal(out[name]["rng"], rng_after(build_backbone, {**KNOBS, **builds[name]}))
    assert torch.equal(out[name]["bands"], one.rope.bands)


def test_a_worker_builds_below_the_whole_model_in_host_memory(built):
    """Peak RSS rise of each worker at build (logged by the trainer too): the sharded build stays near
    half the model (its shards plus one parameter drawn whole); the whole build goes above the model."""
    with torch.device("meta"):
        model_gib = sum(p.numel() * 4 for p in MossBackbone(WIDE).parameters()) / 2**30
    for sharded_rise, whole_rise in built[0]["rises"]:
        print(
            f"WIDE model {model_gib:.3f} GiB: rank peak RSS rise sharded {sharded_rise:.3f}, whole {whole_rise:.3f}"
        )
        assert sharded_rise < 0.75 * model_gib, (sharded_rise, model_gib)
        assert whole_rise > 0.8 * model_gib, (whole_rise, model_gib)  # the test can tell the two apart


def refusal(k: dict) -> str:
    """On each rank: a memory plan FSDP2 cannot run, refused before anything is built."""
    from kohakumoss.memory.plan import MemoryPlan

    k = {**k, **KNOBS, "MODEL_PRESET": "tiny"}
    try:
        sharded_backbone(
            TrainConfig.from_knobs(k),
            MemoryPlan(stream_blocks=2),
            torch.device("cpu"),
            torch.float32,
            False,
            "eager",
        )
    except ConfigError as e:
        return str(e)
    return "built"


def test_sharded_build_is_the_fsdp_workers_only_and_refuses_a_streaming_plan():
    k = {**KNOBS, "MODEL_PRESET": "tiny", "DISTRIBUTED": "fsdp"}
    assert (
        sharded_backbone(TrainConfig.from_knobs(k), None, torch.device("cpu"), torch.float32, False, "eager")
        is None
    )  # 1 rank
    assert "STREAM_BLOCKS: 2 with DISTRIBUTED='fsdp'" in run_knobs(FSDP, refusal)


def test_a_random_preset_build_draws_nothing_from_the_global_generator():
    """The one-process build starts on the meta device as the sharded ones do (init_weights draws from its
    own generator), so an adapter's initial weights come from the same global state after any build."""
    torch.manual_seed(11)
    want = torch.get_rng_state()
    model = build_backbone({**KNOBS, "MODEL_PRESET": "tiny"}, torch.device("cpu"), torch.float32, False)
    assert torch.equal(torch.get_rng_state(), want)
    assert not any(p.is_meta for p in model.parameters()) and model.rope.bands.dtype == torch.float32


# ---- 2 GPUs (NCCL): skipped with fewer


def gpu_build(k: dict) -> dict:
    """On each GPU rank: the tiny preset's shards (drawn on the GPU) and the CUDA generator after them;
    then the released 5B model's bf16 shards, with the host RSS rise and the GPU peak of the build."""
    device = torch.device(k["DEVICE"])
    knobs = {**k, **KNOBS, "DEVICE": str(device)}
    torch.manual_seed(11)
    model = sharded_backbone(
        TrainConfig.from_knobs({**knobs, "MODEL_PRESET": "tiny"}), None, device, torch.float32, False, "eager"
    )
    out = {"preset": report(model), "rng": torch.cuda.get_rng_state(device)}
    del model
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    settle_rss()
    base = rss_now_gib()
    big = sharded_backbone(
        TrainConfig.from_knobs({**knobs, "MODEL_PRESET": "moss-image-5b"}),
        None,
        device,
        torch.bfloat16,
        False,
        "eager",
    )
    here, whole = held_bytes(big)
    figures = (
        peak_rss_gib() - base,
        torch.cuda.max_memory_allocated(device) / 2**30,
        here / 2**30,
        whole / 2**30,
    )
    out["big"] = [None] * current().size
    dist.all_gather_object(out["big"], figures)
    return out


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"
)
def test_sharded_build_on_two_gpus_equals_one_gpu_and_the_5b_stays_off_the_host():
    out = run_knobs({**FSDP, "DEVICE": "cuda"}, gpu_build)
    cuda = torch.device("cuda:0")
    torch.manual_seed(11)
    one = build_backbone(
        {**KNOBS, "DEVICE": "cuda", "MODEL_PRESET": "tiny"}, cuda, torch.float32, False, draw=cuda
    )
    same(out["preset"]["full"], {n: p.detach().cpu() for n, p in one.named_parameters()})
    assert torch.equal(out["rng"], torch.cuda.get_rng_state(cuda))
    for rank, (rss_rise, gpu_peak, held, whole) in enumerate(out["big"]):
        print(
            f"moss-image-5b bf16 sharded build, rank {rank}: holds {held:.2f} of {whole:.2f} GiB on its GPU, "
            f"GPU peak {gpu_peak:.2f} GiB, host peak RSS rise {rss_rise:.2f} GiB"
        )
        assert held < 0.55 * whole
        assert rss_rise < 0.25 * whole  # nothing of the model's size passes through the host
        assert gpu_peak < held + 1.0  # its shards plus one parameter drawn whole in fp32


def test_trainer_fsdp_from_a_convrot_file_trains_what_one_process_does(train_world, tmp_path):  # noqa: F811
    """The trainer under DISTRIBUTED='fsdp' with WEIGHTS a ComfyUI ConvRot int8 file: each rank reads
    its shards (logged with its held bytes and host peak RSS); the losses are one process's."""
    path, _, _ = convrot_file(tmp_path, KITCHEN_MARKER)
    extra = dict(WEIGHTS=str(path), MODEL_PRESET="", STEPS=2, GRAD_ACCUM=1, LOGGERS=[])
    one = train_on_devices(tiny_knobs(train_world, "weights-one", **extra))
    two = train_on_devices(
        tiny_knobs(train_world, "weights-two", DISTRIBUTED="fsdp", DEVICES=2, DIST_TIMEOUT=120.0, **extra)
    )
    log = (two / "log.txt").read_text()
    assert "FSDP2 build: rank 0 holds 8.8 MiB of the DiT's 17.6 MiB" in log and "ConvRot int8" in log
    assert "host peak RSS" in log and "sharded over 2 ranks (at build, from the meta device)" in log
    same_losses(records(one), records(two))

"""What the trainer (train/trainer.py) asks of a distributed run, phase by phase: a no-op in one process.

rr = RankRun(cfg)                                  # this rank (launch.current()), its TrainConfig
rr.check_plan(plan)                                # the memory plan's engines fsdp / a pipeline cannot run
with rr.sharding(backbone, dtype, plan):           # fsdp: the backbone's shards (before a full fine-tune's
    tr = build_trainable(...)                      #   optimizer, after an adapter)
data = rr.prepare_data(data)                       # this rank's share of every micro-step
forward = rr.prepare_model(backbone, network, plan)    # DDP around it, the pipeline's stages, or itself
step_loss = rr.step_fn(loss, tcfg, draw_step_noise)    # the share's loss, noise, sync (`hooks` for the runner)
optimizer = rr.prepare_optimizer(optimizer)        # pipeline: clipped by every rank's gradients
totals = rr.reduce_step(step, loss, samples, tokens, device, refs)   # every rank's, summed; peaks when logged
with rr.saving(tr, backbone) as shards: ...        # rank 0 writes the checkpoint (fsdp: every rank's shards)
with rr.whole_weights(tr, backbone): ...           # rank 0 holds every weight (exports)
with rr.whole_forward(backbone): sample / validate # threaded: the backbone's forward over its devices
rr.is_main, rr.own(run_dir), rr.main_decides(flag), rr.any_rank(flag), rr.barrier()

DISTRIBUTED='pipeline' (ranks, torch.distributed.pipelining) and 'threaded' (one process, a thread per
device) run each micro-step's forward and backward inside the loss `step_fn` returns (pipeline.py,
threaded.py): the runner takes the micro-step's loss and skips its own backward (`runs_backward`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from kohakumoss.adapters.algos import adapter_algo
from kohakumoss.memory.plan import FSDP_CHECKPOINTING
from kohakumoss_common.device import peak_memory_gib
from kohakumoss_common.errors import ConfigError
from kohakumoss_common.log import get_logger

from .checkpoint import sharded_state, write_shards
from .collectives import barrier, host_group
from .config import DistributedConfig, devices_problem, mode_problem, worker_devices
from .gather import any_sharded, full_weights
from .host_grads import attach, broadcast_trainable
from .host_share import share_on_node
from .launch import current
from .pipeline import (
    SCHEDULES,
    PipelineEngine,
    PipelineOptimizer,
    Prediction,
    capacities,
    main_holds_all,
    main_holds_states,
    split_problem,
    stage_count,
    stage_starts,
)
from .shard import rank_weight, shard_plan, step_noise
from .threaded import ThreadedEngine, spread_forward
from .world import beat
from .wrap import Bound, average_grads, broadcast_params, wrap_ddp, wrap_fsdp

log = get_logger(__name__)

# the engines the trainer drives
TRAINER_MODES = ("none", "ddp", "fsdp", "pipeline", "threaded")
PIPELINES = ("pipeline", "threaded")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# the pipeline knobs (off the pipelines, a value but their default would do nothing: refused)
PIPELINE_FIELDS = ("pipeline_split", "pipeline_schedule", "pipeline_chunks")
PIPELINE_DEFAULTS = DistributedConfig()
# optimizers tested on sharded parameters (Muon through USE_MUON)
FSDP_OPTIMIZERS = ("adamw",)
# the memory engines that move weights, states or gradients off the card, and the value that keeps them on
ON_CARD = (("stream_blocks", 0), ("activation_offload", "none"), ("optimizer_placement", "gpu"))
# why the step graphs stay off under an engine (DDP graphs: its gradients are averaged after the backward)
GRAPHLESS = {
    "fsdp": "FSDP2 all-gathers and reduce-scatters inside the forward and backward, which the step graphs do not capture",
    "pipeline": "the stages hand tensors between ranks inside the step",
    "threaded": "the stages hand tensors between devices inside the step",
}
# a run's typed config: config/train.py's TrainConfig (it composes this package's DistributedConfig with the
# other sections; it sits above this package, so it is passed in, never imported)
RunSections = Any


def fsdp_problem(cfg: RunSections) -> tuple[str, str] | None:
    """(knob, why) when DISTRIBUTED='fsdp' cannot run this config (set knobs; the resolved memory plan is
    checked again by `fsdp_plan_problem`)."""
    why = "with DISTRIBUTED='fsdp'"
    memory = cfg.memory
    if cfg.device.precision == "fp16":
        return "PRECISION", f"'fp16' {why}: a GradScaler over sharded gradients is not built; use 'bf16'"
    if cfg.device.base_precision != "same":
        return (
            "BASE_PRECISION",
            f"'{cfg.device.base_precision}' {why}: 8-bit frozen linears are not sharded; use 'same'",
        )
    if cfg.optim.optimizer not in FSDP_OPTIMIZERS:
        return (
            "OPTIMIZER",
            f"'{cfg.optim.optimizer}' {why}: only {list(FSDP_OPTIMIZERS)} (and USE_MUON) step sharded states",
        )
    if cfg.adapter.algo == "full" and cfg.optim.ema:
        return "EMA", f"True {why} and ALGO='full': an EMA of sharded weights is not built"
    if memory.checkpointing is not None and memory.checkpointing not in FSDP_CHECKPOINTING:
        return (
            "CHECKPOINTING",
            f"'{memory.checkpointing}' {why}: half-block checkpointing calls parts of a block, which FSDP2 does not gather; use 'full' or 'none'",
        )
    for field, off in ON_CARD:
        if (value := getattr(memory, field)) not in (None, off):
            return (
                field.upper(),
                f"{value!r} {why}: FSDP2 shards the weights and states instead; leave it {off!r}",
            )
    if memory.grad_offload:
        return (
            "GRAD_OFFLOAD",
            f"True {why}: FSDP2 reduce-scatters the gradients on the device; the host sums are not sharded",
        )
    return None


def fsdp_plan_problem(plan) -> tuple[str, str] | None:
    """(knob, why) when the resolved memory plan (from MEMORY_PROFILE too) cannot run under FSDP2."""
    return plan.fsdp_refusal()


def trainable_params(model: torch.nn.Module, network: torch.nn.Module | None) -> list[torch.nn.Parameter]:
    """The parameters that train: the adapter's (the backbone frozen), or the backbone's (a full fine-tune)."""
    seen: dict[int, torch.nn.Parameter] = {}
    for m in (model, network):
        for p in m.parameters() if m is not None else ():
            if p.requires_grad:
                seen.setdefault(id(p), p)
    return list(seen.values())


def device_count(devices: Any) -> int | None:
    """How many workers (pipeline) or stages (threaded) DEVICES names; None: every visible GPU."""
    if isinstance(devices, (list, tuple)):
        return len(devices)
    return devices if isinstance(devices, int) and devices > 0 else None


def preset_depth(cfg: RunSections) -> int | None:
    """The backbone's depth where MODEL_PRESET says it without loading anything (else None)."""
    from kohakumoss.model import get_preset

    if cfg.model.weights or not cfg.model.model_preset:
        return None
    try:
        return get_preset(cfg.model.model_preset).depth
    except Exception:
        return None


def pipeline_problem(cfg: RunSections) -> tuple[str, str] | None:
    """(knob, why) when DISTRIBUTED='pipeline' or 'threaded' cannot run this config (set knobs; the
    resolved memory plan is checked again by `pipeline_plan_problem`)."""
    par = cfg.parallel
    mode = par.distributed
    why = f"with DISTRIBUTED='{mode}'"
    schedule, split, chunks = par.pipeline_schedule, par.pipeline_split, par.pipeline_chunks
    if mode not in PIPELINES:
        for field in PIPELINE_FIELDS:
            if (value := getattr(par, field)) != getattr(PIPELINE_DEFAULTS, field):
                return field.upper(), f"{value!r} with DISTRIBUTED='{mode}': only the pipelines read it"
        return None
    if schedule not in SCHEDULES:
        return "PIPELINE_SCHEDULE", f"{schedule!r} is not one of {list(SCHEDULES)}"
    if mode == "threaded" and schedule != "gpipe":
        return "PIPELINE_SCHEDULE", f"'{schedule}' {why}: its stage threads run GPipe's order; use 'gpipe'"
    devices = device_count(par.devices)
    stages = stage_count(schedule, devices, split) if devices is not None else (len(split) or None)
    if problem := split_problem(split, preset_depth(cfg), stages if mode == "threaded" else None):
        return "PIPELINE_SPLIT", problem
    if mode == "pipeline" and split and devices is not None:
        if schedule != "interleaved" and len(split) != devices:
            return (
                "PIPELINE_SPLIT",
                f"{len(split)} stages for {devices} ranks: one each ('interleaved': several)",
            )
        if schedule == "interleaved" and len(split) % devices:
            return (
                "PIPELINE_SPLIT",
                f"{len(split)} stages for {devices} ranks: 'interleaved' needs a multiple",
            )
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 0:
        return "PIPELINE_CHUNKS", f"{chunks!r}: a count of micro-batches per micro-step (0: one per stage)"
    if chunks and stages is not None and schedule != "gpipe" and chunks < stages:
        return (
            "PIPELINE_CHUNKS",
            f"{chunks} micro-batches for {stages} stages: '{schedule}' needs at least one per stage",
        )
    return _pipeline_run_problem(cfg, mode, why)


def _pipeline_run_problem(cfg: RunSections, mode: str, why: str) -> tuple[str, str] | None:
    """(knob, why) of the rest of the config a pipeline cannot run (precision, optimizer, EMA, DoRA,
    samples, validation, the memory engines)."""
    algo, algo_args = cfg.adapter.algo, cfg.adapter.algo_args or {}
    if cfg.device.precision == "fp16":
        return "PRECISION", f"'fp16' {why}: the loss scaler is not run across stages; use 'bf16'"
    if cfg.device.base_precision != "same":
        return (
            "BASE_PRECISION",
            f"'{cfg.device.base_precision}' {why}: 8-bit frozen linears are not placed per stage; use 'same'",
        )
    if mode == "pipeline" and cfg.optim.optimizer != "adamw":
        return (
            "OPTIMIZER",
            f"'{cfg.optim.optimizer}' {why}: each rank steps its own stages' weights; only 'adamw' (and USE_MUON) is per-parameter",
        )
    if cfg.optim.ema:
        return (
            "EMA",
            f"True {why}: the EMA keeps every trainable weight in one place; it is not built per stage",
        )
    adapter = adapter_algo(algo)
    if mode == "pipeline" and adapter is not None and adapter.dora(algo_args):
        knob = "ALGO" if adapter.dora() else "ALGO_ARGS"
        return (
            knob,
            f"DoRA {why}: its magnitudes start from the frozen weights, which a rank holds for its own "
            "stages only; use DISTRIBUTED='threaded' (every stage built) or another ALGO",
        )
    # 'threaded' samples and validates across its devices (threaded.spread_forward); a pipeline rank
    # holds only its stages and the sampler's forward is not run through the ranks
    instead = (
        "; use DISTRIBUTED='threaded' (the same stages in one process, which samples and validates), "
        "or leave it empty and sample the exported files (scripts/sample/sample.py)"
    )
    samples = cfg.samples
    if mode == "pipeline" and (samples.sample_prompts or samples.sample_prompts_file):
        return (
            "SAMPLE_PROMPTS" if samples.sample_prompts else "SAMPLE_PROMPTS_FILE",
            f"set {why}: each rank holds only its stages, the sampler needs the whole backbone{instead}",
        )
    if mode == "pipeline" and cfg.data.val_items:
        return (
            "VAL_ITEMS",
            f"{cfg.data.val_items} {why}: each rank holds only its stages, the validation loss needs the whole "
            "backbone; use 0, or DISTRIBUTED='threaded'",
        )
    for field, off in ON_CARD:
        if (value := getattr(cfg.memory, field)) not in (None, off):
            return (
                field.upper(),
                f"{value!r} {why}: the stages place the weights themselves; leave it {off!r}",
            )
    if cfg.memory.grad_offload:
        return (
            "GRAD_OFFLOAD",
            f"True {why}: the stages keep their gradients on their devices (the host sums are not run per stage)",
        )
    return None


def pipeline_plan_problem(plan, mode: str) -> tuple[str, str] | None:
    """(knob, why) when the resolved memory plan (from MEMORY_PROFILE too) cannot run under a pipeline:
    block checkpointing runs (the stages call the block runner), the engines that move weights, states
    or gradients do not."""
    if moved := plan.off_card():
        knob, value, on_card = moved
        why = f"with DISTRIBUTED='{mode}' (from the memory plan: set it, or another MEMORY_PROFILE)"
        return knob, f"{value!r} {why}; the pipeline needs {on_card!r}"
    return None


def trainer_problem(cfg: RunSections) -> tuple[str, str] | None:
    """(knob, why) when the trainer cannot run this config distributed, else None."""
    mode = cfg.parallel.distributed
    if problem := pipeline_problem(cfg):  # also: the pipeline knobs set off the pipelines
        return problem
    if mode == "none":
        return None
    if mode not in TRAINER_MODES:
        return "DISTRIBUTED", f"'{mode}' is not driven by the trainer yet; use 'ddp', 'fsdp' (or 'none')"
    if cfg.runtime.cuda_graphs == "on" and mode in GRAPHLESS:
        return "CUDA_GRAPHS", f"'on' with DISTRIBUTED='{mode}': {GRAPHLESS[mode]}; use 'auto' or 'off'"
    algo = adapter_algo(cfg.adapter.algo)
    if algo is not None and algo.distributed_refusal:
        return "ALGO", f"'{cfg.adapter.algo}' {algo.distributed_refusal}"
    return fsdp_problem(cfg) if mode == "fsdp" else None


def refusals(cfg: RunSections) -> list[tuple[str, str]]:
    """Every (knob, why) the distributed trainer refuses before work starts (kohakumoss-config check)."""
    mode, devices = cfg.parallel.distributed, cfg.parallel.devices
    if problem := mode_problem(mode):
        return [("DISTRIBUTED", problem)]
    out = []
    if problem := devices_problem(devices, mode):
        out.append(("DEVICES", problem))
    if problem := trainer_problem(cfg):
        out.append(problem)
    return out


def rank_overrides(cfg: RunSections) -> dict[str, Any]:
    """The knobs a rank trains with in place of the config's (refused combinations raise): CUDA graphs stay
    off but under 'ddp' (see GRAPHLESS); DISTRIBUTED='threaded' trains in this process, on its first
    stage's device."""
    if problem := trainer_problem(cfg):
        raise ConfigError(*problem)
    mode = cfg.parallel.distributed
    if mode in ("none", "ddp"):  # DDP graphs its steps as one process does (RankRun.graphed)
        return {}
    if mode == "threaded":
        return {"CUDA_GRAPHS": "off", "DEVICE": threaded_devices(cfg)[0]}
    return {"CUDA_GRAPHS": "off"}


def threaded_devices(cfg: RunSections) -> list[str]:
    """DISTRIBUTED='threaded': one device per stage, DEVICES resolved against DEVICE and this node."""
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    device = cfg.device.device
    return worker_devices(cfg.parallel.devices, "auto" if device.startswith("cuda:") else device, visible)


def pipeline_starts(cfg: RunSections, depth: int, world_size: int) -> list[int]:
    """The first block of every pipeline stage: PIPELINE_SPLIT, or the blocks balanced over the stages
    (one per rank, two per rank interleaved; 'threaded': one per DEVICES entry)."""
    par = cfg.parallel
    if par.distributed == "threaded":
        stages = len(threaded_devices(cfg))
    else:
        stages = stage_count(par.pipeline_schedule, world_size, par.pipeline_split)
    return stage_starts(depth, stages, par.pipeline_split)


@dataclasses.dataclass(frozen=True)
class StepTotals:
    """A step's loss (the mean of the ranks' weighted losses), samples and tokens (and of them the reference
    images' tokens) of every rank, and on a logged step every rank's (threaded: every stage device's)
    allocator peak in GiB."""

    loss: float
    samples: int
    tokens: int
    peaks_gib: list[float] | None = None
    reference_tokens: int = 0


@dataclasses.dataclass(frozen=True)
class Shards:
    """FSDP2: this rank's DCP state of a checkpoint (its shards of the trainable weights and their optimizer
    states); `write(tmp)` is a collective: every rank writes into rank 0's temporary folder `tmp`."""

    state: dict[str, Any]
    world: Any

    def write(self, tmp: Path | None) -> Path:
        return write_shards(tmp, self.state, self.world)


class RankRun:
    """This process's part of the run, applied from outside the model: the trainer hands it each phase's
    pieces and trains what comes back; in one process every phase returns them as they are, with no
    collective and nothing added to the step.

    The trainer's phases: `check_plan` (the memory plan's refusals, as soon as it exists), `sharding` (around
    building the trainable weights: FSDP2's shards), `prepare_data` (this rank's share of every micro-step),
    `prepare_model` (what the loss calls: DDP, the pipeline's stages, or the backbone), `step_fn` (the
    rank's share of a micro-step's loss), `prepare_optimizer`, `reduce_step` (every rank's totals),
    `saving` / `whole_weights` (rank 0 holds what it writes) and `whole_forward` (samples, validation);
    queries `is_main`, `fsdp`, `pipelined`, `collective_saves`, `own`; collectives `main_decides`,
    `any_rank`, `barrier`.

    The loss `step_fn` returns carries `hooks` (this object) for the step runner: whether its micro-steps
    are graphed (`graphed`) and what a graph may not hold, run eagerly around each micro-step. Under DDP,
    graphed, the backbone is not wrapped in DDP (its reducer all-reduces from autograd hooks, which a
    replayed graph never runs): each rank captures and replays its own micro-steps, and after the step's
    last one the trainable gradients are averaged with one bucketed all-reduce (`after_backward`), before
    clipping, the non-finite skip and the update. Around each micro-step: the whole step's noise cut to this
    rank and its weight written into a device scalar the graph reads (`before_micro`), the non-finite
    agreement (`after_micro`)."""

    # True: DDP's gradients averaged after the backward without graphs too (the CPU tests force the path
    # a graphed run takes); False: only when the micro-steps are graphed
    REDUCE_AFTER_BACKWARD = False

    def __init__(self, cfg: RunSections):
        self.world = current()
        self.cfg = cfg
        self.mode = cfg.parallel.distributed
        self.seed = int(cfg.run.seed)
        self.accum = int(cfg.optim.grad_accum)
        self.reduction = cfg.objective.loss_reduction
        self.find_unused = cfg.adapter.module_dropout > 0  # a dropped module leaves its params unused
        self.plan = None
        self.picks: list[list[int]] = []
        self.ddp = None
        self._sharded: torch.nn.Module | None = None  # the FSDP2-sharded backbone
        self.engine: PipelineEngine | ThreadedEngine | None = None  # the pipelines' stages
        self.staged: tuple | None = None  # (backbone, network) until the trainer's loss builds the engine
        self.capacity: tuple[int, int] | None = None
        self.host_summed: list[torch.nn.Parameter] | None = None  # DDP + GRAD_OFFLOAD: averaged on the host
        self.node_share = None  # DDP + host optimizer states: the node's one copy (host_share.py)
        self.pending: tuple | None = None  # DDP: (backbone, network) until the step runner says it graphs
        self.bound: Bound | None = None  # DDP: the forward the loss calls (DDP, or the backbone)
        self.graphs_on = False
        self.reduced: list[torch.nn.Parameter] | None = None  # DDP, graphed: averaged after the backward
        self.current = 0  # the micro-step running
        self.scale: torch.Tensor | None = None  # its rank weight, on the device (a graph reads it there)
        self._holding = False  # inside `whole_weights`: a nested one gathers nothing again

    # ---- queries

    @property
    def is_main(self) -> bool:
        return self.world.is_main

    @property
    def fsdp(self) -> bool:
        """DISTRIBUTED='fsdp' on more than one rank (one rank trains as a plain process): every rank joins
        a forward of the whole backbone (samples, validation: FSDP2 gathers each block)."""
        return self._active and self.mode == "fsdp"

    @property
    def pipelined(self) -> bool:
        """The micro-steps run through stages (DISTRIBUTED='pipeline' on several ranks, or 'threaded'),
        which cut each batch by sample."""
        return self._pipeline or self._threaded

    @property
    def collective_saves(self) -> bool:
        """A checkpoint needs every rank (FSDP2's shards, a pipeline's stages): none after an interrupt."""
        return self._sharded is not None or self._pipeline or self.node_share is not None

    def own(self, run_dir: Path) -> Path:
        """Where this rank writes its log and metrics: the run folder (rank 0) or run_dir/ranks/<rank>."""
        folder = run_dir if self.is_main else run_dir / "ranks" / str(self.world.rank)
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    @property
    def _active(self) -> bool:
        return self.world.size > 1

    @property
    def _pipeline(self) -> bool:
        """DISTRIBUTED='pipeline' on more than one rank (one rank trains as a plain process)."""
        return self._active and self.mode == "pipeline"

    @property
    def _threaded(self) -> bool:
        return self.mode == "threaded"

    # ---- collectives every rank calls together

    def main_decides(self, flag: bool) -> bool:
        """Rank 0's `flag` on every rank under FSDP2, a pipeline or node-shared DDP masters (`whole_weights`
        is a collective there), where all ranks take a branch to a collective together (rank 0 alone reads
        the run folder); `flag` itself otherwise."""
        if not (self.fsdp or self._pipeline or self.node_share is not None):
            return flag
        box = [bool(flag)]
        dist.broadcast_object_list(box, src=0)
        return bool(box[0])

    def any_rank(self, flag: bool) -> bool:
        """Whether `flag` holds on some rank, on every rank (each checks only the weights it holds: its
        shards, its stages); `flag` itself in one process."""
        if not self._active:
            return flag
        t = torch.tensor([float(bool(flag))])
        t = t.to(self.world.device) if self.world.backend == "nccl" else t
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def barrier(self) -> None:
        barrier(self.world)

    # ---- build: the model, the data, the step, the optimizer

    def check_plan(self, plan) -> None:
        """DISTRIBUTED='fsdp' or a pipeline: the resolved memory plan's engines it cannot run, refused
        (naming the engine's knob) as soon as the plan exists, before data, samples or training."""
        if plan is None:
            return
        if self.fsdp and (problem := fsdp_plan_problem(plan)):
            raise ConfigError(*problem)
        if self.pipelined and (problem := pipeline_plan_problem(plan, self.mode)):
            raise ConfigError(*problem)

    @contextmanager
    def sharding(self, model: torch.nn.Module, dtype: torch.dtype, plan=None) -> Iterator[None]:
        """Around building the trainable weights and their optimizer: DISTRIBUTED='fsdp' shards the backbone
        before a full fine-tune's optimizer is built (it steps the shards), after an adapter is (it wraps
        the sharded linears and stays whole); a no-op otherwise."""
        if self.cfg.adapter.algo == "full":
            self._shard(model, dtype, plan)
        yield
        self._shard(model, dtype, plan)  # done already for a full fine-tune

    def _shard(self, model: torch.nn.Module, dtype: torch.dtype, plan) -> None:
        """`fully_shard` each block, then the root, computing in `dtype` (PRECISION). The trainer's backbone
        comes sharded from the build (materialize.sharded_backbone: no rank holds it whole), and is only
        recorded here; one built whole is sharded here."""
        if not self.fsdp or self._sharded is not None:
            return
        self.check_plan(plan)
        built = any_sharded(model)  # materialize.sharded_backbone built it sharded already
        if not built:
            wrap_fsdp(model, param_dtype=dtype)
        self._sharded = model
        log.info(
            f"FSDP2: {len(model.layers)} blocks and the root sharded over {self.world.size} ranks "
            f"({'at build, from the meta device' if built else 'after the build'}), "
            f"computing in {dtype}; CUDA graphs off (FSDP2 all-gathers and reduce-scatters inside the "
            "step, which the step graphs do not capture)"
        )

    def prepare_data(self, data):
        """RunData whose plan holds this rank's images of every micro-step (the global plan is kept here)."""
        self.plan = data.plan
        if self.pipelined:  # every stage sees every micro-step whole
            self.capacity = capacities(data.plan.steps, self._chunks(), data.plan.knobs.max_text_tokens)
            return data
        if not self._active:
            return data
        local, self.picks = shard_plan(data.plan, self.world.rank, self.world.size)
        return dataclasses.replace(data, plan=local)

    def prepare_model(
        self, model: torch.nn.Module, network: torch.nn.Module | None, plan=None
    ) -> torch.nn.Module:
        """What the loss calls: the backbone itself, DDP around it (after resume: DDP broadcasts rank 0's),
        or (a pipeline) the stages' prediction. `plan`: the resolved memory plan; where it sums every
        gradient on the host (GRAD_OFFLOAD) DDP's reducer would see none: the backbone is returned and
        `prepare_optimizer` averages the host sums."""
        if self.pipelined:  # the stages are built with the trainer's loss (step_fn)
            self.check_plan(plan)
            self.staged = (model, network)
            self.prediction = Prediction()
            return self.prediction
        if not self._active:
            return model
        if self.fsdp:  # the backbone sharded (`sharding`); an adapter beside it stays whole, DDP averages it
            return model if network is None else self._wrap_adapter(model, network)
        if plan is not None and plan.grad_offload:  # every trainable grad goes to the host sums
            self.host_summed = trainable_params(model, network)
            return model  # no DDP: its reducer would see no gradient (host_grads.py averages them)
        self.pending, self.bound = (model, network), Bound()
        return self.bound  # DDP, or the backbone itself when graphed: bound by `graphed`

    def _wrap_adapter(self, model: torch.nn.Module, network: torch.nn.Module) -> torch.nn.Module:
        """DDP over the adapter alone (every frozen, sharded base weight is left out of its buckets):
        adapter weights replicated, their gradients all-reduced in fp32 as the backward runs."""
        if self._sharded is None:
            raise ConfigError(
                "DISTRIBUTED", "'fsdp': the backbone must be sharded (RankRun.sharding) before prepare_model"
            )
        self.ddp = wrap_ddp(model, network, find_unused=self.find_unused)
        return self.ddp

    def step_fn(self, loss: Callable, tcfg, draw: Callable) -> Callable:
        """loss(batch, sigma, noise) as this rank's share of the whole micro-step (see the class); `draw`
        is the trainer's noise function (train/step.py draw_step_noise), run on the whole step.
        Under a pipeline: the micro-step's forward and backward through the stages (`runs_backward`)."""
        if self.staged is not None:
            return self._pipeline_loss(loss)
        if not self._active:
            return loss

        self.draw, self.tcfg = draw, tcfg

        def share(batch, sigma, noise):  # what a graph captures: no host value, no collective
            last = self.current % self.accum == self.accum - 1
            sync = nullcontext() if self.ddp is None or last else self.ddp.no_sync()
            with sync:  # DDP decides at the forward whether the backward all-reduces
                value = loss(batch, sigma, noise)
            return value * self.scale.to(value.dtype)

        share.hooks = self  # the step runner calls graphed, before_micro, after_micro, after_backward
        return share

    def _pipeline_loss(self, loss: Callable) -> Callable:
        """The stages over the backbone (the trainer's `loss` on the last one) and the micro-step's loss fn."""
        model, network = self.staged
        dtype = DTYPES[self.cfg.device.precision]
        starts = pipeline_starts(self.cfg, len(model.layers), self.world.size)
        if self._threaded:
            devices = threaded_devices(self.cfg)
            self.engine = ThreadedEngine(
                model, network, starts, devices, self._chunks(), dtype, loss, self.prediction,
                self.accum, self.reduction,
            )  # fmt: skip
            where = ", ".join(devices)
        else:
            schedule = self.cfg.parallel.pipeline_schedule
            self.engine = PipelineEngine(
                model, network, self.world, starts, schedule, self._chunks(), self.capacity, dtype, loss,
                self.prediction, self.accum, self.reduction,
            )  # fmt: skip
            where = f"{self.world.size} ranks, torch.distributed.pipelining {schedule}"
        ends = [*starts[1:], len(model.layers)]
        blocks = ", ".join(f"{a}-{b - 1}" for a, b in zip(starts, ends))
        log.info(
            f"pipeline: {len(starts)} stages (blocks {blocks}) on {where}, {self._chunks()} micro-batches per "
            "micro-step; CUDA graphs off (the stages hand tensors between devices inside the step)"
        )
        engine = self.engine

        def step(batch, sigma, noise):
            return engine.run(batch, sigma, noise)

        step.runs_backward = True  # the runner takes the loss and skips its own backward
        return step

    def _chunks(self) -> int:
        """PIPELINE_CHUNKS, 0 meaning one micro-batch per stage."""
        return int(self.cfg.parallel.pipeline_chunks) or self._stages()

    def _stages(self) -> int:
        par = self.cfg.parallel
        if self._threaded:
            return len(threaded_devices(self.cfg))
        return stage_count(par.pipeline_schedule, self.world.size, par.pipeline_split)

    def prepare_optimizer(self, optimizer):
        """The optimizer the step runner steps: under a pipeline, clipped by every rank's gradients; under
        DDP with GRAD_OFFLOAD, its host-summed gradients averaged over the ranks before it reads them
        (clipping, unscaling, the update: host_grads.py), every rank starting from rank 0's weights; under
        DDP with host optimizer states, the node's ranks share one copy of the masters (host_share.py)."""
        if self._pipeline:
            return PipelineOptimizer(optimizer, self.world)
        group = None
        if self.host_summed is not None:
            if getattr(optimizer, "grad_offload", None) is None:
                raise ConfigError(
                    "GRAD_OFFLOAD",
                    "the memory plan sums gradients on the host, the optimizer has no GradOffload",
                )
            timeout = float(self.cfg.parallel.dist_timeout)
            group = host_group(self.world, timeout)
            attach(optimizer, self.host_summed, group)
            broadcast_trainable(optimizer, group)
            log.info(
                f"DDP with GRAD_OFFLOAD: {len(self.host_summed)} host-summed gradients averaged over "
                f"{self.world.size} ranks in fp32 buckets ({'the default gloo group' if group is None else 'a gloo group'}) "
                "before clipping and the update; no DDP wrapper (its reducer would see no gradient)"
            )
        if self._active and self.mode == "ddp":
            timeout = float(self.cfg.parallel.dist_timeout)
            offload = self.host_summed is not None
            made = (lambda: group) if offload else (lambda: host_group(self.world, timeout))
            self.node_share = share_on_node(optimizer, self.world, made, broadcast=not offload)
        return optimizer

    # ---- the step runner's hooks (on the loss `step_fn` returns)

    def graphed(self, on: bool) -> None:
        """The step runner's word, before any micro-step: are its micro-steps CUDA graphs? Binds the DDP
        forward: DDP around the backbone, or (graphed, or REDUCE_AFTER_BACKWARD) the backbone itself, every
        rank starting from rank 0's trainable weights and its gradients averaged by `after_backward`."""
        self.graphs_on = bool(on)
        self._bind()

    def _bind(self) -> None:
        if self.pending is None:
            return
        (model, network), self.pending = self.pending, None
        if not (self.graphs_on or self.REDUCE_AFTER_BACKWARD):
            self.ddp = wrap_ddp(model, network, find_unused=self.find_unused)
            self.bound.target = self.ddp
            return
        if self.find_unused:  # graphs refuse MODULE_DROPOUT; a forced reduction cannot skip unused ones
            raise ConfigError(
                "MODULE_DROPOUT",
                "a dropped module leaves its parameters without a gradient on some ranks only; the "
                "reduction after the backward needs every one (DDP's reducer finds them)",
            )
        self.reduced = trainable_params(model, network)
        if not self.reduced:
            raise ConfigError(
                "DISTRIBUTED", "DDP found no trainable parameter (no adapter and a frozen model)"
            )
        broadcast_params(self.reduced)  # what DDP's constructor does
        self.bound.target = model
        log.info(
            f"DDP: {len(self.reduced)} trainable gradients averaged over {self.world.size} ranks after the "
            f"backward, in fp32 buckets ({'the micro-steps are CUDA graphs' if self.graphs_on else 'forced'}); "
            "no DDP wrapper (its reducer runs from autograd hooks, which a replayed graph does not run)"
        )

    def before_micro(self, micro_step: int, batch, sigma: torch.Tensor, noise: torch.Tensor):
        """Eager, before micro-step `micro_step`'s forward: this rank's cut of the whole step's sigmas and
        noise (replacing the runner's own draws) and its weight, written where the loss reads it."""
        self._bind()
        self.current = micro_step
        sigma, noise = step_noise(
            self.draw,
            self.seed,
            micro_step,
            self.plan.steps[micro_step],
            self.picks[micro_step],
            self.tcfg,
            batch.x0.device,
            noise.dtype,
            batch.x0.shape[-1],
        )
        if self.scale is None:
            self.scale = torch.ones((), dtype=torch.float32, device=batch.x0.device)
        self.scale.fill_(self._weight(micro_step))  # a kernel argument: no host copy
        return sigma, noise

    def after_micro(self, loss: torch.Tensor) -> torch.Tensor:
        """Eager, after a micro-step: its loss, NaN on every rank where any rank's is not finite."""
        finite = torch.isfinite(loss.detach()).to(torch.float32).reshape(1)
        dist.all_reduce(finite, op=dist.ReduceOp.MIN)  # queued on the device: no host read
        return torch.where(finite.reshape(()) > 0, loss, torch.full_like(loss, math.nan))

    def after_backward(self) -> None:
        """After a step's last micro-step, before clipping and the update: graphed DDP's gradients
        averaged over the ranks (once a step, eagerly); DDP's reducer did it already otherwise."""
        if self.reduced is not None:
            average_grads(self.reduced)

    def _weight(self, micro_step: int) -> float:
        if not self._active:
            return 1.0
        return rank_weight(
            self.plan.steps[micro_step], self.picks[micro_step], self.world.size, self.reduction
        )

    # ---- after a step

    def reduce_step(
        self,
        step: int,
        loss: float,
        samples: int,
        tokens: int,
        peaks_of: torch.device | None = None,
        reference_tokens: int = 0,
    ) -> StepTotals:
        """Step `step` done: its loss (mean over ranks of their weighted losses), samples and tokens (and
        of them the references' tokens) of all ranks; the step is recorded in the store, where a fault
        message reads each rank's last step. `peaks_of` (a logged step: every rank passes it at the same
        steps): the allocator's peak of every rank in rank order, or of every stage's device under
        'threaded' (one small all-gather)."""
        loss, samples, tokens, refs = self._totals(step, loss, samples, tokens, reference_tokens)
        peaks = self._peaks_gib(peaks_of) if peaks_of is not None else None
        return StepTotals(loss, samples, tokens, peaks_gib=peaks, reference_tokens=refs)

    def _totals(
        self, step: int, loss: float, samples: int, tokens: int, refs: int
    ) -> tuple[float, int, int, int]:
        if not self._active:
            return loss, samples, tokens, refs
        beat(self.world, step)
        if self._pipeline:  # every rank ran the whole micro-steps; the loss came from the last stage
            return loss, samples, tokens, refs
        t = torch.tensor([loss, samples, tokens, refs], dtype=torch.float64)
        if self.world.backend == "nccl":
            t = t.to(self.world.device)
        dist.all_reduce(t)
        loss_sum, samples_sum, tokens_sum, refs_sum = (float(v) for v in t.cpu())
        return loss_sum / self.world.size, int(samples_sum), int(tokens_sum), int(refs_sum)

    def _peaks_gib(self, device: torch.device) -> list[float]:
        if self.mode == "threaded" and self.engine is not None:
            return [peak_memory_gib(torch.device(d)) for d in self.engine.devices]
        mine = peak_memory_gib(device)
        if not self._active:
            return [mine]
        t = torch.tensor([mine], dtype=torch.float64)
        t = t.to(self.world.device) if self.world.backend == "nccl" else t
        every = [torch.zeros_like(t) for _ in range(self.world.size)]
        dist.all_gather(every, t)
        return [float(v) for v in torch.cat(every).cpu()]

    # ---- whole-backbone forwards, saves and exports

    def whole_forward(self, backbone: torch.nn.Module):
        """A context around a call of the backbone's own forward (samples, the validation loss): under
        'threaded' it runs across the stages' devices (threaded.spread_forward); nothing otherwise."""
        if not self._threaded:
            return nullcontext()
        network = self.staged[1] if self.staged is not None else None
        starts = pipeline_starts(self.cfg, len(backbone.layers), 1)
        return spread_forward(backbone, network, starts, threaded_devices(self.cfg))

    @contextmanager
    def saving(self, tr, backbone: torch.nn.Module) -> Iterator[Shards | None]:
        """A context every rank enters around a checkpoint's save, which rank 0 writes inside (the others
        return): under FSDP2 it gives the `Shards` every rank writes into the checkpoint (the others write
        theirs and join rank 0's export gather on entering) and holds every rank until the folder has its
        name; otherwise rank 0 holds the whole weights and optimizer states inside (`whole_weights`) and
        it gives None."""
        if self._sharded is None:
            with self.whole_weights(tr, backbone):
                yield None
            return
        shards = Shards(sharded_state(tr.module, list(tr.optimizer.optimizers.values())), self.world)
        if not self.is_main:  # what rank 0's checkpoint write asks of every rank, in its order
            shards.write(None)
            with self.whole_weights(tr, backbone):  # rank 0's exports
                pass
        yield shards
        barrier(self.world)  # the folder has its name before any rank goes on

    @contextmanager
    def whole_weights(self, tr, backbone: torch.nn.Module) -> Iterator[None]:
        """A context every rank enters: rank 0 holds the whole run inside, as one process would. Under FSDP2
        its backbone holds whole weights (gather.full_weights); under a pipeline every stage's weights (the
        frozen base too: the exports merge and verify against it) and optimizer states
        (pipeline.main_holds_all / main_holds_states); under DDP with node-shared masters its node's states.
        Nothing happens otherwise, nor inside another one."""
        if self._holding:
            yield
            return
        self._holding = True
        try:
            gather = full_weights(backbone, self.world) if self._sharded is not None else nullcontext()
            with gather, self._gathered(tr, backbone):
                yield
        finally:
            self._holding = False

    @contextmanager
    def _gathered(self, tr, backbone: torch.nn.Module) -> Iterator[None]:
        if self.node_share is not None:
            with self.node_share.main_holds_states(tr.optimizer):
                yield
            return
        if not self._pipeline or self.engine is None:
            yield
            return
        starts, world = self.engine.starts, self.world
        with (
            main_holds_all(backbone, tr.network, starts, world),
            main_holds_states(tr.optimizer, self.engine.owned, world),
        ):
            yield

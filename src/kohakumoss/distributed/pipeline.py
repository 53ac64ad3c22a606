"""Pipeline parallelism over the backbone's blocks, applied from outside the model.

The backbone is cut into stages by block ranges (`stage_starts`: balanced by block count, or
PIPELINE_SPLIT's first block of each stage). Stage 0 also runs the embedders and the conditioning
(time embedding, block and head modulations); the last stage the final norm, the head and the loss.
Each trainer micro-step is cut into PIPELINE_CHUNKS micro-batches by whole samples (`chunk_shares`,
largest first onto the least-loaded chunk), which the schedule runs through the stages.

Between stages travel two tensors of fixed shape (torch's stages allocate their receive buffers once):
the residual stream x [token capacity, d] and the conditioning [8, sample capacity, d] (the six block
modulations and the two head modulations), both padded; the capacities come from the data plan
(`capacities`), a pure function of the data, so every rank computes the same ones. Each rank holds the
whole micro-step (every stage sees the same micro-batch order), so the layout of a chunk (PackedSeq,
rotary tables) is rebuilt on every stage from that; the chunk's index reaches each stage's forward as
the schedule's keyword argument `chunk`.

`PipelineEngine.run(batch, sigma, noise)` runs one micro-step's forward and backward through
torch.distributed.pipelining (ScheduleGPipe, Schedule1F1B or ScheduleInterleaved1F1B) and returns the
micro-step's loss on every rank; gradients of trainable weights land on the rank of the stage that
owns them, where that rank's optimizer steps them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from kohakumoss.model.blocks import fold_norm_weight
from kohakumoss.model.rope import rope_cos_sin
from kohakumoss.model.seq import PackedSeq
from kohakumoss_common.errors import ConfigError

from .shard import assign
from .world import World

SCHEDULES = ("gpipe", "1f1b", "interleaved")
# the backbone's modules outside `layers`: stage 0 embeds and conditions, the last stage predicts
FIRST_MODULES = (
    "video_embedder",
    "text_embedder",
    "time_embedding",
    "shared_block_modulation",
    "video_head_modulation",
)
LAST_MODULES = ("final_norm_video", "final_linear_video")
COND_ROWS = 8  # shift_a, scale_a, gate_a, shift_f, scale_f, gate_f, then the head's shift, scale


# ---- the split: pure functions of the knobs and the depth


def split_problem(split: Any, depth: int | None, stages: int | None) -> str | None:
    """Why PIPELINE_SPLIT cannot cut a backbone of `depth` blocks into `stages` stages (None: unknown)."""
    if not isinstance(split, (list, tuple)) or any(
        isinstance(s, bool) or not isinstance(s, int) for s in split
    ):
        return f"expected a list of block indices (the first block of each stage), got {split!r}"
    if not split:
        return None
    if split[0] != 0:
        return f"{list(split)}: the first stage starts at block 0"
    if any(b <= a for a, b in zip(split, split[1:])):
        return f"{list(split)}: the first blocks must increase (every stage holds at least one block)"
    if depth is not None and split[-1] >= depth:
        return f"{list(split)}: block {split[-1]} is past the backbone's last block ({depth - 1})"
    if stages is not None and len(split) != stages:
        return f"{list(split)} gives {len(split)} stages, the run has {stages}"
    return None


def stage_starts(depth: int, stages: int, split: Sequence[int] = ()) -> list[int]:
    """The first block of every stage: PIPELINE_SPLIT, or `depth` blocks balanced over `stages`."""
    if split:
        if problem := split_problem(list(split), depth, stages):
            raise ConfigError("PIPELINE_SPLIT", problem)
        return list(split)
    if stages > depth:
        raise ConfigError(
            "DEVICES", f"{stages} pipeline stages for a backbone of {depth} blocks (each stage needs one)"
        )
    return [s * depth // stages for s in range(stages)]


def stage_count(schedule: str, world: int, split: Sequence[int] = ()) -> int:
    """Stages of the pipeline: PIPELINE_SPLIT's count, else one per rank (two per rank interleaved)."""
    if split:
        return len(split)
    return world * (2 if schedule == "interleaved" else 1)


def stage_of_block(block: int, starts: Sequence[int]) -> int:
    return max(s for s, first in enumerate(starts) if first <= block)


def owner_stage(name: str, starts: Sequence[int]) -> int:
    """The stage that owns a backbone module or parameter named `name` (`layers.3.proj.q.weight`)."""
    head = name.split(".")[0]
    if head == "layers":
        return stage_of_block(int(name.split(".")[1]), starts)
    if head in LAST_MODULES:
        return len(starts) - 1
    return 0  # the embedders, the modulations, and buffers such as the rotary bands


def module_owners(backbone: nn.Module, starts: Sequence[int]) -> dict[int, int]:
    """id(module) -> its stage, for every module of the backbone (adapters find their linear's stage)."""
    return {id(m): owner_stage(n, starts) for n, m in backbone.named_modules() if n and n != "layers"}


def adapter_stage(module: nn.Module, owners: dict[int, int]) -> int | None:
    """The stage of the backbone linear a LyCORIS module wraps (None: it wraps nothing of the backbone)."""
    wrapped = getattr(module, "org_module", None)
    target = wrapped[0] if isinstance(wrapped, (list, tuple)) and wrapped else wrapped
    return owners.get(id(target)) if target is not None else None


# ---- micro-batches: whole samples of a micro-step


def chunk_shares(image_tokens: Sequence[int], chunks: int) -> list[list[int]]:
    """Sample indices per micro-batch: largest first onto the least-loaded one (shard.assign)."""
    return assign(list(image_tokens), chunks)


def capacities(steps: Sequence[Sequence[Any]], chunks: int, max_text: int) -> tuple[int, int]:
    """(tokens, samples) that bound every micro-batch of the plan: the fixed shapes sent between stages.
    A planned item knows its image tokens exactly and its caption's only as MAX_TEXT_TOKENS' bound."""
    tokens = samples = 1
    for i, step in enumerate(steps):
        if len(step) < chunks:
            raise ConfigError(
                "PIPELINE_CHUNKS",
                f"micro-step {i} of the plan holds {len(step)} image(s) for {chunks} micro-batches: each "
                "needs one; lower PIPELINE_CHUNKS or raise TOKENS_PER_STEP",
            )
        lens = [it.image_tokens for it in step]
        for share in chunk_shares(lens, chunks):
            tokens = max(tokens, sum(lens[j] for j in share) + len(share) * max_text)
            samples = max(samples, len(share))
    return tokens, samples


@dataclass
class Chunk:
    """One micro-batch: its samples' clean latents, text, layout, sigmas, noise and loss weight."""

    batch: Any  # train.step.DeviceBatch (not imported: this package sits below train)
    sigma: torch.Tensor
    noise: torch.Tensor
    weight: float  # its units / the micro-step's units / GRAD_ACCUM
    share: float  # its units / the micro-step's units: its part of the micro-step's logged loss
    placed: dict = field(default_factory=dict)  # device -> the chunk's tensors there

    def on(self, device: torch.device) -> Chunk:
        """The chunk with its tensors on `device` (copied once per device)."""
        key = str(device)
        if key not in self.placed:
            if str(self.batch.x0.device) == key:
                self.placed[key] = self
            else:
                b = self.batch
                moved = type(b)(
                    b.x0.to(device),
                    b.text.to(device),
                    b.seq.to(device),
                    b.weight.to(device) if b.weight is not None else None,
                )
                self.placed[key] = Chunk(
                    moved, self.sigma.to(device), self.noise.to(device), self.weight, self.share
                )
        return self.placed[key]


REFERENCES_UNSUPPORTED = (
    "the pipeline engines (pipeline, threaded) cut the joint axis into stages without reference images: "
    "train an edit dataset (a 'references' option) with none, ddp or fsdp"
)


def cut_chunks(
    batch, sigma: torch.Tensor, noise: torch.Tensor, chunks: int, accum: int, reduction: str
) -> list[Chunk]:
    """The micro-step (`batch`, its sigmas and noise drawn whole, as one process draws them) as
    `chunks` micro-batches of whole samples, each with its share of the loss."""
    seq = batch.seq
    img, text = list(seq.img_lens), list(seq.text_lens)
    if seq.has_references:  # preflight refuses this first (`REFERENCES_UNSUPPORTED`): a data change mid-run
        raise ConfigError("DISTRIBUTED", REFERENCES_UNSUPPORTED)
    if seq.text_pad:
        raise ConfigError("CUDA_GRAPHS", "padded captions reached the pipeline; CUDA graphs stay off there")
    img_start, text_start = _starts(img), _starts(text)
    units = [n if reduction == "token" else 1 for n in img]
    total = sum(units)
    out = []
    for share in chunk_shares(img, chunks):
        rows = torch.cat([torch.arange(img_start[i], img_start[i] + img[i]) for i in share]).to(
            batch.x0.device
        )
        trows = torch.cat([torch.arange(text_start[i], text_start[i] + text[i]) for i in share])
        trows = trows.to(batch.text.device)
        part = PackedSeq.build([text[i] for i in share], [seq.img_sizes[i] for i in share], batch.x0.device)
        weight = batch.weight.index_select(0, rows) if batch.weight is not None else None
        cut = type(batch)(batch.x0.index_select(0, rows), batch.text.index_select(0, trows), part, weight)
        picks = torch.tensor(share, device=sigma.device)
        frac = sum(units[i] for i in share) / total
        out.append(Chunk(cut, sigma.index_select(0, picks), noise.index_select(0, rows), frac / accum, frac))
    return out


def _starts(lens: Sequence[int]) -> list[int]:
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return out


# ---- the stages


class Prediction:
    """What the trainer's loss calls as its model on the last stage: the prediction that stage computed.

    The trainer builds its loss (train/trainer.py `step_loss_fn`: the objective, its weighting and
    reduction) over the forward `RankRun.prepare_model` returns; under a pipeline that forward is this, so
    the last stage computes the loss exactly as one process does, from its own prediction."""

    def __init__(self):
        self.pred: torch.Tensor | None = None

    def __call__(self, *args, **kwargs) -> torch.Tensor:
        if self.pred is None:
            raise RuntimeError("the pipeline's loss was called outside its last stage")
        pred, self.pred = self.pred, None
        return pred


@dataclass
class StepChunks:
    """The current micro-step's micro-batches, shared by every stage of this process."""

    chunks: list[Chunk] = field(default_factory=list)
    losses: list[torch.Tensor] = field(default_factory=list)  # the last stage's share-weighted losses


class StageModule(nn.Module):
    """Blocks [first, end) of the backbone, with the embedders before them (stage 0) or the head and the
    loss after them (the last stage). Its forward takes the previous stage's (x, cond) (stage 0: the chunk
    index as its root input) and the keyword `chunk`; it returns (x, cond) padded to the capacities, or
    on the last stage the chunk's weighted loss as a [1] tensor.

    The backbone is held outside the module tree, so `parameters()` are the owned blocks' own."""

    def __init__(
        self,
        backbone: nn.Module,
        index: int,
        starts: Sequence[int],
        state: StepChunks,
        loss: Callable,
        prediction: Prediction,
        dtype: torch.dtype,
        capacity: tuple[int, int] | None,
        device: torch.device,
    ):
        """capacity: (tokens, samples) the outputs are padded to (torch's stages receive fixed shapes);
        None: sent as they are (the threaded pipeline passes tensors, not buffers)."""
        super().__init__()
        depth = len(backbone.layers)
        self.index, self.num_stages = index, len(starts)
        self.first, self.last = index == 0, index == len(starts) - 1
        end = starts[index + 1] if index + 1 < len(starts) else depth
        self.block_ids = list(range(starts[index], end))
        self.blocks = nn.ModuleList(backbone.layers[i] for i in self.block_ids)
        self._backbone = [backbone]  # a list: not registered as a submodule
        self.state, self.loss, self.prediction = state, loss, prediction
        self.dtype, self.capacity, self.device = dtype, capacity, torch.device(device)

    @property
    def backbone(self) -> nn.Module:
        return self._backbone[0]

    def stream_dtype(self) -> torch.dtype:
        """The residual stream's dtype: the backbone's residual dtype, else the compute dtype."""
        return self.backbone.residual_dtype or self.dtype

    def metas(self) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
        """(inputs, outputs) on the meta device: the fixed shapes torch's stage allocates once."""
        d = self.backbone.config.dim
        tokens, samples = self.capacity

        def meta(shape, dtype, grad=True):
            return torch.empty(shape, dtype=dtype, device="meta", requires_grad=grad)

        acts = (meta((tokens, d), self.stream_dtype()), meta((COND_ROWS, samples, d), self.dtype))
        inputs = (meta((1,), torch.long, grad=False),) if self.first else acts
        outputs = (meta((1,), torch.float32),) if self.last else acts
        return inputs, outputs

    def forward(self, *acts: torch.Tensor, chunk: torch.Tensor):
        c = self.state.chunks[int(chunk.reshape(-1)[0])].on(self.device)
        seq, cfg, model = c.batch.seq, self.backbone.config, self.backbone
        enabled = self.dtype != torch.float32
        with torch.autocast(self.device.type, dtype=self.dtype, enabled=enabled):
            rope = rope_cos_sin(seq.positions, cfg.head_dim, cfg.rope_theta)
            if self.first:
                x, cond = self.embed(c, rope)
            else:
                x, cond = acts[0][: seq.total_tokens], acts[1][:, : seq.num_samples]
            mod = cond[:6].contiguous()
            run, ops = model.block_runner, model.ops
            for block in self.blocks:
                x = run(block, x, mod, seq, rope) if run is not None else block(x, mod, seq, rope, ops)
            if self.last:
                pred = self.head(x, cond[6:].contiguous(), seq)
        if self.last:
            self.prediction.pred = pred
            value = self.loss(c.batch, c.sigma, c.noise)
            self.state.losses.append(value.detach().float() * c.share)
            return (value.float() * c.weight).reshape(1)
        if self.capacity is None:
            return x, cond
        tokens, samples = self.capacity
        if x.shape[0] > tokens or cond.shape[1] > samples:
            raise RuntimeError(
                f"micro-batch of {x.shape[0]} tokens, {cond.shape[1]} samples over the pipeline's capacity "
                f"({tokens}, {samples}) from the data plan"
            )
        x = F.pad(x.to(self.stream_dtype()), (0, 0, 0, tokens - x.shape[0]))
        cond = F.pad(cond.to(self.dtype), (0, 0, 0, samples - cond.shape[1]))
        return x, cond

    def embed(self, c: Chunk, rope) -> tuple[torch.Tensor, torch.Tensor]:
        """MossBackbone.forward up to its first block: the noised latents and the text on the joint axis,
        and the block and head modulations as one [8, B, d] conditioning tensor."""
        from kohakumoss.diffusion import make_flow_target

        model, seq = self.backbone, c.batch.seq
        x_t = make_flow_target(c.batch.x0, c.sigma, seq.img_token_sample, c.noise).x_t
        mod, head = model.modulations(c.sigma)
        x = model.embed(x_t, c.batch.text, seq, rope)
        return x, torch.cat([mod.to(self.dtype), head.to(self.dtype)])

    def head(self, x: torch.Tensor, head: torch.Tensor, seq: PackedSeq) -> torch.Tensor:
        """MossBackbone.forward after its last block: the modulated final norm and the output linear."""
        model = self.backbone
        shift, scale = head.unbind(0)
        scale = fold_norm_weight(model.final_norm_video.weight, scale)
        y = model.ops.norm_modulate(
            x[seq.img_index], shift, scale, seq.img_token_sample, model.config.norm_eps
        )
        return model.final_linear_video(y)


def place_stages(
    backbone: nn.Module, network: nn.Module | None, starts: Sequence[int], devices: Sequence
) -> None:
    """Each stage's modules (and the adapter modules wrapping its linears) onto that stage's device;
    `devices[s]` None leaves stage s where it is."""
    owners = module_owners(backbone, starts)
    for name, module in backbone.named_children():
        if name == "layers":
            for i, block in enumerate(module):
                _place(block, devices[stage_of_block(i, starts)])
        else:
            _place(module, devices[owner_stage(name, starts)])
    if network is not None:
        for module in network.modules():
            stage = adapter_stage(module, owners)
            if stage is not None:
                _place(module, devices[stage])


def _place(module: nn.Module, device) -> None:
    """`module` onto `device`; one left on the meta device (a stage another rank built) stays there."""
    if device is not None and not any(t.is_meta for t in module.parameters()):
        module.to(device)


# ---- the engine over torch.distributed.pipelining


def build_schedule(name: str, stages: list, chunks: int, loss_fn: Callable):
    """torch's schedule for PIPELINE_SCHEDULE; gradients are not rescaled by the schedule (each
    micro-batch's loss carries its own weight, so gradient accumulation over micro-steps stays a sum)."""
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    if name == "interleaved":
        return ScheduleInterleaved1F1B(stages, chunks, loss_fn=loss_fn, scale_grads=False)
    if len(stages) != 1:
        raise ConfigError(
            "PIPELINE_SPLIT", f"{len(stages)} stages on one rank need PIPELINE_SCHEDULE='interleaved'"
        )
    kind = ScheduleGPipe if name == "gpipe" else Schedule1F1B
    return kind(stages[0], chunks, loss_fn=loss_fn, scale_grads=False)


def _loss_of_output(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return output.sum()  # the last stage's output already is the micro-batch's weighted loss


class PipelineEngine:
    """This rank's stages of the pipeline and torch's schedule over them."""

    def __init__(
        self,
        backbone: nn.Module,
        network: nn.Module | None,
        world: World,
        starts: Sequence[int],
        schedule: str,
        chunks: int,
        capacity: tuple[int, int],
        dtype: torch.dtype,
        loss: Callable,
        prediction: Prediction,
        accum: int,
        reduction: str,
    ):
        from torch.distributed.pipelining import PipelineStage

        self.world, self.starts, self.chunks = world, list(starts), int(chunks)
        self.accum, self.reduction = int(accum), reduction
        self.state = StepChunks()
        n = len(starts)
        self.local = [s for s in range(n) if s % world.size == world.rank]
        self.last_rank = (n - 1) % world.size
        # the stages this rank does not run: on the meta device when the trainer built the backbone (only
        # this rank's stages materialized), else (a backbone built whole) moved to the host
        host = torch.device("cpu")
        place_stages(backbone, network, starts, [world.device if s in self.local else host for s in range(n)])
        self.modules = [
            StageModule(backbone, s, starts, self.state, loss, prediction, dtype, capacity, world.device)
            for s in self.local
        ]
        stages = []
        for s, module in zip(self.local, self.modules):
            inputs, outputs = module.metas()
            stages.append(PipelineStage(module, s, n, world.device, input_args=inputs, output_args=outputs))
        self.schedule = build_schedule(schedule, stages, self.chunks, _loss_of_output)
        self.has_first = 0 in self.local
        self.owned = owned_params(backbone, network, starts, set(self.local))

    def run(self, batch, sigma: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """One micro-step's forward and backward through the schedule; its loss (every rank's copy)."""
        self.state.chunks = cut_chunks(batch, sigma, noise, self.chunks, self.accum, self.reduction)
        self.state.losses = []
        index = torch.arange(self.chunks)
        args = (index,) if self.has_first else ()
        try:
            self.schedule.step(*args, target=index, chunk=index)
        finally:
            self.state.chunks = []
        value = torch.zeros((), dtype=torch.float64)
        if self.state.losses:
            value += torch.stack(self.state.losses).sum().double().cpu()
        if self.world.backend == "nccl":
            value = value.to(self.world.device)
        dist.all_reduce(value)  # only the last stage's rank adds a loss: every rank gets it
        return value.float().to(batch.x0.device)


class PipelineOptimizer:
    """The trainer's optimizer on one pipeline rank: it steps the parameters whose gradients landed here
    (other stages' parameters never get one), and clips by the norm of every rank's gradients together,
    as one process clips the whole model's."""

    def __init__(self, optimizer, world: World):
        self._optimizer, self._world = optimizer, world

    def __getattr__(self, name: str):
        return getattr(self._optimizer, name)

    @property
    def param_groups(self):
        return self._optimizer.param_groups

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        grads = [p.grad for g in self._optimizer.param_groups for p in g["params"] if p.grad is not None]
        device = self._world.device if self._world.backend == "nccl" else torch.device("cpu")
        square = torch.zeros((), dtype=torch.float32, device=device)
        for g in grads:
            square += torch.linalg.vector_norm(g, 2.0, dtype=torch.float32).to(device) ** 2
        dist.all_reduce(square)
        total = square.sqrt()
        if math.isfinite(max_norm):
            coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
            for g in grads:
                g.mul_(coef.to(g.device, g.dtype))
        return total


def owned_params(backbone: nn.Module, network: nn.Module | None, starts: Sequence[int], local) -> set[int]:
    """id() of every parameter the stages `local` own: their blocks' (and stage 0's embedders, the last
    stage's head), and the adapter modules wrapping their linears."""
    ids = {id(p) for n, p in backbone.named_parameters() if owner_stage(n, starts) in local}
    if network is not None:
        owners = module_owners(backbone, starts)
        for module in network.modules():
            if adapter_stage(module, owners) in local:
                ids.update(id(p) for p in module.parameters())
    return ids


def param_ranks(
    backbone: nn.Module, network: nn.Module | None, starts: Sequence[int], world_size: int
) -> list[tuple[nn.Module, str, nn.Parameter, int]]:
    """(owner module, name, parameter, rank of its stage) of every backbone and adapter parameter, in
    the same order on every rank (every rank built the same modules, held or on the meta device)."""
    out = []
    for fqn, p in backbone.named_parameters():
        owner, _, name = fqn.rpartition(".")
        out.append((backbone.get_submodule(owner), name, p, owner_stage(fqn, starts) % world_size))
    if network is not None:  # an adapter module's parameters (its lora_down, lora_up) go with its linear
        owners, rank = module_owners(backbone, starts), {}
        for module in network.modules():
            if (stage := adapter_stage(module, owners)) is not None:
                rank.update({id(p): stage % world_size for p in module.parameters()})
        for fqn, p in network.named_parameters():
            owner, _, name = fqn.rpartition(".")
            out.append((network.get_submodule(owner), name, p, rank.get(id(p), 0)))
    return out


def _carrier(world: World) -> torch.device:
    """Where tensors travel between ranks: the rank's GPU under NCCL, the host under gloo."""
    return world.device if world.backend == "nccl" else torch.device("cpu")


@contextmanager
def main_holds_all(
    backbone: nn.Module, network: nn.Module | None, starts: Sequence[int], world: World
) -> Iterator[None]:
    """A collective: inside, rank 0's backbone and adapter hold every stage's current parameters, whole
    and on the host (each sent by its stage's rank, one tensor at a time, point to point), so rank 0
    saves and exports what one process would; its own parameters (meta ones included) come back on
    exit. Nothing may run a forward inside (the received weights sit on the host)."""
    swapped = []
    carrier = _carrier(world)
    try:
        for owner, name, p, rank in param_ranks(backbone, network, starts, world.size):
            if rank == 0:
                continue
            if world.rank == rank:
                dist.send(p.detach().to(carrier).contiguous(), dst=0)
            elif world.is_main:
                got = torch.empty(p.shape, dtype=p.dtype, device=carrier)
                dist.recv(got, src=rank)
                owner._parameters[name] = nn.Parameter(got.cpu(), requires_grad=p.requires_grad)
                swapped.append((owner, name, p))
        yield
    finally:
        for owner, name, p in swapped:
            owner._parameters[name] = p


@contextmanager
def main_holds_states(optimizer, owned: set[int], world: World) -> Iterator[None]:
    """A collective: inside, rank 0's optimizer holds every rank's states of the parameters that rank
    steps (its state_dict is the one-process run's); on exit rank 0 drops the states it received. The
    states' names, shapes and plain values travel as one small object per rank, their tensors point to
    point. The members' parameter order is the same everywhere."""
    carrier = _carrier(world)
    received = []
    try:
        for opt in getattr(optimizer, "optimizers", {}).values():
            params = [p for g in opt.param_groups for p in g["params"]]
            mine = {}  # index -> {key: (shape, dtype) of a tensor, or the plain value}
            for i, p in enumerate(params):
                if id(p) in owned and p in opt.state:
                    mine[i] = {
                        k: ("tensor", tuple(v.shape), v.dtype) if torch.is_tensor(v) else ("value", v)
                        for k, v in opt.state[p].items()
                    }
            parts: list[Any] = [None] * world.size
            dist.all_gather_object(parts, mine)
            for r in range(1, world.size):
                for i, entries in parts[r].items():
                    state = {}
                    for key, entry in entries.items():
                        if entry[0] == "value":
                            state[key] = entry[1]
                        elif world.rank == r:
                            dist.send(opt.state[params[i]][key].detach().to(carrier).contiguous(), dst=0)
                        elif world.is_main:
                            got = torch.empty(entry[1], dtype=entry[2], device=carrier)
                            dist.recv(got, src=r)
                            state[key] = got.cpu()
                    if world.is_main:
                        opt.state[params[i]] = state
                        received.append((opt, params[i]))
        yield
    finally:
        for opt, p in received:
            opt.state.pop(p, None)

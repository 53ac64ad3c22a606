"""The released sampler: Euler on the velocity, classifier-free guidance with skip-layer guidance.

Per step i of n (sigmas from `released_sigmas`, float32):
    cond   = backbone(x, text, sigma_i)
    uncond = backbone(x, negative, sigma_i, skip_layers)   skip_layers while slg_start <= i/n < slg_stop
    v      = uncond + cfg * (cond - uncond)                float32
    x      = x + (sigma_{i+1} - sigma_i) * v               x float32; v = noise - x0 (objective.py)

Initial noise per image: float32 `torch.randn(1, C, h, w)` from a CPU generator seeded with the image's
seed, as the released pipeline draws it; its [C, h, w] grid is the image's tokens row-major with C
features (encoders/latents.py). So a seed gives the released pipeline's noise, whatever else is in the
batch. The images of a batch run packed on one token axis.

How it runs (`SamplerSpeed`; never what it computes):
- batch_cfg: both branches in one packed forward at every step, the conditional samples first; a block
  the unconditional branch skips runs on the conditional tokens alone (`MossBackbone`'s `keep_lead`).
  Off: one forward per branch (the plain path the batched one is tested against).
- reference_cache: with reference images, each kind of step (its skip set) runs the full layout
  once, recording every block's reference keys and values; its later steps run the target and text
  tokens alone against them (model/reference_kv.py: exact, the references never see the live tokens).
- cuda_graphs: on a CUDA backbone without a memory-plan block runner, each kind of step (with or without
  the skip) is captured the second time it runs and replayed after: the state x, sigma_i and
  sigma_{i+1} live in fixed device buffers the graph reads. The first step of each kind runs eagerly in
  the kernel registry's tuning window.
"""

from __future__ import annotations

import contextlib
import math
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from kohakumoss.model.backbone import pack_references
from kohakumoss.model.reference_kv import ReferenceKVSeq, recording, replaying
from kohakumoss.model.seq import PackedSeq
from kohakumoss_common.errors import ConfigError
from kohakumoss_common.log import get_logger

from .schedule import RELEASED_SHIFT, released_sigmas

log = get_logger(__name__)

RELEASED_UNCOND_SKIP_LAYERS = (22,)  # 0-indexed block the released sampler leaves out of the uncond branch


@dataclass(frozen=True)
class SamplerConfig:
    """The released settings by default (50 steps, CFG 3, shift 5, uncond skips block 22 at every step).

    slg_start / slg_stop: the fraction of the steps (i / n, start inclusive, stop exclusive) during which
    the unconditional branch skips `uncond_skip_layers`.
    """

    steps: int = 50
    cfg_scale: float = 3.0
    shift: float = RELEASED_SHIFT
    uncond_skip_layers: tuple[int, ...] = RELEASED_UNCOND_SKIP_LAYERS
    slg_start: float = 0.0
    slg_stop: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "uncond_skip_layers", tuple(self.uncond_skip_layers))
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ConfigError("STEPS", f"must be a whole number >= 1, got {self.steps!r}")
        if not math.isfinite(self.cfg_scale) or self.cfg_scale < 0:
            raise ConfigError("CFG", f"must be finite and >= 0, got {self.cfg_scale!r}")
        if not math.isfinite(self.shift) or self.shift <= 0:
            raise ConfigError("SHIFT", f"must be finite and > 0, got {self.shift!r}")
        if not 0 <= self.slg_start <= self.slg_stop <= 1:
            raise ConfigError(
                "SLG_START", f"need 0 <= SLG_START <= SLG_STOP <= 1, got {self.slg_start}, {self.slg_stop}"
            )
        bad = [i for i in self.uncond_skip_layers if isinstance(i, bool) or not isinstance(i, int) or i < 0]
        if bad:
            raise ConfigError("UNCOND_SKIP_LAYERS", f"block indices are whole numbers >= 0, got {bad}")

    @property
    def guided(self) -> bool:
        return self.cfg_scale != 1.0

    def check_depth(self, depth: int) -> None:
        """A skip index the model does not have is an error, not a silent no-op."""
        missing = sorted(i for i in set(self.uncond_skip_layers) if i >= depth)
        if missing:
            raise ConfigError(
                "UNCOND_SKIP_LAYERS",
                f"blocks {missing} do not exist in this {depth}-block model (indices 0..{depth - 1}); "
                "[] turns skip-layer guidance off",
            )

    def skip_at(self, i: int, n: int) -> tuple[int, ...]:
        """The blocks the unconditional branch leaves out at step i of n."""
        return self.uncond_skip_layers if self.slg_start <= i / n < self.slg_stop else ()


def released_uncond_skip_layers(depth: int) -> tuple[int, ...]:
    """The released skip where the model has that block, else none (small test models)."""
    return tuple(i for i in RELEASED_UNCOND_SKIP_LAYERS if i < depth)


def initial_noise(grid: tuple[int, int], seed: int, channels: int = 128) -> torch.Tensor:
    """The released pipeline's starting noise for one image as tokens [h * w, channels], float32."""
    h, w = grid
    generator = torch.Generator("cpu").manual_seed(int(seed))
    z = torch.randn(1, channels, h, w, generator=generator, dtype=torch.float32)
    return z[0].reshape(channels, h * w).T.contiguous()


def backbone_depth(backbone: Callable[..., torch.Tensor]) -> int | None:
    config = getattr(backbone, "config", None)
    return getattr(config, "depth", None)


GRAPH_MODES = ("auto", "on", "off")


@dataclass(frozen=True)
class SamplerSpeed:
    """How the sampler runs; every setting gives the same images (within float rounding)."""

    batch_cfg: bool = True  # both CFG branches in one packed forward per step
    cuda_graphs: str = "auto"  # auto: graph the steps where possible; on: refuse where not; off: eager
    reference_cache: bool = True  # reference K/V recorded by each kind's first step, read after it

    def __post_init__(self) -> None:
        if self.cuda_graphs not in GRAPH_MODES:
            raise ConfigError("CUDA_GRAPHS", f"'{self.cuda_graphs}' is not one of {GRAPH_MODES}")


DEFAULT_SPEED = SamplerSpeed()


def graph_refusal(backbone: Callable[..., torch.Tensor], device: torch.device | str) -> str | None:
    """Why the denoising step cannot be a CUDA graph here (naming the knob), or None."""
    device = torch.device(device)
    if device.type != "cuda":
        return f"DEVICE: CUDA graphs need a CUDA device, not {device.type}"
    if getattr(backbone, "block_runner", None) is not None:
        return "STREAM_BLOCKS: the memory plan's block runner moves weights from Python per block"
    return None


def use_graphs(speed: SamplerSpeed, backbone: Callable[..., torch.Tensor], device) -> bool:
    refusal = graph_refusal(backbone, device)
    if speed.cuda_graphs == "on" and refusal is not None:
        raise ConfigError("CUDA_GRAPHS", f"'on' is not possible here: {refusal}")
    return speed.cuda_graphs != "off" and refusal is None


class _Layout:
    """One forward's packed texts, images and reference tokens. With the reference cache, the first
    forward of each kind (a skip set) runs the full layout and records the references' K/V, the later
    ones run the live tokens alone (model/reference_kv.py)."""

    def __init__(self, texts, img_sizes, references, device, dtype, cache: bool):
        self.text = torch.cat([t.to(device, dtype) for t in texts])
        tokens, ref_sizes = pack_references(references) if references is not None else (None, None)
        self.seq = PackedSeq.build([t.shape[0] for t in texts], img_sizes, device, ref_sizes=ref_sizes)
        self.refs = tokens.to(device, dtype) if tokens is not None and self.seq.has_references else None
        self.cache = cache and self.refs is not None
        self.kinds: dict[object, ReferenceKVSeq] = {}

    def inputs(self, kind: object = ()) -> tuple[PackedSeq, dict]:
        """(layout, backbone keywords) of this kind's next forward."""
        if self.refs is None:
            return self.seq, {}
        if not self.cache:
            return self.seq, {"refs": self.refs}
        seen = self.kinds.get(kind)
        if seen is None:  # the kind's first forward: the full layout, recording
            self.kinds[kind] = recording(self.seq)
            return self.kinds[kind], {"refs": self.refs}
        if seen.live_segments is None:
            self.kinds[kind] = seen = replaying(seen)
        return seen, {}

    @property
    def cached_bytes(self) -> int:
        return sum(seq.reference_kv.nbytes for seq in self.kinds.values())


class _Velocity:
    """v (float32, guided) of the image tokens at one step; the texts, layouts and references fixed for
    the run (both branches get the references: facts 1.3)."""

    def __init__(
        self, backbone, cond, uncond, img_sizes, config: SamplerConfig, device, dtype, batch_cfg,
        references=None, reference_cache: bool = True,
    ):  # fmt: skip
        self.backbone, self.config, self.dtype = backbone, config, dtype
        self.guided = uncond is not None and config.guided
        self.batch = batch_cfg and self.guided
        self.B = len(cond)
        cache = reference_cache and isinstance(backbone, torch.nn.Module)
        self.cond = _Layout(cond, img_sizes, references, device, dtype, cache)
        if self.guided and not self.batch:
            self.uncond = _Layout(uncond, img_sizes, references, device, dtype, cache)
        if self.batch:
            both_refs = None if references is None else [*references, *references]
            self.both = _Layout([*cond, *uncond], [*img_sizes, *img_sizes], both_refs, device, dtype, cache)

    def __call__(self, x: torch.Tensor, sigma: torch.Tensor, skip: tuple[int, ...]) -> torch.Tensor:
        """x [T, C] float32, sigma a 0-dim float32 tensor; skip: the blocks the uncond branch leaves out."""
        img, B, net = x.to(self.dtype), self.B, self.backbone
        if not self.guided:
            seq, kw = self.cond.inputs()
            return net(img, self.cond.text, sigma.expand(B), seq, **kw).float()
        if self.batch:
            seq, kw = self.both.inputs(skip)
            if skip:  # the leading (conditional) samples run the skipped blocks on their own layout
                lead, _ = self.cond.inputs(("lead", skip))
                kw = {**kw, "skip_layers": frozenset(skip), "keep_lead": lead}
            both = net(torch.cat([img, img]), self.both.text, sigma.expand(2 * B), seq, **kw)
            v_c, v_u = both.float().split(x.shape[0])
        else:
            seq, kw = self.cond.inputs()
            v_c = net(img, self.cond.text, sigma.expand(B), seq, **kw).float()
            seq, kw = self.uncond.inputs(skip)
            kw = {**kw, "skip_layers": frozenset(skip)} if skip else kw
            v_u = net(img, self.uncond.text, sigma.expand(B), seq, **kw).float()
        return v_u + self.config.cfg_scale * (v_c - v_u)

    @property
    def cached_bytes(self) -> int:
        layouts = [getattr(self, name, None) for name in ("cond", "uncond", "both")]
        return sum(layout.cached_bytes for layout in layouts if layout is not None)

    def step(self, x: torch.Tensor, now: torch.Tensor, nxt: torch.Tensor, skip: tuple[int, ...]) -> None:
        """One Euler step, in place on x (what a graph replays)."""
        x.add_((nxt - now) * self(x, now, skip))


class _Steps:
    """Runs the steps: eagerly, or each kind (its skip) captured in a CUDA graph on its second run."""

    def __init__(self, velocity: _Velocity, x: torch.Tensor, graphs: bool, required: bool):
        self.velocity, self.x, self.graphs, self.required = velocity, x, graphs, required
        self.ops = getattr(velocity.backbone, "ops", None)
        self.seen: Counter = Counter()
        self.captured: dict[tuple[int, ...], torch.cuda.CUDAGraph] = {}
        self.failed: str | None = None
        self.replays = 0
        if graphs:  # the step's sigmas: device buffers the graphs read
            self.now = torch.zeros((), device=x.device)
            self.nxt = torch.zeros((), device=x.device)
            self.pool = torch.cuda.graph_pool_handle()

    def tuning(self) -> contextlib.AbstractContextManager:
        """The kernel registry's tuning window (as the trainer's first step has it)."""
        return self.ops.tuning() if hasattr(self.ops, "tuning") else contextlib.nullcontext()

    def __call__(self, sigmas: torch.Tensor, i: int, skip: tuple[int, ...]) -> None:
        graph = self.captured.get(skip)
        if graph is not None:
            self.now.copy_(sigmas[i])
            self.nxt.copy_(sigmas[i + 1])
            graph.replay()
            self.replays += 1
            return
        self.seen[skip] += 1
        if self.seen[skip] == 1:
            with self.tuning():
                self.velocity.step(self.x, sigmas[i], sigmas[i + 1], skip)
        elif not self.graphs or self.failed is not None:
            self.velocity.step(self.x, sigmas[i], sigmas[i + 1], skip)
        else:
            self._capture(sigmas, i, skip)

    @contextlib.contextmanager
    def _no_autocast_cache(self) -> Iterator[None]:
        """A capture keeps autocast on as the caller set it, without its cast cache (torch's graph rule)."""
        kind = self.x.device.type
        with torch.autocast(
            kind,
            dtype=torch.get_autocast_dtype(kind),
            enabled=torch.is_autocast_enabled(kind),
            cache_enabled=False,
        ):
            yield

    def _capture(self, sigmas: torch.Tensor, i: int, skip: tuple[int, ...]) -> None:
        device = self.x.device
        self.now.copy_(sigmas[i])
        self.nxt.copy_(sigmas[i + 1])
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side), self._no_autocast_cache():  # this step for real: the capture's warm-up
            self.velocity.step(self.x, self.now, self.nxt, skip)
        torch.cuda.current_stream(device).wait_stream(side)
        torch.cuda.empty_cache()  # the eager steps' cached blocks, or they sit beside the graph's pool
        graph = torch.cuda.CUDAGraph()
        try:
            with (
                torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"),
                self._no_autocast_cache(),
            ):
                self.velocity.step(self.x, self.now, self.nxt, skip)  # recorded, not run
        except Exception as e:  # an op that cannot be captured: the rest runs eagerly
            self.failed = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            if self.required:
                raise ConfigError(
                    "CUDA_GRAPHS", f"'on' but the step cannot be captured ({self.failed})"
                ) from e
            log.warning(f"sampler CUDA graph capture failed, sampling continues eagerly ({self.failed})")
            return
        self.captured[skip] = graph


@torch.no_grad()
def euler_sample(
    backbone: Callable[..., torch.Tensor],
    cond: Sequence[torch.Tensor],
    uncond: Sequence[torch.Tensor] | None,
    img_sizes: Sequence[tuple[int, int]],
    seeds: Sequence[int],
    config: SamplerConfig,
    in_channels: int = 128,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    progress: Callable[[int, int], None] | None = None,
    speed: SamplerSpeed = DEFAULT_SPEED,
    references: Sequence[Sequence[torch.Tensor]] | None = None,
) -> list[torch.Tensor]:
    """cond / uncond: per-image text hidden states; returns the clean latent tokens [h*w, C] per image.

    The uncond branch runs when `uncond` is given and CFG != 1. A backbone with a `config.depth` has
    its skip indices checked against it first (ConfigError naming UNCOND_SKIP_LAYERS). With
    speed.batch_cfg the backbone takes `keep_lead` (MossBackbone does).
    references: per image, its reference images' clean token grids [C, rows, cols] (an edit model's
    input; `model.pack_references`), after its text in both branches; with speed.reference_cache
    their keys and values are computed by the first step of each kind and read by the others.
    """
    velocity = _Velocity(
        backbone, cond, uncond, img_sizes, config, device, dtype, speed.batch_cfg,
        references, speed.reference_cache,
    )  # fmt: skip
    depth = backbone_depth(backbone)
    if velocity.guided and depth is not None:
        config.check_depth(depth)
    graphs = use_graphs(speed, backbone, device)
    sigmas = released_sigmas(config.steps, config.shift).to(device)
    n = sigmas.numel() - 1
    x = torch.cat([initial_noise(g, s, in_channels) for g, s in zip(img_sizes, seeds)]).to(device)
    steps = _Steps(velocity, x, graphs, required=speed.cuda_graphs == "on")
    for i in range(n):
        steps(sigmas, i, config.skip_at(i, n) if velocity.guided else ())
        if progress is not None:
            progress(i + 1, n)
    if graphs:
        log.info(f"sampler: {steps.replays} of {n} steps replayed from {len(steps.captured)} CUDA graphs")
    cached = velocity.cached_bytes
    if cached:
        log.info(
            f"sampler: reference K/V computed once per branch and skip set ({cached / 2**20:.1f} MiB kept)"
        )
    return list(torch.split(x, [h * w for h, w in img_sizes]))

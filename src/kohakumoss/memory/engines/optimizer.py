"""Optimizer placement: the members of a CombinedOptimizer stepped where the memory plan puts their states.

    gpu     a pass-through: states next to the params, grads from param.grad.
    host    fp32 masters and states in (pinned) host memory; the torch optimizers step on the CPU; the
            updated masters are written back to the device params (or through `write_back`).
    stream  masters and states in pinned host memory; each step walks chunks of params (e.g. one DiT
            block each), uploads a chunk's masters, grads and states, steps the members restricted to that
            chunk on the device, downloads masters and states, writes the weights back. The next chunk's
            upload runs on a side stream while the current one steps.

Shared masters (`share`): processes that hold the same masters (a DDP node's ranks, distributed/host_share.py)
each step only their indices and hold only those states; after `barrier()` every stepped master is written back.

The members keep their own param_groups (the masters replace the device params in them), so the LR schedule,
state_dict and the torch update rules are the members' own. Grads are clipped and unscaled in fp32 on the
masters' side. The state_dict adds '__masters__' (the fp32 masters) so a resumed run keeps full precision.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import nn

from kohakumoss.optim.combined import CombinedOptimizer, placement_problem, zero_grads
from kohakumoss_common.errors import CheckpointError, ConfigError

from ..plan import OPTIMIZER_PLACEMENTS
from .grad_offload import GradOffload

MASTERS_KEY = "__masters__"
DEFAULT_CHUNK_BYTES = 64 << 20

WriteBack = Callable[[nn.Parameter, torch.Tensor], None]


def _host_copy(
    t: torch.Tensor, pin: bool, dtype: torch.dtype | None = None, non_blocking: bool = False
) -> torch.Tensor:
    """A fresh CPU tensor (pinned when asked) holding t's values."""
    out = torch.empty(t.shape, dtype=dtype or t.dtype, device="cpu", pin_memory=pin)
    return out.copy_(t.detach(), non_blocking=non_blocking and pin)


def _keeps_step_on_host(group: dict) -> bool:
    """torch keeps a non-fused, non-capturable optimizer's 'step' counter on the CPU whatever the param's device."""
    return not (group.get("fused") or group.get("capturable"))


def _fused_supported(params: list[torch.Tensor]) -> bool:
    """torch's fused Adam(W) takes floating params on CPU or CUDA, all on one device type."""
    kinds = {p.device.type for p in params}
    return len(kinds) <= 1 and kinds <= {"cpu", "cuda"} and all(p.is_floating_point() for p in params)


def default_chunks(sizes: list[int], chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> list[list[int]]:
    """Consecutive index runs of about `chunk_bytes` of fp32 masters each (a bigger param is a chunk alone)."""
    chunks: list[list[int]] = []
    current: list[int] = []
    used = 0
    for i, n in enumerate(sizes):
        nbytes = 4 * n
        if current and used + nbytes > chunk_bytes:
            chunks.append(current)
            current, used = [], 0
        current.append(i)
        used += nbytes
    if current:
        chunks.append(current)
    return chunks


class PlacedOptimizer:
    """CombinedOptimizer's interface (param_groups, step, zero_grad, state_dict, ...) with placed states.

    `write_back(param, master)` gets each stepped param with its updated fp32 host master (synchronized);
    without it the master is cast into the param. `read_param(param)` gives a param's current value where
    `param` itself does not hold it (a streamed block's host copy); it seeds the masters. `chunk_params`
    are the 'stream' chunks (params not listed are chunked by `chunk_bytes` of fp32 masters).
    """

    def __init__(
        self,
        combined: CombinedOptimizer,
        placement: str,
        grad_offload: GradOffload | None = None,
        write_back: WriteBack | None = None,
        chunk_params: list[list[nn.Parameter]] | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        read_param: Callable[[nn.Parameter], torch.Tensor] | None = None,
    ):
        if placement not in OPTIMIZER_PLACEMENTS:
            raise ConfigError("OPTIMIZER_PLACEMENT", f"'{placement}' is not one of {OPTIMIZER_PLACEMENTS}")
        problem = placement_problem(combined, placement)  # update rules that placed states cannot run
        if problem:
            raise ConfigError("OPTIMIZER_PLACEMENT", problem)
        if placement == "gpu" and grad_offload is not None:
            raise ConfigError(
                "GRAD_OFFLOAD",
                "offloaded grads are summed on the host: use OPTIMIZER_PLACEMENT 'stream' or 'host'",
            )
        self.combined = combined
        self.optimizers = combined.optimizers
        self.placement = placement
        self.grad_offload = grad_offload
        self.write_back = write_back
        owns = getattr(write_back, "owns", lambda p: True)
        # 'stream' updates a param the write-back does not own (a resident block's) from the chunk's device
        # master, as without streaming; only streamed params go through their host copies
        self._host_written = [write_back is not None and owns(p) for p in combined.params()]
        self.read_param = read_param or (lambda p: p.detach())
        self._params: list[nn.Parameter] = combined.params()
        if len({id(p) for p in self._params}) != len(self._params):
            raise ConfigError("OPTIMIZER", "a parameter sits in two optimizer groups")
        self._index = {id(p): i for i, p in enumerate(self._params)}
        self.device = self._params[0].device if self._params else torch.device("cpu")
        self._pin = self.device.type == "cuda"
        self._offload_index: list[int] = []
        if grad_offload is not None:
            where = {id(p): j for j, p in enumerate(grad_offload.params)}
            missing = [i for i, p in enumerate(self._params) if id(p) not in where]
            if missing or len(where) != len(self._params):
                raise ConfigError(
                    "GRAD_OFFLOAD", "the grad offload must hook exactly the optimizer's parameters"
                )
            self._offload_index = [where[id(p)] for p in self._params]
        self._gathered = False
        self._device_grads: list[torch.Tensor | None] = []
        self._grad_coef = 1.0  # clip / unscale factor still to apply to device grads (stream without offload)
        self._host_grad_bufs: dict[int, torch.Tensor] = {}
        self._written: torch.cuda.Event | None = None
        self._side: torch.cuda.Stream | None = None  # the upload stream of 'stream'
        self._mine: set[int] | None = None  # shared masters: the indices this process steps (None: all)
        self._barrier: Callable[[], None] | None = None  # shared masters: every process has stepped its own
        if placement == "gpu":
            self._masters = self._params
            self._chunks: list[list[int]] = []
            if not any(opt.state for opt in self.optimizers.values()):
                self._prefer_fused()
            return
        if any(opt.state for opt in self.optimizers.values()):
            raise ConfigError(
                "OPTIMIZER_PLACEMENT",
                "place the optimizer before its first step: the members already hold state",
            )
        self._masters = [_host_copy(self.read_param(p), self._pin, torch.float32) for p in self._params]
        master_of = {id(p): m for p, m in zip(self._params, self._masters, strict=True)}
        for opt in self.optimizers.values():
            for group in opt.param_groups:
                group["params"] = [master_of[id(p)] for p in group["params"]]
        self._prefer_fused()
        self._chunks = self._make_chunks(chunk_params, chunk_bytes) if placement == "stream" else []

    # -- the CombinedOptimizer interface -------------------------------------------------------------

    @property
    def param_groups(self) -> list[dict]:
        return self.combined.param_groups

    def params(self) -> list[nn.Parameter]:
        """The trainable (device) params, in group order."""
        return list(self._params)

    def master_params(self) -> list[torch.Tensor]:
        """What the members step: fp32 host masters ('host', 'stream') or the params themselves ('gpu')."""
        return list(self._masters)

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> None:
        if closure is not None:
            with torch.enable_grad():
                closure()
        if self.placement == "gpu":
            self.combined.step()
            return
        self._gather()
        stepped = [self._has_grad(i) for i in range(len(self._params))]
        if self.placement == "host":
            held = [(m, m.grad) for i, m in enumerate(self._masters) if not self._steps_here(i)]
            for m, _ in held:
                m.grad = None  # another process steps it
            try:
                for opt in self.optimizers.values():
                    opt.step()
            finally:
                for m, g in held:
                    m.grad = g
            self._write_back_host(only=self._mine)
        else:
            self._stream_step()
        self._take_shared(stepped)

    def share(self, mine: list[int], barrier: Callable[[], None]) -> None:
        """The masters are shared with other processes that step the others: step only the indices `mine`
        (the other params' states are dropped and never created here); after each step `barrier()` waits
        for every process's, then the params stepped elsewhere take their masters' new values."""
        if self.placement == "gpu":
            raise ConfigError("OPTIMIZER_PLACEMENT", "'gpu' has no host masters to share")
        self._mine, self._barrier = set(mine), barrier
        self._drop_others_states()

    def _drop_others_states(self) -> None:
        if self._mine is None:
            return
        kept = {id(self._masters[i]) for i in self._mine}
        for opt in self.optimizers.values():
            for key in [k for k in opt.state if id(k) not in kept]:
                del opt.state[key]

    def _steps_here(self, i: int) -> bool:
        return self._has_grad(i) and (self._mine is None or i in self._mine)

    def _take_shared(self, stepped: list[bool]) -> None:
        """Shared masters: once every process has stepped its own, the others' stepped params written back."""
        if self._mine is None:
            return
        self._barrier()
        with torch.no_grad():
            for i, (p, m) in enumerate(zip(self._params, self._masters, strict=True)):
                if stepped[i] and i not in self._mine:
                    self._write_one(i, p, m)
        self._record_written()

    def zero_grad(self, set_to_none: bool = True) -> None:
        zero_grads(self._params, set_to_none)
        if self.placement == "gpu":
            return
        for m in self._masters:
            m.grad = None
        if self.grad_offload is not None:
            self.grad_offload.zero()
        self._device_grads, self._grad_coef, self._gathered = [], 1.0, False

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Clip the (fp32) grads to `max_norm` in total 2-norm, like torch.nn.utils.clip_grad_norm_; the norm
        before, as a 0-d tensor. On the GPU it stays there (reading it waits for the step: float() it when
        logging, not every step)."""
        if self.placement == "gpu":
            grads = [p for p in self._params if p.grad is not None]
            return torch.nn.utils.clip_grad_norm_(grads, max_norm) if grads else torch.zeros(())
        self._gather()
        host = [m for m in self._masters if m.grad is not None]
        if host:
            return torch.nn.utils.clip_grad_norm_(host, max_norm)
        dev = [g for g in self._device_grads if g is not None]
        if not dev:
            return torch.zeros(())
        norms = [torch.linalg.vector_norm(g, 2.0, dtype=torch.float32) for g in dev]
        total = float(torch.linalg.vector_norm(torch.stack(norms))) * self._grad_coef
        self._grad_coef *= min(1.0, max_norm / (total + 1e-6))
        return torch.tensor(total)

    def unscale_(self, inv_scale: float) -> bool:
        """Multiply the grads by `inv_scale` (a GradScaler's 1/scale); True when a grad is not finite."""
        if self.placement == "gpu":
            grads = [p.grad for p in self._params if p.grad is not None]
        else:
            self._gather()
            grads = [m.grad for m in self._masters if m.grad is not None]
            device_grads = [g for g in self._device_grads if g is not None]
            if device_grads:  # folded into the fp32 copy each chunk makes
                self._grad_coef *= inv_scale
        for g in grads:
            g.mul_(inv_scale)
        if self.placement == "stream":
            grads = grads + device_grads
        return any(not bool(torch.isfinite(g).all()) for g in grads)

    def state_dict(self) -> dict:
        state = self.combined.state_dict()
        if self.placement != "gpu":
            self._wait_written()
            state[MASTERS_KEY] = [m.detach().clone() for m in self._masters]
        return state

    def load_state_dict(self, state: dict) -> None:
        state = dict(state)
        masters = state.pop(MASTERS_KEY, None)
        if masters is not None and len(masters) != len(self._params):
            raise CheckpointError(
                "<optimizer state>",
                f"holds {len(masters)} master weights, this run trains {len(self._params)}",
            )
        self._wait_written()
        self.combined.load_state_dict(state)
        if self.placement == "gpu":
            if masters is not None:
                with torch.no_grad():
                    for p, m in zip(self._params, masters, strict=True):
                        p.copy_(m)
            return
        for opt in self.optimizers.values():  # own every state tensor in (pinned) host memory
            for key, st in list(opt.state.items()):
                opt.state[key] = {
                    k: _host_copy(v, self._pin) if isinstance(v, torch.Tensor) else v for k, v in st.items()
                }
        self._drop_others_states()
        self._prefer_fused()
        if masters is None:
            self.sync_masters()
            return
        with torch.no_grad():
            for i, (m, src) in enumerate(zip(self._masters, masters, strict=True)):
                if self._mine is None or i in self._mine:
                    m.copy_(src)
        if self._barrier is not None:
            self._barrier()
        self._write_back_host(every=True)

    # -- placement helpers -----------------------------------------------------------------------------

    def sync_masters(self) -> None:
        """Masters <- device params (after loading weights into the model without an optimizer state)."""
        if self.placement == "gpu":
            return
        self._wait_written()
        with torch.no_grad():
            for i, (m, p) in enumerate(zip(self._masters, self._params, strict=True)):
                if self._mine is None or i in self._mine:
                    m.copy_(self.read_param(p))
        if self._barrier is not None:
            self._barrier()

    def _prefer_fused(self) -> None:
        """Adam/AdamW members step with torch's fused kernel where their params live: on the host
        it is ~9x faster than foreach (which loops per tensor on the CPU); on CUDA one launch per list.
        Other members keep their own choice (Muon has no fused or foreach form)."""
        if self.placement == "stream":
            return  # chunks step on the device with states uploaded per chunk: the members' default
        for opt in self.optimizers.values():
            if not isinstance(opt, (torch.optim.Adam, torch.optim.AdamW)):
                continue
            for group in opt.param_groups:
                if group.get("differentiable") or not _fused_supported(group["params"]):
                    continue
                group["fused"], group["foreach"] = True, False

    def _make_chunks(
        self, chunk_params: list[list[nn.Parameter]] | None, chunk_bytes: int
    ) -> list[list[int]]:
        chunks: list[list[int]] = []
        taken: set[int] = set()
        for chunk in chunk_params or []:
            idx = []
            for p in chunk:
                i = self._index.get(id(p))
                if i is None:
                    continue  # a frozen param of the block: nothing to step
                if i in taken:
                    raise ConfigError("OPTIMIZER_PLACEMENT", "a parameter sits in two stream chunks")
                taken.add(i)
                idx.append(i)
            if idx:
                chunks.append(idx)
        rest = [i for i in range(len(self._params)) if i not in taken]
        for run in default_chunks([self._params[i].numel() for i in rest], chunk_bytes):
            chunks.append([rest[j] for j in run])
        return chunks

    def _wait_written(self) -> None:
        if self._written is not None:
            self._written.synchronize()  # the masters are about to change: the H2D write-back must be done
            self._written = None

    def _gather(self) -> None:
        """Point every master's .grad at its fp32 host grad (or keep the device grads for 'stream')."""
        if self._gathered:
            return
        self._wait_written()
        if self.grad_offload is not None:
            sums, received = self.grad_offload.host_grads(), self.grad_offload.received
            for m, j in zip(self._masters, self._offload_index, strict=True):
                m.grad = sums[j] if received[j] else None
        elif self.placement == "host":
            for i, (p, m) in enumerate(zip(self._params, self._masters, strict=True)):
                if p.grad is None:
                    m.grad = None
                    continue
                buf = self._host_grad_bufs.get(i)
                if buf is None:
                    buf = self._host_grad_bufs[i] = torch.empty(
                        p.shape, dtype=torch.float32, pin_memory=self._pin
                    )
                buf.copy_(p.grad, non_blocking=True)
                m.grad = buf
                p.grad = None  # later work on this stream is ordered after the copy
            if self.device.type == "cuda":
                torch.cuda.current_stream(self.device).synchronize()
        else:
            self._device_grads = [p.grad for p in self._params]
            for m in self._masters:
                m.grad = None
        self._grad_coef = 1.0
        self._gathered = True

    def _write_back_host(self, every: bool = False, only: set[int] | None = None) -> None:
        """Updated masters -> device params (cast to their dtype), or through the write_back callback
        (`only`: those indices)."""
        with torch.no_grad():
            for i, (p, m) in enumerate(zip(self._params, self._masters, strict=True)):
                if (m.grad is None and not every) or (only is not None and i not in only):
                    continue  # not stepped (here)
                self._write_one(i, p, m)
        self._record_written()

    def _write_one(self, i: int, p: nn.Parameter, m: torch.Tensor) -> None:
        """One master into its param: through write_back ('stream': the params it owns), else cast in."""
        if self.write_back is not None and (self.placement == "host" or self._host_written[i]):
            self.write_back(p, m)
        elif p.device.type == "cpu":
            p.copy_(m)
        else:
            p.copy_(m.to(p.device, non_blocking=True))

    def _record_written(self) -> None:
        if self.device.type == "cuda":  # the H2D write-backs read the pinned masters until this event
            self._written = torch.cuda.Event()
            self._written.record(torch.cuda.current_stream(self.device))

    def _owners(self) -> dict[int, tuple[str, int]]:
        """master id -> (member name, group index); recomputed since load_state_dict replaces the groups."""
        return {
            id(m): (name, g)
            for name, opt in self.optimizers.items()
            for g, group in enumerate(opt.param_groups)
            for m in group["params"]
        }

    def _upload(self, chunk: list[int], owners: dict) -> list[tuple[int, torch.Tensor, dict | None]]:
        """The chunk's masters, fp32 grads and states on the device (runs on the current stream)."""
        dev = self.device
        staged = []
        for i in chunk:
            m = self._masters[i]
            if m.grad is not None:
                grad = m.grad.to(dev, non_blocking=True, copy=True)
            elif self._device_grads and self._device_grads[i] is not None:
                grad = torch.empty(m.shape, dtype=torch.float32, device=dev).copy_(self._device_grads[i])
                if self._grad_coef != 1.0:
                    grad.mul_(self._grad_coef)
            else:
                continue
            gm = m.to(dev, non_blocking=True, copy=True)
            gm.grad = grad
            name, g = owners[id(m)]
            opt = self.optimizers[name]
            host_state = opt.state.get(m)
            state = None
            if host_state:
                on_host = _keeps_step_on_host(opt.param_groups[g]) and dev.type != "cpu"
                state = {
                    k: (v if k == "step" and on_host else v.to(dev, non_blocking=True, copy=True))
                    if isinstance(v, torch.Tensor)
                    else v
                    for k, v in host_state.items()
                }
            staged.append((i, gm, state))
        return staged

    def _step_chunk(self, staged: list, owners: dict) -> None:
        """Run the members restricted to the staged params (their groups' params swapped for the chunk)."""
        by_group: dict[tuple[str, int], list[torch.Tensor]] = {}
        for i, gm, state in staged:
            key = owners[id(self._masters[i])]
            by_group.setdefault(key, []).append(gm)
            if state is not None:
                self.optimizers[key[0]].state[gm] = state
        for name, opt in self.optimizers.items():
            if not any(k[0] == name for k in by_group):
                continue
            saved = [group["params"] for group in opt.param_groups]
            try:
                for g, group in enumerate(opt.param_groups):
                    group["params"] = by_group.get((name, g), [])
                opt.step()
            finally:
                for group, params in zip(opt.param_groups, saved, strict=True):
                    group["params"] = params

    def _download(self, staged: list, owners: dict) -> None:
        """Masters and states back into their host tensors; weights to the device params (no write_back)."""
        for i, gm, _ in staged:
            m, p = self._masters[i], self._params[i]
            opt = self.optimizers[owners[id(m)][0]]
            state = opt.state.pop(gm, None)
            m.copy_(gm, non_blocking=True)
            if state is not None:
                host = opt.state.get(m)
                if not host:  # first step: the state was created on the device
                    opt.state[m] = {k: self._to_host(v) for k, v in state.items()}
                else:
                    for k, v in state.items():
                        if isinstance(v, torch.Tensor) and isinstance(host.get(k), torch.Tensor):
                            if host[k] is not v:
                                host[k].copy_(v, non_blocking=True)
                        else:
                            host[k] = v
            if not self._host_written[i]:
                p.copy_(gm)

    def _to_host(self, v: object) -> object:
        """A state value for the host: CPU tensors (a host 'step' counter, CPU-device copies) stay as they are."""
        if not isinstance(v, torch.Tensor) or v.device.type == "cpu":
            return v
        return _host_copy(v, self._pin, non_blocking=True)

    def _stream_step(self) -> None:
        owners = self._owners()
        chunks = [[i for i in c if self._steps_here(i)] for c in self._chunks]
        chunks = [c for c in chunks if c]
        cuda = self.device.type == "cuda"
        compute = torch.cuda.current_stream(self.device) if cuda else None
        if cuda and self._side is None:
            self._side = torch.cuda.Stream(self.device)
        side = self._side
        if cuda:
            side.wait_stream(compute)  # the device grads were produced on the compute stream

        def upload(chunk: list[int]):
            with torch.cuda.stream(side) if cuda else contextlib.nullcontext():
                staged = self._upload(chunk, owners)
                done = torch.cuda.Event() if cuda else None
                if cuda:
                    done.record(side)
            return staged, done

        nxt = upload(chunks[0]) if chunks else None
        for c in range(len(chunks)):
            staged, done = nxt
            if cuda:
                compute.wait_event(done)
                for _, gm, state in staged:  # allocated on the side stream, used (and freed) on compute
                    gm.record_stream(compute)
                    gm.grad.record_stream(compute)
                    for v in (state or {}).values():
                        if isinstance(v, torch.Tensor) and v.is_cuda:
                            v.record_stream(compute)
            nxt = upload(chunks[c + 1]) if c + 1 < len(chunks) else None  # overlaps this chunk's update
            self._step_chunk(staged, owners)
            self._download(staged, owners)
        if cuda:
            compute.synchronize()  # the host masters and states are read by the CPU from here on
        if self.write_back is not None:
            with torch.no_grad():
                for i, (p, m) in enumerate(zip(self._params, self._masters, strict=True)):
                    if self._host_written[i] and self._steps_here(i):
                        self.write_back(p, m)
            self._record_written()

    def _has_grad(self, i: int) -> bool:
        if self._masters[i].grad is not None:
            return True
        return bool(self._device_grads) and self._device_grads[i] is not None

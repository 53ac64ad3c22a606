"""Op registry: each op binds per (arch, dtype) to a list of backends; the eager backend is the reference.

- The ops are listed in `op_list.py` (name, signature, reference, variants). Backends of an op are the
  modules beside its reference, `ops/<op>/<backend>.py`, each exporting a function named like the op
  and optionally `supports(arch, dtype) -> bool` and `WEIGHTS` (the weight kinds it takes); the
  registry makes `eager` (the reference) and `compile` (the reference under torch.compile) itself, and
  each listed variant from its base backend's function with fixed keyword arguments.
- An op with a frozen weight argument binds per weight kind too (a tensor, fp8, int8, MXFP8): each kind
  gets the backends that take it.
- `DEFAULT_PRIORITY` orders them per arch: Triton first from sm75, then torch's own candidates (the `torch` slot: SDPA over equal-length groups, varlen_attn,
  FlexAttention, a fused addmm for the LoRA linear), then torch.compile, then eager. The CPU gets eager alone unless a backend is named.
  Backends never run on the hardware they are for stay off it until a card has run them: TileLang on
  sm70/sm75 and Triton on XPU are used only when named (`OPS_BACKEND`, `OpSet(backend=...)`).
- A backend that does not import (Triton or TileLang missing, an old torch) is skipped, one log line.
- Per call, the shape key (`OpSpec.shape_key`, tuning/shape_keys.py) picks a row of the card's tuning table (`tuning/`);
  a RuntimeError (or a Triton compile error) at call time falls back to the next backend, logged once.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

import torch

from kohakumoss_common.device import sm_at_least
from kohakumoss_common.errors import ConfigError
from kohakumoss_common.log import get_logger, log_once

from . import tuning
from .backends.compile_utils import compiled
from .backends.compile_utils import supports as compile_supports
from .op_list import DENSE, SPECS, shape_key
from .weights.stored_weight import WEIGHT_KINDS, StoredWeight, weight_kind

log = get_logger("kohakumoss.kernels.registry")

# The `torch` slot of a priority list expands to these, where the op has them.
TORCH_NATIVE = (
    "sdpa_groups",
    "torch_varlen",
    "flex",
    # a stored weight's own 8-bit GEMM before its weight-only `addmm` (stored_linear, untuned)
    "int_mm",
    "scaled_mm",
    "block_scaled_mm",
    "addmm",
    "addmm_lora_first",
    "addmm_lowrank",
    "onehot",
)
BACKENDS = ("triton", "tilelang", *TORCH_NATIVE, "compile", "eager")

DEFAULT_PRIORITY: dict[str, tuple[str, ...]] = {
    # Triton no longer builds for Volta; TileLang (sm70/sm75) and Triton on XPU never ran on such a card,
    # so they run only when named, and sm70 and XPU take "other"
    "sm75": ("triton", "torch", "compile", "eager"),
    "sm80+": ("triton", "torch", "compile", "eager"),
    "cpu": ("eager",),
    "other": ("torch", "compile", "eager"),
}


def backend_cannot_run(e: BaseException) -> bool:
    """Whether a backend's exception means "try the next one": a RuntimeError (CUDA, TileLang/TVM), or a
    Triton kernel that does not compile for this card (a TritonError, not a RuntimeError). Triton is looked
    up only here, on a failure, so importing the registry stays cheap. Running out of memory is not one
    (torch's OutOfMemoryError is a RuntimeError): the memory plan's problem, not the backend's, and
    dropping the backend for the rest of the run would not make the memory."""
    if isinstance(e, torch.OutOfMemoryError):
        return False
    if isinstance(e, RuntimeError):
        return True
    if type(e).__module__.split(".")[0] in ("tilelang", "tvm", "tvm_ffi"):  # TileLang's compiler refused
        return True
    triton_errors = sys.modules.get("triton.errors")  # a Triton error implies Triton was imported
    return triton_errors is not None and isinstance(e, triton_errors.TritonError)


# Ops and backends registered at run time (plugins, tests): (op, backend) -> function.
_REGISTERED: dict[tuple[str, str], Callable] = {}


def available_ops() -> list[str]:
    return sorted(set(SPECS) | {op for op, _ in _REGISTERED})


# Ops registered at run time whose reference the registry also offers under torch.compile.
_COMPILABLE: set[str] = set()


def register_op(op: str, eager: Callable, compile: bool = True) -> None:
    """Add an op defined outside ops/ (its eager reference, and unless `compile=False` that reference under
    torch.compile as its `compile` backend); further backends follow via register_backend."""
    _REGISTERED[(op, "eager")] = eager
    (_COMPILABLE.add if compile else _COMPILABLE.discard)(op)


def register_backend(op: str, backend: str, fn: Callable) -> None:
    """Add or replace one backend of an op; `fn` may carry a `supports(arch, dtype)` attribute."""
    _check_op(op)
    if backend not in BACKENDS:
        raise ConfigError("register_backend", f"unknown backend '{backend}'; known: {list(BACKENDS)}")
    _REGISTERED[(op, backend)] = fn


def _check_op(op: str) -> None:
    if op not in SPECS and (op, "eager") not in _REGISTERED:
        raise KeyError(f"unknown op '{op}'; known: {available_ops()}")


def priority_for(arch: str) -> tuple[str, ...]:
    """The backend order for an arch string from `kohakumoss_common.device` (sm90, sm75, xpu, cpu)."""
    if arch in DEFAULT_PRIORITY:
        return DEFAULT_PRIORITY[arch]
    if sm_at_least(arch, 80):
        return DEFAULT_PRIORITY["sm80+"]
    return DEFAULT_PRIORITY["other"]


def _expand(names: Sequence[str]) -> list[str]:
    out: list[str] = []
    for name in names:
        for n in TORCH_NATIVE if name == "torch" else (name,):
            if n not in out:
                out.append(n)
    return out


def has_backend(op: str, backend: str) -> bool:
    _check_op(op)
    spec = SPECS.get(op)
    if (op, backend) in _REGISTERED or backend == "eager":
        return True
    if backend == "compile":
        return spec.compile if spec is not None else op in _COMPILABLE
    if spec is None:
        return False
    if backend in spec.variants:
        return True
    return importlib.util.find_spec(_module_name(op, backend)) is not None


def _module_name(op: str, module: str) -> str:
    return f"kohakumoss_kernels.ops.{SPECS[op].folder}.{module}"


# the reference under torch.compile, one per reference function and process (compiled on first call)
_COMPILED: dict[Callable, Callable] = {}


def _backend(op: str, backend: str) -> tuple[Callable, Callable | None, tuple[str, ...]]:
    """(function, supports or None, the weight kinds it takes) of one backend; imports its module."""
    if (op, backend) in _REGISTERED:
        fn = _REGISTERED[(op, backend)]
        return fn, getattr(fn, "supports", None), getattr(fn, "weights", DENSE)
    if backend == "eager":
        return eager_op(op), None, WEIGHT_KINDS  # the reference dequantizes a stored weight
    if backend == "compile" and has_backend(op, "compile"):
        ref = eager_op(op)
        if ref not in _COMPILED:
            _COMPILED[ref] = compiled(ref)
        return _COMPILED[ref], compile_supports, DENSE
    variant = SPECS[op].variants.get(backend)
    if variant is not None:
        fn = partial(getattr(importlib.import_module(_module_name(op, variant.base)), op), **variant.kwargs)
        supports = None
        if variant.supports_from is not None:
            supports = importlib.import_module(f"kohakumoss_kernels.ops.{variant.supports_from}").supports
        return fn, supports, variant.weights
    module = importlib.import_module(_module_name(op, backend))
    return getattr(module, op), getattr(module, "supports", None), getattr(module, "WEIGHTS", DENSE)


def backend_fn(op: str, backend: str) -> Callable:
    """One backend's function as is, whatever the card (tests and benchmarks call it directly)."""
    _check_op(op)
    return _backend(op, backend)[0]


def load_backend(
    op: str, backend: str, arch: str, dtype: torch.dtype, kind: str | None = None
) -> Callable | None:
    """The backend's function, or None (with one log line) when it does not import or support (arch, dtype).
    kind: the weight kind of an op with a weight argument; None (quietly) when the backend does not take it."""
    try:
        fn, supports, weights = _backend(op, backend)
        if kind is not None and kind not in weights:
            return None
        if supports is not None and not supports(arch, dtype):
            return None
        return fn
    except Exception as e:  # any import or build failure means: skip this backend
        log_once(log, f"{op}: backend '{backend}' unavailable on {arch} ({type(e).__name__}: {e}); skipped")
        return None


def eager_op(op: str) -> Callable:
    """The reference implementation of `op`."""
    _check_op(op)
    if (op, "eager") in _REGISTERED:
        return _REGISTERED[(op, "eager")]
    module_name, name = SPECS[op].reference.split(":")
    return getattr(importlib.import_module(module_name), name)


def call_kind(op: str, args: tuple, kwargs: dict) -> str | None:
    """The weight kind that picks `op`'s backends for one call (args include x), or None: no weight argument."""
    spec = SPECS.get(op)
    if spec is None or spec.weight_arg is None:
        return None
    w = args[spec.weight_arg] if len(args) > spec.weight_arg else kwargs.get("weight", kwargs.get("weights"))
    if isinstance(w, (tuple, list)):  # a group: its first member's kind (a model quantizes them alike)
        w = w[0]
    return weight_kind(w)


@dataclass
class BoundOp:
    """An op bound for one (arch, dtype): the backends to try in priority order, and how to pick per shape."""

    op: str
    arch: str
    dtype: torch.dtype
    backends: list[tuple[str, Callable]] = field(default_factory=list)
    tune: str = "off"
    table: tuning.TuningTable | None = None
    choices: dict[str, str] = field(default_factory=dict)  # shape key -> backend, this process
    failed: set[str] = field(default_factory=set)
    timing: str = "wall"  # wall: host overhead counts (eager steps); device: graph-replayed (graphed steps)
    lengths: str = (
        "host"  # device: only backends that read sequence lengths on the device (OpSet.set_lengths)
    )
    kind: str | None = None  # the weight kind this binding serves (ops with a weight argument)
    _decided: dict[tuple, list] = field(default_factory=dict, repr=False)  # exact shapes -> order

    @property
    def names(self) -> list[str]:
        return [n for n, _ in self.backends]

    def order(self, *args, **kwargs) -> list[tuple[str, Callable]]:
        """The backends for this call, the chosen one first, the rest in priority order."""
        exact = _exact_key(args, kwargs)
        if exact in self._decided:  # the hot path: no string key, no table lookup
            return self._decided[exact]
        live = [(n, f) for n, f in self.backends if n not in self.failed]
        live = _graph_safe(live, self.timing, self.lengths) or self.backends[-1:]
        if self.kind not in (None, "dense") and len(live) > 1:  # the reference keeps a dequantized copy
            live = [(n, f) for n, f in live if n != "eager"]  # of a stored weight: last resort, never timed
        last = [] if live[-1:] == self.backends[-1:] else self.backends[-1:]  # the reference: last resort
        if self.tune == "off" or len(live) == 1:
            self._decided[exact] = live + last
            return live + last
        key = shape_key(self.op, *args, **kwargs) + ("|graphed" if self.timing == "device" else "")
        if self.lengths == "device" and any(getattr(f, "device_lengths", False) for _, f in self.backends):
            key += "|device_lengths"
        choice = self.choices.get(key)
        if choice is None:
            choice = self._choose(key, live, args, kwargs)
        ordered = sorted(live, key=lambda nf: nf[0] != choice) + last
        if choice is not None:
            self._decided[exact] = ordered
        return ordered

    def _choose(self, key: str, live, args, kwargs) -> str | None:
        stored = self.table.get(key, (n for n, _ in live)) if self.table is not None else None
        if self.tune == "table" and stored in dict(live):
            self.choices[key] = stored
            return stored
        timing_allowed = self.tune == "always" or tuning.in_tuning_window()
        if not timing_allowed or torch.compiler.is_compiling() or _capturing():
            return None  # first candidate, untimed; the key stays open for a later window
        ms: dict[str, float] = {}
        short = False  # a candidate ran out of memory while timed: the choice holds for this process only
        worth = set(tuning.backends_worth_timing(key, self.arch, [n for n, _ in live]))
        for name, fn in [(n, f) for n, f in live if n in worth]:
            try:
                ms[name] = tuning.time_call(fn, args, kwargs, device_time=self.timing == "device")
            except torch.OutOfMemoryError as e:  # timing's own copies at a capped card's peak
                short = True
                log_once(log, f"{self.op}: backend '{name}' ran out of memory while timing {key}; skipped, "
                         f"the key is not stored ({str(e).splitlines()[0][:120]})")  # fmt: skip
            except Exception as e:
                if not backend_cannot_run(e):
                    raise
                log_once(log, f"{self.op}: backend '{name}' failed while timing {key} ({e}); skipped")
        if not ms:
            return None
        best = min(ms, key=ms.get)
        self.choices[key] = best
        if self.table is not None and not short:
            self.table.put(key, best, ms, tried=[n for n, _ in live])
        log.info(f"{self.op} {key}: {best} ({', '.join(f'{n} {t:.3f} ms' for n, t in ms.items())})")
        return best

    def __call__(self, *args, **kwargs):
        candidates = self.order(*args, **kwargs)
        for i, (name, fn) in enumerate(candidates):
            try:
                return fn(*args, **kwargs)
            except Exception as e:
                if i == len(candidates) - 1 or not backend_cannot_run(e):
                    raise
                nxt = candidates[i + 1][0]
                log_once(
                    log, f"{self.op} on {self.arch}: backend '{name}' raised ({e}); falling back to '{nxt}'"
                )
                self.failed.add(name)
                self._decided.clear()
        raise AssertionError("unreachable")


def _graph_safe(
    live: list[tuple[str, Callable]], timing: str, lengths: str = "host"
) -> list[tuple[str, Callable]]:
    """The candidates to time and call. lengths 'device' (a graphed step replaying one graph for batches
    whose sequence lengths differ, train/graphs.py): where an op has backends that read the lengths on
    the device (`fn.device_lengths`), only they; the others would bake one batch's lengths into the graph
    (the reference stays the last resort, untimed). Device timing (a graphed step) times `compile` only
    where Triton is missing: it won none of the graphed keys of the H200's table
    (docs/performance/kernels.md) and costs a compile per new shape while the first step waits."""
    if lengths == "device" and any(getattr(f, "device_lengths", False) for _, f in live):
        live = [(n, f) for n, f in live if getattr(f, "device_lengths", False)]
    if timing == "device" and any(n == "triton" for n, _ in live):
        live = [(n, f) for n, f in live if n != "compile"]
    return live


def _exact_key(args: tuple, kwargs: dict) -> tuple:
    """Shapes and scalar values of one call: finer than the shape key, cheap to build."""

    def one(a):
        if isinstance(a, torch.Tensor):
            return (tuple(a.shape), a.dtype, a.device)
        if isinstance(a, StoredWeight):  # fp8 and MXFP8 data share a dtype: the kind tells them apart
            return (a.kind, tuple(a.shape), a.dtype, a.device)
        if isinstance(a, (tuple, list)):  # an op over a group of tensors (lora_group)
            return tuple(one(b) for b in a)
        return a if isinstance(a, (int, float, str, bool, type(None))) else type(a)

    return tuple(one(a) for a in args) + tuple((k, one(v)) for k, v in sorted(kwargs.items()))


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


# Backends measured slower than the op's other forms on these archs: there only when named. torch._int_mm
# on the H200: 1.7x (3072 x 18432) to 3.1x (3072 x 3072) the int8 weight-only addmm's forward time.
AUTO_EXCLUDED: dict[str, tuple[str, ...]] = {"int_mm": ("sm90",)}


def candidate_names(op: str, arch: str, backend: str = "auto") -> list[str]:
    """The backend names `resolve` tries, before import checks. backend: auto, a name, or a comma list."""
    _check_op(op)
    if backend == "auto":
        names = [n for n in _expand(priority_for(arch)) if arch not in AUTO_EXCLUDED.get(n, ())]
    else:
        names = _expand(backend.split(","))
        unknown = [n for n in names if n not in BACKENDS]
        if unknown:
            raise ConfigError("OpSet(backend=...)", f"unknown backend(s) {unknown}; known: {list(BACKENDS)}")
        if "eager" not in names:
            names.append("eager")  # the reference is always the last resort
    return [n for n in names if has_backend(op, n)]


def resolve(
    op: str,
    arch: str,
    dtype: torch.dtype,
    backend: str = "auto",
    tune: str | None = None,
    table: tuning.TuningTable | None = None,
    kind: str | None = None,
) -> BoundOp:
    """Bind `op` for (arch, dtype) and, for an op with a weight argument, the weight kind (None: a tensor).
    backend='eager' forces the reference; 'auto' uses DEFAULT_PRIORITY."""
    if kind is None and SPECS.get(op) is not None and SPECS[op].weight_arg is not None:
        kind = "dense"
    if kind is not None and kind not in WEIGHT_KINDS:
        raise ConfigError("resolve(kind=...)", f"unknown weight kind '{kind}'; known: {list(WEIGHT_KINDS)}")
    backends = []
    for name in candidate_names(op, arch, backend):
        fn = eager_op(op) if name == "eager" else load_backend(op, name, arch, dtype, kind)
        if fn is not None:
            backends.append((name, fn))
    return BoundOp(op, arch, dtype, backends, tuning.tune_mode(tune), table, kind=kind)


class OpSet:
    """The ops a model calls: `ops.rms_norm(x, w)`; each binds on first use per (device, dtype), and per
    weight kind for an op with a weight argument (`ops.lora_linear(x, fp8_weight, ...)`).

    backend: "auto" (per-arch priority), "eager" (the pure reference), a backend name or a comma list.
    tune: "off" | "table" | "always" (default: $KOHAKUMOSS_TUNE, else "table").
    """

    def __init__(self, backend: str = "auto", tune: str | None = None):
        self.backend = backend
        self.tune = tuning.tune_mode(tune)
        self.timing = "wall"
        self.lengths = "host"
        self._bound: dict[tuple[str, str, torch.dtype, str | None], BoundOp] = {}  # (op, device, dtype, kind)

    def bind(self, op: str, device: torch.device, dtype: torch.dtype, kind: str | None = None) -> BoundOp:
        from kohakumoss_common.device import device_info

        key = (op, str(device), dtype, kind)
        if key not in self._bound:
            arch = device_info(device).arch if device.type != "cpu" else "cpu"
            table = tuning.table_for(tuning.card_name(device), arch) if self.tune != "off" else None
            self._bound[key] = resolve(op, arch, dtype, self.backend, self.tune, table, kind)
            self._bound[key].timing = self.timing
            self._bound[key].lengths = self.lengths
        return self._bound[key]

    def tuning(self, device_time: bool = False):
        """Context manager: the prewarm window in which missing shape keys are timed (TUNE=table).

        device_time: from now on choose by device time alone, each candidate replayed from a CUDA
        graph (the step will be graphed: host overhead no longer costs; uncapturable backends drop
        out); those choices are kept under their own keys (`...|graphed`)."""
        if device_time:
            self.set_timing("device")
        return tuning.tuning_window(self.tune)

    def set_timing(self, timing: str) -> None:
        """'wall': choose by wall time (eager steps); 'device': by device time (graphed steps)."""
        self._set_mode("timing", timing, ("wall", "device"))

    def set_lengths(self, lengths: str) -> None:
        """'device': from now on only backends that read sequence lengths on the device (where an op has
        them), so one CUDA graph serves batches of other lengths; 'host': every backend."""
        self._set_mode("lengths", lengths, ("host", "device"))

    def _set_mode(self, attr: str, value: str, allowed: tuple[str, ...]) -> None:
        """Set a choice mode on this set and every bound op; choices made under the old mode are dropped."""
        if value not in allowed:
            raise ConfigError(f"OpSet.set_{attr}", f"'{value}' is not {' or '.join(allowed)}")
        setattr(self, attr, value)
        for bound in self._bound.values():
            if getattr(bound, attr) != value:
                setattr(bound, attr, value)
                bound.choices.clear()
                bound._decided.clear()

    def chosen(self) -> dict[str, dict[str, str]]:
        """What each bound op picked per shape key so far (for logs and benchmarks)."""
        return {f"{_label(k[0], k[3])}@{k[1]}/{k[2]}": dict(b.choices) or {"*": b.names[0]}
                for k, b in self._bound.items()}  # fmt: skip

    def __getattr__(self, op: str) -> Callable:
        if op.startswith("_") or op not in available_ops():
            raise AttributeError(op)

        def call(x: torch.Tensor, *args, **kwargs):
            kind = call_kind(op, (x, *args), kwargs)
            return self.bind(op, x.device, x.dtype, kind)(x, *args, **kwargs)

        return call


def _label(op: str, kind: str | None) -> str:
    """An op's name in logs: `lora_linear`, `lora_linear[fp8]` for a stored weight."""
    return op if kind in (None, "dense") else f"{op}[{kind}]"

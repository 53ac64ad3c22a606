"""Op registry: each op binds per (arch, dtype) to a list of backends; the eager backend is the reference.

- Backends of an op are the modules beside its reference, `ops/<op>/<backend>.py`, each exporting a
  function named like the op and optionally `supports(arch, dtype) -> bool`.
- `DEFAULT_PRIORITY` orders them per arch: Triton first from sm75, then torch's own candidates (the `torch` slot: SDPA over equal-length groups, varlen_attn,
  FlexAttention, a fused addmm for the LoRA linear), then torch.compile, then eager. The CPU gets eager alone unless a backend is named.
  Backends never run on the hardware they are for stay off it until a card has run them: TileLang on
  sm70/sm75 and Triton on XPU are used only when named (`OPS_BACKEND`, `OpSet(backend=...)`).
- A backend that does not import (Triton or TileLang missing, an old torch) is skipped, one log line.
- Per call, the shape key (`shape_keys.py`) picks a row of the card's tuning table (`tuning.py`);
  a RuntimeError (or a Triton compile error) at call time falls back to the next backend, logged once.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from kohakumoss_common.errors import ConfigError
from kohakumoss_common.log import get_logger, log_once

from . import tuning
from .fp8 import Fp8Weight
from .int8 import Int8Weight
from .mxfp8 import Mxfp8Weight
from .shape_keys import shape_key

log = get_logger("kohakumoss.kernels.registry")

# op name -> its folder under ops/
_OPS: dict[str, str] = {
    "rms_norm": "rms_norm",
    "norm_modulate": "norm_modulate",
    "gated_residual": "gated_residual",
    "residual_norm_modulate": "residual_norm_modulate",
    "apply_rope": "rope",
    "qk_norm_rope": "qk_norm_rope",
    "situ_glu": "situ_glu",
    "varlen_attention": "varlen_attention",
    "lora_linear": "lora_linear",
    "lora_group": "lora_group",
    "lora_linear_fp8": "lora_linear_fp8",
    "lora_group_fp8": "lora_group_fp8",
    "int8_linear": "int8_linear",
    "lora_linear_int8": "lora_linear_int8",
    "lora_group_int8": "lora_group_int8",
    "mxfp8_linear": "mxfp8_linear",
    "lora_linear_mxfp8": "lora_linear_mxfp8",
    "lora_group_mxfp8": "lora_group_mxfp8",
}

# The `torch` slot of a priority list expands to these, where the op has them.
TORCH_NATIVE = (
    "sdpa_groups",
    "torch_varlen",
    "flex",
    "addmm",
    "addmm_lora_first",
    "addmm_lowrank",
    "onehot",
    "int_mm",
    "scaled_mm",
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
    return sorted(set(_OPS) | {op for op, _ in _REGISTERED})


def register_op(op: str, eager: Callable) -> None:
    """Add an op defined outside ops/ (its eager reference); backends follow via register_backend."""
    _REGISTERED[(op, "eager")] = eager


def register_backend(op: str, backend: str, fn: Callable) -> None:
    """Add or replace one backend of an op; `fn` may carry a `supports(arch, dtype)` attribute."""
    _check_op(op)
    if backend not in BACKENDS:
        raise ConfigError("register_backend", f"unknown backend '{backend}'; known: {list(BACKENDS)}")
    _REGISTERED[(op, backend)] = fn


def _check_op(op: str) -> None:
    if op not in _OPS and (op, "eager") not in _REGISTERED:
        raise KeyError(f"unknown op '{op}'; known: {available_ops()}")


def priority_for(arch: str) -> tuple[str, ...]:
    """The backend order for an arch string from `kohakumoss_common.device` (sm90, sm75, xpu, cpu)."""
    if arch in DEFAULT_PRIORITY:
        return DEFAULT_PRIORITY[arch]
    if arch.startswith("sm") and arch[2:].isdigit() and int(arch[2:]) >= 80:
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
    if (op, backend) in _REGISTERED:
        return True
    if op not in _OPS:
        return False
    return importlib.util.find_spec(f"kohakumoss_kernels.ops.{_OPS[op]}.{backend}") is not None


def load_backend(op: str, backend: str, arch: str, dtype: torch.dtype) -> Callable | None:
    """The backend's function, or None (with one log line) when it does not import or support (arch, dtype)."""
    try:
        if (op, backend) in _REGISTERED:
            fn = _REGISTERED[(op, backend)]
            supports = getattr(fn, "supports", None)
        else:
            module = importlib.import_module(f"kohakumoss_kernels.ops.{_OPS[op]}.{backend}")
            fn, supports = getattr(module, op), getattr(module, "supports", None)
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
    module = importlib.import_module(f"kohakumoss_kernels.ops.{_OPS[op]}.eager")
    return getattr(module, op)


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
    _decided: dict[tuple, list] = field(default_factory=dict, repr=False)  # exact shapes -> order

    @property
    def names(self) -> list[str]:
        return [n for n, _ in self.backends]

    def order(self, *args, **kwargs) -> list[tuple[str, Callable]]:
        """The backends for this call, the chosen one first, the rest in priority order."""
        exact = _exact_key(args, kwargs)
        if exact in self._decided:  # the hot path: no string key, no table lookup
            return self._decided[exact]
        live = [(n, f) for n, f in self.backends if n not in self.failed] or self.backends[-1:]
        if self.tune == "off" or len(live) == 1:
            self._decided[exact] = live
            return live
        key = shape_key(self.op, *args, **kwargs) + ("|graphed" if self.timing == "device" else "")
        choice = self.choices.get(key)
        if choice is None:
            choice = self._choose(key, live, args, kwargs)
        ordered = sorted(live, key=lambda nf: nf[0] != choice)
        if choice is not None:
            self._decided[exact] = ordered
        return ordered

    def _choose(self, key: str, live, args, kwargs) -> str | None:
        stored = self.table.get(key) if self.table is not None else None
        if self.tune == "table" and stored in dict(live):
            self.choices[key] = stored
            return stored
        timing_allowed = self.tune == "always" or tuning.in_tuning_window()
        if not timing_allowed or torch.compiler.is_compiling() or _capturing():
            return None  # first candidate, untimed; the key stays open for a later window
        ms: dict[str, float] = {}
        short = False  # a candidate ran out of memory while timed: the choice holds for this process only
        for name, fn in live:
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
            self.table.put(key, best, ms)
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


def _exact_key(args: tuple, kwargs: dict) -> tuple:
    """Shapes and scalar values of one call: finer than the shape key, cheap to build."""

    def one(a):
        if isinstance(a, (torch.Tensor, Fp8Weight, Int8Weight, Mxfp8Weight)):
            return (tuple(a.shape), a.dtype, a.device)
        if isinstance(a, (tuple, list)):  # an op over a group of tensors (lora_group)
            return tuple(one(b) for b in a)
        return a if isinstance(a, (int, float, str, bool, type(None))) else type(a)

    return tuple(one(a) for a in args) + tuple((k, one(v)) for k, v in sorted(kwargs.items()))


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def candidate_names(op: str, arch: str, backend: str = "auto") -> list[str]:
    """The backend names `resolve` tries, before import checks. backend: auto, a name, or a comma list."""
    _check_op(op)
    if backend == "auto":
        names = _expand(priority_for(arch))
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
) -> BoundOp:
    """Bind `op` for (arch, dtype). backend='eager' forces the reference; 'auto' uses DEFAULT_PRIORITY."""
    backends = []
    for name in candidate_names(op, arch, backend):
        fn = eager_op(op) if name == "eager" else load_backend(op, name, arch, dtype)
        if fn is not None:
            backends.append((name, fn))
    return BoundOp(op, arch, dtype, backends, tuning.tune_mode(tune), table)


class OpSet:
    """The ops a model calls: `ops.rms_norm(x, w)`; each binds on first use per (device, dtype).

    backend: "auto" (per-arch priority), "eager" (the pure reference), a backend name or a comma list.
    tune: "off" | "table" | "always" (default: $KOHAKUMOSS_TUNE, else "table").
    """

    def __init__(self, backend: str = "auto", tune: str | None = None):
        self.backend = backend
        self.tune = tuning.tune_mode(tune)
        self.timing = "wall"
        self._bound: dict[tuple[str, str, torch.dtype], BoundOp] = {}

    def bind(self, op: str, device: torch.device, dtype: torch.dtype) -> BoundOp:
        from kohakumoss_common.device import device_info

        key = (op, str(device), dtype)
        if key not in self._bound:
            arch = device_info(device).arch if device.type != "cpu" else "cpu"
            table = tuning.table_for(tuning.card_name(device)) if self.tune != "off" else None
            self._bound[key] = resolve(op, arch, dtype, self.backend, self.tune, table)
            self._bound[key].timing = self.timing
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
        if timing not in ("wall", "device"):
            raise ConfigError("OpSet.set_timing", f"'{timing}' is not wall or device")
        self.timing = timing
        for bound in self._bound.values():
            if bound.timing != timing:
                bound.timing = timing
                bound.choices.clear()
                bound._decided.clear()

    def chosen(self) -> dict[str, dict[str, str]]:
        """What each bound op picked per shape key so far (for logs and benchmarks)."""
        return {f"{k[0]}@{k[1]}/{k[2]}": dict(b.choices) or {"*": b.names[0]} for k, b in self._bound.items()}

    def __getattr__(self, op: str) -> Callable:
        if op.startswith("_") or op not in available_ops():
            raise AttributeError(op)

        def call(x: torch.Tensor, *args, **kwargs):
            return self.bind(op, x.device, x.dtype)(x, *args, **kwargs)

        return call

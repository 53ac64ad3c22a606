"""The per-card tuning table: which backend won each shape key, timed once and kept in the user cache.

Modes (`OpSet(tune=...)`, else env KOHAKUMOSS_TUNE, default "table"):
- "off":    never time; the backend priority order decides.
- "table":  a key found in the table is used; a missing key is timed while a tuning window is open
            (`tuning_window()`, the trainer's prewarm step) and stored; outside the window the first
            candidate runs untimed.
- "always": every key is timed again the first time this process sees it, window or not.
The file is `user_cache_dir()/tuning/<card>.json`, written atomically; entries timed under other
torch/triton versions are ignored. lycoris-lora's own launch-config table (its fused LoRA kernels) goes
under `user_cache_dir()/lycoris` unless LYCORIS_KERNEL_CACHE_DIR says otherwise: one folder holds
every timing a card needs, so a run that carries it times nothing again. lycoris times a new key's
configs only inside a tuning window whose mode is not "off" (its own default: whenever it meets one,
mid-run too); outside, its model's pick runs untimed. An explicit LYCORIS_KERNEL_TUNE wins.
A card this project has timed has a table shipped in `tuning/tables/<card>.json`: its rows and
launch configs fill the ones the user's table lacks when the torch/triton versions match, so a fresh
machine times only shapes the shipped table never met (env KOHAKUMOSS_SHIPPED_TABLES=0: start empty).
The compilers' caches live there too (`compile_caches.py`: Triton, Inductor, TileLang), so a second run
compiles nothing either.
Beside this table in `tuning/`: its row names (`shape_keys.py`) and the launch configs a pick times
(`launch_prune.py`).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import torch

from kohakumoss_common.errors import ConfigError
from kohakumoss_common.io import atomic_write_json, atomic_write_text
from kohakumoss_common.lock import exclusive
from kohakumoss_common.log import get_logger, log_once
from kohakumoss_common.paths import user_cache_dir

from ..runtime.capture import capture
from .compile_caches import share_compile_caches

log = get_logger("kohakumoss.kernels.tuning")
LYCORIS_ENV = "LYCORIS_KERNEL_CACHE_DIR"  # read by lycoris each time it opens its table
SHIPPED_DIR = Path(__file__).resolve().parent / "tables"  # tables timed on this project's GPUs
SHIPPED_ENV = "KOHAKUMOSS_SHIPPED_TABLES"  # "0": a fresh machine starts from an empty table


def share_cache_with_lycoris() -> Path:
    """Point lycoris-lora's kernel table at our cache folder (an explicit LYCORIS_KERNEL_CACHE_DIR wins),
    seeded with the lycoris tables shipped for the cards this project timed."""
    if LYCORIS_ENV not in os.environ:
        os.environ[LYCORIS_ENV] = str(user_cache_dir() / "lycoris")
    folder = Path(os.environ[LYCORIS_ENV])
    if os.environ.get(SHIPPED_ENV, "1") != "0":
        seed_lycoris_tables(folder)
    return folder


def seed_lycoris_tables(folder: Path, shipped: Path | None = None) -> list[Path]:
    """Copy each shipped lycoris table (`tables/lycoris/<arch>-<card>.json`) that `folder/kernels` lacks;
    lycoris's own stamp check ignores one timed under other versions. Returns the files written."""
    shipped = SHIPPED_DIR / "lycoris" if shipped is None else shipped
    written = []
    for source in sorted(shipped.glob("*.json")):
        target = folder / "kernels" / source.name
        if target.exists():
            continue
        try:
            atomic_write_text(target, source.read_text(encoding="utf-8"))
        except OSError as e:  # a read-only cache: lycoris times as it would without the seed
            log_once(log, f"lycoris table {target} not seeded from {source} ({e})", logging.WARNING)
            continue
        written.append(target)
    return written


LYCORIS_TUNE_ENV = "LYCORIS_KERNEL_TUNE"
_HELD_ENV = "KOHAKUMOSS_HELD_LYCORIS_TUNE"  # marks the value as ours, for child processes that inherit it
_LYCORIS_TUNE_SET_BY_USER = LYCORIS_TUNE_ENV in os.environ and _HELD_ENV not in os.environ


def hold_lycoris_tuning() -> None:
    """lycoris's config timing off outside our tuning windows (unless the user set LYCORIS_KERNEL_TUNE);
    through its env variable, as importing lycoris here would cost seconds."""
    if not _LYCORIS_TUNE_SET_BY_USER:
        os.environ[LYCORIS_TUNE_ENV] = "off"
        os.environ[_HELD_ENV] = "1"


@contextlib.contextmanager
def lycoris_tuning(enabled: bool) -> Iterator[None]:
    """lycoris times new keys' configs inside (enabled) or not; restored after. A user's
    LYCORIS_KERNEL_TUNE is left alone."""
    if _LYCORIS_TUNE_SET_BY_USER:
        yield
        return
    try:
        from lycoris.kernels.plans import tune
    except ImportError:  # lycoris without its kernels: nothing to time
        yield
        return
    previous = tune.set_tuning(enabled)
    try:
        yield
    finally:
        tune.set_tuning(previous)


share_cache_with_lycoris()
share_compile_caches()  # Triton's, Inductor's and TileLang's compiled kernels beside the tables
hold_lycoris_tuning()

MODES = ("off", "table", "always")
ENV = "KOHAKUMOSS_TUNE"
BUDGET_ENV = "KOHAKUMOSS_TUNE_BUDGET_S"  # seconds a window may spend timing; later keys keep the default
_window = threading.local()


def tune_mode(explicit: str | None = None) -> str:
    mode = (explicit or os.environ.get(ENV) or "table").lower()
    if mode not in MODES:
        raise ConfigError(f"OpSet(tune=...) / ${ENV}", f"'{mode}' is not one of {MODES}")
    return mode


# Device-time candidates are captured on one stream into one memory pool per device, the pool kept alive
# by the first graph captured into it: each capture reuses what the one before freed (the allocator reuses
# a block only on the stream it was made on). A pool per capture holds every candidate's buffers until the
# allocator's cache is emptied.
_timing_keepers: dict[int, tuple[torch.cuda.CUDAGraph, torch.cuda.Stream]] = {}
_stored: list[tuple[str, Path]] = []  # (key, table file) timed and stored since the process started
_stored_launches: list[tuple[str, Path]] = []  # the same for Triton launch-config picks (triton_utils.pick)


@contextlib.contextmanager
def tuning_window(mode: str | None = None) -> Iterator[None]:
    """Calls made inside time their missing shape keys (TUNE=table); the prewarm step runs in one.
    (How they are timed, wall or device, is the OpSet's `timing`.) The outermost window logs what it
    timed and where it was kept: a first run on a card spends a minute or two here, later runs none.
    mode: the caller's TUNE mode (default: the env's); lycoris's own config timing is on inside
    unless it is "off"."""
    depth = getattr(_window, "depth", 0)
    _window.depth = depth + 1
    before, launches, t0 = len(_stored), len(_stored_launches), time.perf_counter()
    if depth == 0:
        _window.deadline = t0 + float(os.environ.get(BUDGET_ENV) or 180)
        _window.over = 0
    try:
        with lycoris_tuning(tune_mode(mode) != "off"):
            yield
    finally:
        _window.depth = depth
        new, picked = _stored[before:], _stored_launches[launches:]
        if depth == 0 and (new or picked):
            files = sorted({str(path) for _, path in new + picked})
            log.info(
                f"kernel prewarm: timed {len(new)} new shape keys and {len(picked)} launch configs in "
                f"{time.perf_counter() - t0:.0f} s; kept in {', '.join(files)} (later runs reuse them)"
            )
        if depth == 0:
            release_timing_pools()
        if depth == 0 and _window.over:
            log.warning(
                f"kernel prewarm: {_window.over} calls of untimed shape keys ran their first backend: "
                f"the {BUDGET_ENV} budget was spent; a later run times them"
            )


def in_tuning_window() -> bool:
    """Inside a window whose time budget is not spent (a call past it is counted, not timed)."""
    if getattr(_window, "depth", 0) == 0:
        return False
    if time.perf_counter() > _window.deadline:
        _window.over += 1
        return False
    return True


def card_name(device: torch.device | str) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    elif device.type == "xpu":
        name = torch.xpu.get_device_name(device)
    else:
        name = "cpu"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "unknown"


def software_versions() -> dict[str, str]:
    versions = {"torch": torch.__version__}
    try:
        import triton

        versions["triton"] = triton.__version__
    except ImportError:
        pass
    return versions


class TuningTable:
    """One card's table: shape key -> {"backend", "ms": {backend: time}}; and the Triton launch configs
    `triton_utils.pick` chose: kernel key -> {"config", "candidates", "us"}."""

    def __init__(self, path: Path, versions: dict[str, str] | None = None, arch: str | None = None):
        self.path = Path(path)
        self.versions = versions or software_versions()
        self.arch = (
            arch  # the card's arch (sm90), kept in the file: a shipped table's picks guide its siblings'
        )
        self.entries: dict[str, dict] = {}
        self.launches: dict[str, dict] = {}
        self._lock = threading.Lock()
        self.load()

    @classmethod
    def for_card(cls, card: str, arch: str | None = None) -> TuningTable:
        table = cls(user_cache_dir() / "tuning" / f"{card}.json", arch=arch)
        if os.environ.get(SHIPPED_ENV, "1") != "0":
            table.seed(SHIPPED_DIR / f"{card}.json")
        return table

    def seed(self, path: Path) -> int:
        """Fill the rows and launch configs this table lacks from `path` (a shipped table) when it was
        timed under these versions; returns how many were added. Nothing is written until a new row is."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            return 0
        if data.get("versions") != self.versions:
            return 0
        rows = {k: v for k, v in data.get("entries", {}).items() if k not in self.entries}
        launches = {k: v for k, v in data.get("launches", {}).items() if k not in self.launches}
        self.entries.update(rows)
        self.launches.update(launches)
        if rows or launches:
            log_once(log, f"tuning table: {len(rows)} rows and {len(launches)} launch configs from {path}")
        return len(rows) + len(launches)

    def load(self) -> None:
        data = self._read()
        if data is not None:
            self.entries = dict(data.get("entries", {}))
            self.launches = dict(data.get("launches", {}))

    def _read(self, quiet: bool = False) -> dict | None:
        """The file's table when it was timed under these versions; None (and one warning, unless quiet)
        when it is missing, unreadable or from other versions."""
        if not self.path.exists():
            return None
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if not isinstance(data, dict) or not all(
                isinstance(data.get(part, {}), dict) for part in ("entries", "launches")
            ):
                raise ValueError("not a tuning table")
        except (OSError, ValueError) as e:  # JSONDecodeError is a ValueError
            if not quiet:
                log_once(log, f"tuning table {self.path} unreadable ({e}); timing again, it will be "
                         "rewritten", logging.WARNING)  # fmt: skip
            return None
        if data.get("versions") != self.versions:
            if not quiet:
                log_once(log, f"tuning table {self.path} was timed under {data.get('versions')}; re-timing")
            return None
        return data

    def get(self, key: str, candidates: Iterable[str] = ()) -> str | None:
        """The stored choice for `key`; None when a row is missing or one of `candidates` was never tried
        for it (a backend added since: the row is timed again)."""
        entry = self.entries.get(key)
        if not entry:
            return None
        tried = set(entry.get("tried", entry["ms"]))
        return None if set(candidates) - tried else entry["backend"]

    def put(self, key: str, backend: str, ms: dict[str, float], tried: Iterable[str] = ()) -> None:
        """Store a choice; `tried`: every candidate timed, those that failed included."""
        with self._lock:
            entry = {"backend": backend, "ms": {k: round(v, 4) for k, v in ms.items()}}
            if set(tried) - set(ms):
                entry["tried"] = sorted(set(tried) | set(ms))
            self.entries[key] = entry
            self._save()
            _stored.append((key, self.path))

    def get_launch(self, key: str, candidates: Sequence[tuple]) -> tuple | None:
        """The launch config stored for `key` when it was chosen for this kernel's candidate list (the
        configs it offered then include all of these; only some of them may have been timed,
        `launch_prune`), else None: a kernel that gained a config is timed again."""
        entry = self.launches.get(key)
        if not entry:
            return None
        offered = {tuple(c) for c in entry.get("offered", entry["candidates"])}
        config = tuple(entry["config"])
        wanted = {tuple(c) for c in candidates}
        return config if config in wanted and wanted <= offered else None

    def put_launch(
        self,
        key: str,
        config: tuple,
        candidates: Sequence[tuple],
        us: dict[tuple, float],
        offered: Sequence[tuple] | None = None,
    ) -> None:
        """Store a pick: `candidates` the configs timed, `offered` the kernel's whole list (default: the same)."""
        with self._lock:
            entry = {
                "config": list(config),
                "candidates": [list(c) for c in candidates],
                "us": {str(c): round(t, 2) for c, t in us.items()},
            }
            if offered is not None and {tuple(c) for c in offered} != {tuple(c) for c in candidates}:
                entry["offered"] = [list(c) for c in offered]
            self.launches[key] = entry
            self._save()
            _stored_launches.append((key, self.path))

    def _save(self) -> None:
        """Write the table atomically, with the rows other processes (ranks) stored meanwhile: under the
        file's lock the file is read again and its rows this table lacks are taken in."""
        with exclusive(self.path.with_name(self.path.name + ".lock")):
            disk = self._read(quiet=True) or {}
            for part, mine in (("entries", self.entries), ("launches", self.launches)):
                for key, value in disk.get(part, {}).items():
                    mine.setdefault(key, value)
            data = {"versions": self.versions, "entries": self.entries}
            if self.launches:
                data["launches"] = self.launches
            if self.arch or disk.get("arch"):
                data["arch"] = self.arch or disk["arch"]
            atomic_write_json(self.path, data)


_tables: dict[str, TuningTable] = {}


def table_for(card: str, arch: str | None = None) -> TuningTable:
    """The card's table (one per process); arch, where the caller knows it, is written into the file."""
    if card not in _tables:
        _tables[card] = TuningTable.for_card(card, arch)
    elif arch and not _tables[card].arch:
        _tables[card].arch = arch
    return _tables[card]


@functools.lru_cache(maxsize=1)
def _shipped_tables() -> tuple[tuple[str, str | None, dict, dict], ...]:
    """(card, arch, entries, launches) of every table shipped with the package, whatever its versions."""
    out = []
    for path in sorted(SHIPPED_DIR.glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        out.append(
            (path.stem, data.get("arch"), dict(data.get("entries", {})), dict(data.get("launches", {})))
        )
    return tuple(out)


SLOW_BACKEND = 1.5  # a backend this much slower than the winner on a same-arch card is not timed again


def backends_worth_timing(key: str, arch: str | None, names: Sequence[str]) -> list[str]:
    """The backends of `names` to time for a shape key: where a shipped table of a card of the same arch
    timed this key, those within SLOW_BACKEND of its winner and any it did not time (new since); else all.
    (The reference at 5B shapes ran 4-30x the fused kernels on the H200: timing it again buys nothing.)"""
    if arch is None or os.environ.get(SHIPPED_ENV, "1") == "0":
        return list(names)
    for _, table_arch, entries, _ in _shipped_tables():
        entry = entries.get(key)
        if table_arch != arch or not entry or not entry.get("ms"):
            continue
        ms, best = entry["ms"], min(entry["ms"].values())
        kept = [n for n in names if n not in ms or ms[n] <= SLOW_BACKEND * best]
        return kept or list(names)
    return list(names)


def launch_prior(name: str, row: str, arch: str | None) -> tuple[tuple | None, dict[tuple, int]]:
    """What the shipped tables say about a launch-config pick before it is timed (launch_prune.prune):
    the config a card of the same arch picked for this very row (None if none did), and how often each
    compiled variant won kernel `name` in any shipped table. Nothing with KOHAKUMOSS_SHIPPED_TABLES=0."""
    from .launch_prune import variant

    known, wins = None, {}
    if os.environ.get(SHIPPED_ENV, "1") == "0":
        return known, wins
    for _, table_arch, _, launches in _shipped_tables():
        entry = launches.get(row)
        if known is None and entry and arch is not None and table_arch == arch:
            known = tuple(entry["config"])
        for key, other in launches.items():
            if key.split("|", 1)[0] == name:
                v = variant(name, tuple(other["config"]))
                wins[v] = wins.get(v, 0) + 1
    return known, wins


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "xpu":
        torch.xpu.synchronize(device)


def _fresh_args(args: tuple, kwargs: dict) -> tuple[tuple, dict, list[torch.Tensor]]:
    """Detached leaves for the tensor arguments that need a gradient; the others as they are (so an
    index tensor keeps its registered host values, `runtime/host_values.py`)."""
    leaves: list[torch.Tensor] = []

    def fresh(a):
        if isinstance(a, torch.Tensor) and a.requires_grad:
            t = a.detach().requires_grad_(True)
            leaves.append(t)
            return t
        if isinstance(a, (tuple, list)):  # a group's tensors (lora_group): timing must not touch their grads
            return type(a)(fresh(b) for b in a)
        return a

    return tuple(fresh(a) for a in args), {k: fresh(v) for k, v in kwargs.items()}, leaves


def time_call(
    fn: Callable, args: tuple, kwargs: dict, rounds: int = 3, calls: int = 5, device_time: bool = False
) -> float:
    """Milliseconds per call of fn(*args) (plus its backward when an input needs a gradient): the best
    of `rounds` rounds of `calls` back-to-back calls, after a warm-up call (compiles, autotunes).
    Host overhead stays in the time, as it does in an eager model. device_time (CUDA): the calls are
    captured in a CUDA graph and replayed, as a graphed training step runs them; a backend that cannot
    be captured raises RuntimeError (and is skipped)."""
    # outside any saved-tensor hooks (checkpointing counts what its forward saves and recomputes it;
    # offload packs it to the host): the candidates' own tensors belong to no block
    with torch.autograd.graph.saved_tensors_hooks(_keep, _keep):
        return _time_call(fn, args, kwargs, rounds, calls, device_time)


def _keep(t: torch.Tensor) -> torch.Tensor:
    return t


def _time_call(fn: Callable, args: tuple, kwargs: dict, rounds: int, calls: int, device_time: bool) -> float:
    first = next(a for a in args if isinstance(a, torch.Tensor))
    a, k, leaves = _fresh_args(args, kwargs)
    backward = bool(leaves) and torch.is_grad_enabled()

    def once():
        out = fn(*a, **k)
        outs = out if isinstance(out, tuple) else (out,)
        outs = [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
        if backward and outs:
            torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
            for leaf in leaves:
                leaf.grad = None

    if device_time and first.device.type == "cuda":
        return _graph_ms(once, first.device, rounds, calls)
    once()
    best = float("inf")
    for _ in range(rounds):
        _synchronize(first.device)
        start = time.perf_counter()
        for _ in range(calls):
            once()
        _synchronize(first.device)
        best = min(best, (time.perf_counter() - start) * 1e3 / calls)
    return best


def release_timing_pools() -> None:
    """Free the timing captures' memory pools (the outermost tuning window does this when it ends)."""
    if not _timing_keepers:
        return
    _timing_keepers.clear()
    gc.collect()  # a failed candidate's graph may sit in an exception's reference cycle
    torch.cuda.empty_cache()


def _graph_ms(once: Callable[[], None], device: torch.device, rounds: int, calls: int) -> float:
    """Milliseconds per call when `calls` calls replay from one CUDA graph (device time alone)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    keeper, stream = _timing_keepers.get(index) or (None, torch.cuda.Stream(device))
    # the warm-up call on the capture stream, as torch's graph recipe does: per-stream lazy state (cuBLAS's
    # workspace for this stream) is made outside the capture
    current = torch.cuda.current_stream(device)
    stream.wait_stream(current)
    with torch.cuda.stream(stream):
        once()
    current.wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    # not torch.cuda.graph(): that one also runs gc.collect() and empty_cache() per capture, which made
    # the first step of a 5B run tune for ~2 minutes; and a failed capture must not leave the allocator
    # in capture mode (kohakumoss_kernels.runtime.capture)
    try:
        with capture(graph, device, pool=keeper.pool() if keeper is not None else None, stream=stream):
            for _ in range(calls):
                once()
    except Exception as e:  # not capturable: a graphed step could not use this backend either
        _timing_keepers.pop(index, None)  # a failed capture may have released the shared pool: start anew
        raise RuntimeError(f"not capturable in a CUDA graph ({type(e).__name__}: {e})") from None
    if keeper is None:
        _timing_keepers[index] = (graph, stream)
    best = float("inf")
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / calls)
    return best

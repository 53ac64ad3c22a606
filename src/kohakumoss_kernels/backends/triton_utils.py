"""What every Triton backend shares: which (arch, dtype) it supports, launch sizes, the SM count, and a
small launch-config picker that times a few candidates once per (kernel, width, dtype, size)."""

from __future__ import annotations

import contextlib
import functools
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from kohakumoss_common.log import get_logger

log = get_logger("kohakumoss.kernels.triton")

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_TILE = 16384  # elements of one [ROWS, BLOCK] tile: more spills registers on every card we know
MIN_PER_THREAD_WIDE = 4  # elements per thread of a 32-warp backward candidate (8-byte bf16 loads)
ENV_PICK = "KOHAKUMOSS_TRITON_PICK"  # "0": never time launch configs, use the first candidate


def supports(arch: str, dtype: torch.dtype) -> bool:
    """Triton runs from sm75 (bf16 from sm80) and on Intel XPU; never on the CPU (the interpreter aside)."""
    import triton  # noqa: F401 -- a missing Triton makes the backend skip itself

    if dtype not in _DTYPES:
        return False
    if arch == "xpu":
        return True
    if not (arch.startswith("sm") and arch[2:].isdigit()):
        return False
    sm = int(arch[2:])
    return sm >= 80 or (sm >= 75 and dtype != torch.bfloat16)


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def row_block(d: int) -> tuple[int, int]:
    """BLOCK (a power of two >= d) and num_warps for a one-row-per-program kernel."""
    block = next_pow2(d)
    return block, max(1, min(16, block // 256))


def tile_configs(block: int, min_rows: int = 1, max_per_thread: int = 32) -> list[tuple[int, int]]:
    """(rows per tile, num_warps) candidates for a [rows, block] tile, the default first.

    Each thread holds 8..max_per_thread elements of the tile (16-byte vector loads, no spills);
    the default is about 2K elements per tile with 16 per thread.
    """
    if interpreting():  # several rows per tile so the CPU run covers the tile masks
        return [(max(min_rows, min(4, MAX_TILE // block)), 1)]
    out = []
    rows = min_rows
    while rows * block <= MAX_TILE:
        for warps in (4, 8, 16):
            per_thread = rows * block // (32 * warps)
            if 8 <= per_thread <= max_per_thread:
                out.append((rows, warps))
        rows *= 2
    if not out:
        out = [(min_rows, max(1, min(16, min_rows * block // 128)))]
    default_rows = max(min_rows, min(MAX_TILE // block, max(1, 2048 // block)))
    default = min(out, key=lambda rw: (abs(rw[0] - default_rows), abs(rw[0] * block // (32 * rw[1]) - 16)))
    return [default] + [c for c in out if c != default]


def backward_configs(block: int, min_rows: int = 1) -> list[tuple[int, int, int]]:
    """(rows per tile, num_warps, programs per SM) candidates for the persistent backwards, default first.
    The programs per SM change only the launch grid (no recompile). Tiles above MAX_TILE / 2 elements
    are left out: with the prefetched next tile they spilled and ran 2-30x slower on the H200."""
    tiles = tile_configs(block, min_rows)
    if interpreting():
        return [(*tiles[0], 2)]
    tiles = [t for t in tiles if t[0] * block <= MAX_TILE // 2] or tiles[:1]
    # 32 warps, the most a program can have: half the registers per thread of 16 (the per-sample sums'
    # backwards take 104-110 at 1 x 16, one program per SM; 50-51 at 1 x 32). At most 2 x 1024 threads
    # fit an SM, so no 4 programs per SM of them.
    wide = sorted({(r, 32) for r, _ in tiles if MIN_PER_THREAD_WIDE <= r * block // (32 * 32) <= 16})
    return [(*t, pps) for pps in (2, 1, 4) for t in tiles] + [(*t, pps) for pps in (2, 1) for t in wide]


REGISTER_FILE = 65536  # 32-bit registers per SM on every NVIDIA card from sm70 to sm90


def register_cap(warps: int, per_sm: int) -> int | None:
    """The registers per thread (a multiple of 8) that let `per_sm` programs of `warps` warps fit an SM's
    register file together; None where that is above the 255 a thread can have anyway."""
    cap = REGISTER_FILE // (per_sm * warps * 32) // 8 * 8
    return cap if cap < 255 else None


def register_budget(x: torch.Tensor, warps: int, per_sm: int) -> dict[str, int]:
    """register_cap as a launch option (maxnreg; {} where there is none, or off CUDA). Left to itself
    ptxas takes up to its 128-register limit at 16 warps (norm_modulate's backward: 104), one program per
    SM, which makes a persistent backward's second program per SM wait for the first."""
    cap = register_cap(warps, per_sm)
    if cap is None or x.device.type != "cuda" or interpreting():
        return {}
    return {"maxnreg": cap}


def row_key(x: torch.Tensor, rows: int, d: int) -> tuple:
    """The picker's key of a row kernel: width, dtype, size bucket, device."""
    return (d, x.dtype, size_bucket(rows), x.device)


def row_configs(d: int) -> list[tuple[int, int]]:
    """The (ROWS, num_warps) candidates of a one-tile-per-program row kernel of width d."""
    return tile_configs(next_pow2(d), max_per_thread=64)


def row_launch(
    kernel, rows: int, d: int, *args, width: dict | None = None, **meta
) -> Callable[[tuple], None]:
    """launch(cfg) for `pick`: `kernel(*args, **meta, ROWS, **width)` over `rows` rows of width d, one tile
    of cfg = (ROWS, num_warps) rows per program; the candidates are `row_configs(d)`. `width`: the row's
    constexprs, BLOCK = next_pow2(d) unless given (row_chunks: W and C)."""
    width = {"BLOCK": next_pow2(d)} if width is None else width

    def launch(cfg: tuple) -> None:
        tile, warps = cfg
        kernel[((rows + tile - 1) // tile,)](*args, **meta, ROWS=tile, **width, num_warps=warps)

    return launch


@functools.lru_cache(maxsize=8)
def _sm_count(device: str) -> int:
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_properties(dev).multi_processor_count
    if dev.type == "xpu":
        return getattr(torch.xpu.get_device_properties(dev), "gpu_subslice_count", 64)
    return 1  # the interpreter: two programs, so a chunk holds whole samples in its middle


def reduce_programs(x: torch.Tensor, rows: int) -> int:
    """How many programs a kernel that also reduces over rows should launch (a few per SM)."""
    return max(1, min(rows, 4 * _sm_count(str(x.device))))


def persistent_programs(x: torch.Tensor, tiles: int, per_sm: int = 2) -> int:
    """Programs for a backward that walks a chunk of tiles each and writes one partial sum per program:
    `per_sm` per SM (few partials to reduce, each program with loads in flight), at least one."""
    return max(1, min(tiles, per_sm * _sm_count(str(x.device))))


def size_bucket(n: int) -> int:
    """Round a row count up to a power of four (at least 1024): the picker's size key."""
    b = 1024
    while b < n:
        b *= 4
    return b


_PICKED: dict[tuple, tuple] = {}
_TIMES: dict[tuple, dict[tuple, float]] = {}


def picked(with_times: bool = False) -> dict[str, object]:
    """Launch configs chosen so far in this process (for logs and benchmarks), optionally with every
    candidate's time in microseconds."""
    if not with_times:
        return {"|".join(map(str, k)): str(v) for k, v in _PICKED.items()}
    return {
        "|".join(map(str, k)): {
            "chosen": str(v),
            "us": {str(c): round(t * 1e3, 2) for c, t in _TIMES[k].items()},
        }
        for k, v in _PICKED.items()
        if k in _TIMES
    }


def _may_time() -> bool:
    if interpreting() or os.environ.get(ENV_PICK, "1") == "0":
        return False
    if torch.compiler.is_compiling():
        return False
    return not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


HOLD_CYCLES = 20_000_000  # ~10 ms of spinning at H200 clocks: longer than the host takes to queue the reps


def device_ms(fn: Callable[[], None], reps: int = 10, rounds: int = 3) -> float:
    """Device milliseconds of one `fn` call: the best of `rounds` means over `reps` back-to-back calls,
    after two warm ones, by the accelerator's events. On CUDA the stream is held by a spinning kernel
    while the host queues the reps, so the calls run back to back and a launch's host overhead (buffer
    allocations, Python) is not what gets timed: the step replays from a CUDA graph, where it costs
    nothing. Not triton's do_bench: it allocates a 256 MB cache-flush buffer, and picks run inside the
    first step, at a capped card's peak."""
    for _ in range(2):
        fn()
    hold = getattr(torch.cuda, "_sleep", None) if torch.cuda.is_available() else None
    best = math.inf
    for _ in range(rounds):
        start, end = torch.Event(enable_timing=True), torch.Event(enable_timing=True)
        if hold is not None:
            hold(HOLD_CYCLES)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / reps)
    return best


def _launch_table(name: str, key: tuple):
    """(row name, the card's tuning table, its arch) where a pick is kept across runs: keys with a device."""
    from .. import tuning

    devices = [k for k in key if isinstance(k, torch.device)]
    if interpreting() or not devices:
        return None, None, None
    row = "|".join([name, *(str(k) for k in key if not isinstance(k, torch.device))])
    arch = _arch(str(devices[0]))
    return row, tuning.table_for(tuning.card_name(devices[0]), arch), arch


@functools.lru_cache(maxsize=8)
def _arch(device: str) -> str | None:
    from kohakumoss_common.device import device_info

    return device_info(device).arch if torch.device(device).type != "cpu" else None


def worth_timing(
    name: str, key: tuple, candidates: Sequence[tuple], row: str | None, arch: str | None
) -> list[tuple]:
    """The candidates `pick` times on this card, best guess first (`launch_prune.prune`: rules by the card's
    limits, the shipped tables' picks as the prior, a cap on compiled variants)."""
    from .. import tuning
    from ..tuning import launch_prune

    devices = [k for k in key if isinstance(k, torch.device)]
    card = launch_prune.card_limits(str(devices[0])) if devices else None
    known, wins = tuning.launch_prior(name, row, arch) if row is not None else (None, {})
    return launch_prune.prune(name, key, candidates, card, known, wins)


def pick(name: str, key: tuple, candidates: Sequence[tuple], launch: Callable[[tuple], None]) -> tuple:
    """The fastest of `candidates` for (name, *key), timed once per card with `launch(config)` and kept in
    the card's tuning table (`tuning.TuningTable.launches`), so later runs time nothing again. Only the
    candidates `worth_timing` keeps are timed; a stored pick answers while the kernel offers no new config.

    `launch` must be safe to repeat (it writes only its outputs; callers reset accumulated buffers
    afterwards). Where timing is not allowed (interpreter, graph capture, tracing) a stored pick or the
    best guess is used and nothing is stored. KOHAKUMOSS_TUNE=always times again.
    """
    from .. import tuning

    full = (name, *key)
    if full in _PICKED:
        return _PICKED[full]
    if len(candidates) == 1 or os.environ.get(ENV_PICK, "1") == "0" or torch.compiler.is_compiling():
        return candidates[0]
    row, table, arch = _launch_table(name, key)
    if table is not None and tuning.tune_mode() != "always":
        stored = table.get_launch(row, candidates)
        if stored is not None:
            _PICKED[full] = stored
            return stored
    offered, candidates = candidates, worth_timing(name, key, candidates, row, arch)
    if not _may_time():
        return candidates[0]
    ms = {}
    for c in candidates:
        try:
            launch(c)  # compile outside the timed calls
            ms[c] = device_ms(lambda c=c: launch(c))
        except Exception as e:  # a config that does not compile (resources) is just not a candidate
            log.debug(f"{name} {key}: config {c} failed ({type(e).__name__}: {e})")
    best = min(ms, key=ms.get) if ms else candidates[0]
    _PICKED[full] = best
    _TIMES[full] = ms
    if table is not None and ms:
        table.put_launch(row, best, candidates, {c: t * 1e3 for c, t in ms.items()}, offered)
    log.debug(f"{name} {key}: {best} ({', '.join(f'{c} {t * 1e3:.1f} us' for c, t in ms.items())})")
    return best


@dataclass
class Compiles:
    """Triton JIT compiles counted by `counting_compiles` (a cache hit on disk counts too, quickly)."""

    available: bool = False  # this Triton has the JIT hooks (triton.knobs.runtime)
    kernels: int = 0
    seconds: float = 0.0


@contextlib.contextmanager
def counting_compiles() -> Iterator[Compiles]:
    """Count Triton's JIT compiles inside, and their seconds, through triton.knobs' JIT hooks (chained to
    hooks already set, restored after). A run's first step compiles every kernel it meets on a machine
    whose Triton cache is empty: most of a fresh machine's first step that the tuning does not explain."""
    stats = Compiles()
    try:
        from triton import knobs

        runtime = knobs.runtime
        before, after = runtime.jit_cache_hook, runtime.jit_post_compile_hook
    except (ImportError, AttributeError):
        yield stats
        return
    starts: list[float] = []

    def on_compile(**kwargs):
        starts.append(time.perf_counter())
        return before(**kwargs) if before is not None else None  # truthy would skip the compile

    def on_compiled(**kwargs):
        if starts:
            stats.kernels += 1
            stats.seconds += time.perf_counter() - starts.pop()
        return after(**kwargs) if after is not None else None

    stats.available = True
    runtime.jit_cache_hook, runtime.jit_post_compile_hook = on_compile, on_compiled
    try:
        yield stats
    finally:
        runtime.jit_cache_hook, runtime.jit_post_compile_hook = before, after

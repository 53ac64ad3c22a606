"""The trainer as a user starts it (`kogine run scripts/train/moss.py`), over a matrix of cards and runs.

    python scripts/bench/user_runs.py --rows whole/lora/2,card24/lora/2,card24/lora/4 --bench $OUT/train_step.json
    python scripts/bench/user_runs.py --rows default --out $OUT/user_runs.json
    python scripts/bench/user_runs.py --rows fastpath --seed-cache .cache/kohakumoss   # defaults vs legacy
    python scripts/bench/user_runs.py --preset tiny --device cpu --rows cpu      # CPU smoke (CI)
    python scripts/bench/user_runs.py --rows card24/lora/2 --first-step --steps 3 --warmup 1   # step 1: cold/warm
    python scripts/bench/user_runs.py --rows int8_base --out $OUT/int8_base.json  # ConvRot int8 vs bf16 file

A row is CARD/ADAPTER/IMAGES[/online][/fp8][/PROFILE][/ENGINE][/FORWARD][/WEIGHTS][/BASE]:
- CARD `whole` (the GPU as it is) or `cardN` (CARD_GB=N: MEMORY_PROFILE 'auto' plans for an N GiB card and
  the process is capped to N GiB, so a smaller card is emulated honestly);
- ADAPTER `lora`, `lokr` or `full`, with the knobs `kohakumoss-config new train` writes for the card: its GPU
  layer (configs/moss/gpu: cardN's N GB layer, whole's the card present's) under the algo layer, so the
  adapter is the shipped one (TARGET_PRESET 'attn-mlp', BYPASS 'auto', the layer's rank; --rank overrides);
- FORWARD (adapter rows) `legacy`: the adapter these rows ran before, LoRA r32 (--rank) on every DiT linear
  (TARGET_PRESET 'full') with BYPASS=True; `bypass` / `merged`: the shipped adapter with BYPASS=True / False;
- WEIGHTS `bf16file` / `convrot`: WEIGHTS is Comfy-Org's bf16 / ConvRot int8 DiT file of the preset's random
  weights (scripts/bench/write_weights.py writes them once under --weights-dir, the same values as
  MODEL_PRESET's), loaded as a user's file is; BASE `int8` / `int8_weight`: BASE_PRECISION, which keeps
  the ConvRot file's int8 bytes (int8 forward GEMMs / dequantized per call);
- IMAGES per step at 1 MP (TOKENS_PER_STEP = IMAGES x (4096 + 256));
- `online`: VAE_ENCODE / TEXT_ENCODE online (the encoders run every step) instead of the caches the
  trainer fills before its first step (VAE_ENCODE 'auto'), with TEXT_ENCODER / VAE 'random': the real
  Qwen3.5 and FLUX.2 VAE architectures with random weights, sized by the preset, so encoding costs what it
  costs; `fp8`: BASE_PRECISION=fp8; PROFILE (speed, balanced, low_vram, minimal): MEMORY_PROFILE set by
  name instead of 'auto'; ENGINE (ddpN, fsdpN, pipelineN, threadedN): DISTRIBUTED over N GPUs (DEVICES=N),
  IMAGES per GPU, so the step holds N times the tokens; the table then gives the scaling against the same
  row on one GPU when both ran (tokens/s over N x the one-GPU row's).
Each row runs in its own process from an empty kernel tuning cache (a fresh machine: seeded from the table
shipped for the card, if any; --empty-table: none, as on a card this project never timed), random weights of
the preset, TEXT_ENCODER / VAE 'synthetic' (cheap stand-ins: those rows encode before the first step) or
'random' in the /online rows, a kohya folder of synthetic images. Per row: completed, steps, median
tokens/s of the steps after the warm-up (the trainer's own metrics.jsonl), the step peak (its peak_mem_gib) and
the allocator's reserved peak (peak_reserved_gib) against the cap, the
plan's predicted peak (log.txt), the first step's cost, and the ratios to the train_step.py row of the
same plan when --bench gives that benchmark's JSON (run in the same device call): tokens/s, and s/step
(the benchmark's over the trainer's), which tells a slower step from one holding fewer tokens.

--first-step: each row runs in phases (--phases), each its own process, to time a run's first step:
- `cold`: an empty user cache (no tuning table, no compiled kernel: a card never timed on a fresh machine;
  the package's shipped tables still guide the launch-config picks unless --empty-table);
- `warm`: the same cache again, as the cold run left it (a second run on that machine: nothing to time,
  nothing to compile);
- `shipped`: a fresh cache holding only the cold run's tuning tables, ours and lycoris-lora's (a fresh
  machine of a card whose tables ship: picks known, kernels still compiled once).
Per phase: the first step's seconds, what the prewarm timed, Triton's compiles in the first micro-step.
The cold phase's tables (`--logs`/<row>-cold/tuning/<card>.json, .../lycoris/kernels/) are the ones to
ship (scripts/bench/ship_tuning.py). Without --first-step the rows share one compiled-kernel cache (`work/compiled`)
and each starts from an empty tuning table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GROUPS = {
    "default": "whole/lora/2,card48/lora/2,card24/lora/1,card24/lora/2,card24/lora/4,card16/lora/2,"
    "card12/lora/2,card8/lora/1,card6/lora/1,card24/lora/2/fp8,card24/lora/2/online,whole/lokr/2,"
    "whole/full/2,card80/full/2,card24/full/1",
    "cpu": "whole/lora/1,whole/lokr/2",
    # the shipped defaults against the rows this benchmark ran before (TARGET_PRESET 'full', BYPASS=True)
    "fastpath": "card24/lora/2,card24/lora/2/legacy,whole/lora/2,whole/lora/2/legacy",
    # the trainer against train_step.py's rows of the same plan (run both in one device call)
    "profiles": "whole/lora/2/speed,whole/lora/2/balanced,whole/lora/2/low_vram,whole/lora/2/minimal,"
    "whole/full/2/speed",
    # several GPUs against one, the trainer's own tokens/s (a machine with 2 GPUs)
    "scaling": "whole/lora/2/speed,whole/lora/2/speed/ddp2,whole/lora/2/low_vram,whole/lora/2/low_vram/ddp2,"
    "whole/full/2,whole/full/2/fsdp2,whole/lora/2/speed/pipeline2",
    # the int8 base users run (Comfy-Org's ConvRot int8 file, kept int8) against the bf16 file of the same
    # random weights, on the whole card and under 24 / 16 / 12 GiB caps
    "int8_base": ",".join(
        f"{card}/lora/2/{base}"
        for card in ("whole", "card24", "card16", "card12")
        for base in ("bf16file", "convrot/int8", "convrot/int8_weight")
    ),
}
ENGINES = ("ddp", "fsdp", "pipeline", "threaded")
PROFILES = ("speed", "balanced", "low_vram", "minimal")
FORWARDS = ("legacy", "bypass", "merged")
WEIGHT_FILES = ("bf16file", "convrot")  # WEIGHTS: scripts/bench/write_weights.py's comfy / convrot files
WEIGHTS_DIR = "/tmp/kohakumoss-weights"  # --weights-dir's default: outside the work folder and $OUT
BASES = ("int8", "int8_weight")  # BASE_PRECISION of the frozen base (`fp8` has its own field)
LEGACY_RANK = 32  # the rank of the `legacy` rows (and of every adapter row before they took the layers')
PHASES = ("cold", "warm", "shipped")  # --first-step's runs of a row, in this order
# the compilers' cache variables (kohakumoss_kernels/tuning/compile_caches.py): a phase's run sets its own
COMPILE_CACHE_ENV = ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TILELANG_CACHE_DIR",
                     "TORCHINDUCTOR_FX_GRAPH_CACHE", "TORCHINDUCTOR_AUTOGRAD_CACHE",
                     "KOHAKUMOSS_SET_COMPILE_CACHES")  # fmt: skip
BENCH_SAMPLES = 2  # train_step.py's images per step
TEXT_TOKENS = 256  # MAX_TEXT_TOKENS budgeted per image


@dataclass(frozen=True)
class Row:
    name: str
    card_gb: float  # 0: the whole card
    adapter: str
    images: int
    online: bool
    fp8: bool
    profile: str = ""  # '': MEMORY_PROFILE 'auto'
    engine: str = ""  # '': one GPU; else DISTRIBUTED
    gpus: int = 1
    forward: str = ""  # '': the shipped adapter; legacy, bypass or merged (FORWARDS)
    weights: str = ""  # '': MODEL_PRESET; a WEIGHT_FILES part: that file of the same random weights
    base: str = ""  # '': BASE_PRECISION 'same' (or fp8); a BASES part


def parse_row(name: str) -> Row:
    parts = name.split("/")
    if len(parts) < 3 or parts[1] not in ("lora", "lokr", "full") or not parts[2].isdigit():
        raise SystemExit(f"row '{name}': CARD/ADAPTER/IMAGES[/online][/fp8], e.g. card24/lora/2")
    card = parts[0]
    if card != "whole" and not re.fullmatch(r"card\d+(\.\d+)?", card):
        raise SystemExit(f"row '{name}': the card is 'whole' or cardN (GiB)")
    extra = set(parts[3:])
    engines = [
        (m.group(1), int(m.group(2))) for e in extra if (m := re.fullmatch(rf"({'|'.join(ENGINES)})(\d+)", e))
    ]
    extra -= {f"{e}{n}" for e, n in engines}
    if unknown := sorted(extra - {"online", "fp8", *PROFILES, *FORWARDS, *WEIGHT_FILES, *BASES}):
        raise SystemExit(f"row '{name}': unknown parts {unknown}")
    forwards = sorted(extra & set(FORWARDS))
    if len(forwards) > 1 or (forwards and parts[1] == "full"):
        raise SystemExit(f"row '{name}': one adapter forward {FORWARDS}, on an adapter row, not {forwards}")
    profiles = sorted(extra & set(PROFILES))
    if len(profiles) > 1:
        raise SystemExit(f"row '{name}': one memory profile, not {profiles}")
    if len(engines) > 1 or any(n < 2 for _, n in engines):
        raise SystemExit(f"row '{name}': one engine over 2 or more GPUs (e.g. ddp2), not {sorted(engines)}")
    engine, gpus = engines[0] if engines else ("", 1)
    files, bases = (
        sorted(extra & set(WEIGHT_FILES)),
        sorted(extra & set(BASES)) + (["fp8"] if "fp8" in extra else []),
    )
    if len(files) > 1 or len(bases) > 1:
        raise SystemExit(
            f"row '{name}': one weights file {WEIGHT_FILES} and one base precision, not {files + bases}"
        )
    if bases and bases[0] != "fp8" and (not files or parts[1] == "full"):
        raise SystemExit(
            f"row '{name}': '{bases[0]}' keeps a file's int8 base: add 'convrot' (or bf16file), on an adapter row"
        )
    return Row(name, 0.0 if card == "whole" else float(card[4:]), parts[1], int(parts[2]),
               "online" in extra, "fp8" in extra, profiles[0] if profiles else "", engine, gpus,
               forwards[0] if forwards else "", files[0] if files else "",
               bases[0] if bases and bases[0] != "fp8" else "")  # fmt: skip


def single_gpu_row(name: str) -> str:
    """The row's name without its engine part: the same run on one GPU."""
    return "/".join(p for p in name.split("/") if not re.fullmatch(rf"({'|'.join(ENGINES)})\d+", p))


def card_gb(device: str) -> float:
    """The memory of the card present in GiB (nvidia-smi: no CUDA context in this process, which the rows
    share the card with); 0 on the CPU."""
    if not device.startswith("cuda"):
        return 0.0
    index = device.partition(":")[2] or "0"
    query = ["nvidia-smi", "-i", index, "--query-gpu=memory.total", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(query, capture_output=True, text=True, timeout=30, check=True).stdout
        return float(out.split()[0]) / 1024
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as e:
        raise SystemExit(
            f"a 'whole' row takes the GPU layer of the card present: {' '.join(query)}: {e}"
        ) from e


def layer_knobs(a, row: Row) -> dict:
    """The knobs `kohakumoss-config new train` writes for the row's card and adapter: the GPU layer of that
    card (CARD_GB's, or the card present's; the smallest without one), then the algo layer."""
    from kohakumoss.cli.config_layers import compose, gpu_layer_name, layer_path

    gpu = gpu_layer_name(row.card_gb or card_gb(a.device))
    knobs = compose([layer_path("gpu", gpu), layer_path("algo", row.adapter)])
    # where the encoders run is the row's (`online`, else the caches filled before the first step): a small
    # card's layer asks for the offline caches, which the data scripts fill and these rows never run
    return {k: v for k, v in knobs.items() if k not in ("TEXT_ENCODE", "VAE_ENCODE")}


def run_name(row: Row, phase: str | None = None) -> str:
    """The row's run folder (and log) name: one per --first-step phase."""
    return row.name.replace("/", "-") + (f"-{phase}" if phase else "")


def weights_dir(a) -> Path:
    """The random weights of the preset as files (write_weights.py, made once): under --weights-dir, never
    under $OUT (a device call brings $OUT back; the 5B files are 5-10 GB each)."""
    return Path(getattr(a, "weights_dir", None) or WEIGHTS_DIR) / a.preset


def weights_file(a, row: Row) -> Path | None:
    """The WEIGHTS file of a row with a WEIGHT_FILES part, else None (MODEL_PRESET)."""
    if not row.weights:
        return None
    write_weights = load_script("write_weights")
    return write_weights.layout_path(weights_dir(a), "convrot" if row.weights == "convrot" else "comfy")


def load_script(name: str):
    """A sibling bench script as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"{name}_bench", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_weight_files(a, rows: list[Row]) -> None:
    """Write the weights files the rows load, in a process of its own (this one keeps no CUDA context)."""
    layouts = sorted({"convrot" if r.weights == "convrot" else "comfy" for r in rows if r.weights})
    if layouts:
        subprocess.run([sys.executable, str(ROOT / "scripts/bench/write_weights.py"), str(weights_dir(a)),
                        "--preset", a.preset, "--layouts", ",".join(layouts), "--seed", "0",
                        "--device", a.device], check=True)  # fmt: skip


def knobs(a, row: Row, work: Path, phase: str | None = None) -> dict:
    side = a.size // 16
    weights = weights_file(a, row)
    k = {
        **layer_knobs(a, row),
        "MODEL_PRESET": "" if weights else a.preset,
        "DEVICE": a.device,
        "TEXT_ENCODER": "synthetic",
        "VAE": "synthetic",
        "DATASET": {"kind": "kohya", "path": str(data_dir(a, work))},
        "AREA": a.size * a.size,
        "MAX_TEXT_TOKENS": a.text_tokens,
        "TOKENS_PER_STEP": row.gpus * row.images * (side * side + a.text_tokens),  # the whole step, all ranks
        "STEPS": a.steps,
        "RUNS_DIR": str(work / "runs"),
        "RUN_NAME": run_name(row, phase),
        "CACHE_DIR": str(work / "cache"),
        "WORKERS": 4,
        "SAVE_EVERY": 0,
        "SAMPLE_EVERY": 0,
        "LOG_EVERY": 1,
        "SEED": 0,
        "CARD_GB": row.card_gb,
        "ALGO": row.adapter,
    }
    if row.adapter != "full" and (a.rank or row.forward == "legacy"):
        rank = a.rank or LEGACY_RANK
        k.update(RANK=rank, ALPHA=float(rank))
    if row.forward == "legacy":  # the adapter these rows ran before: every DiT linear, bypass forward
        k.update(TARGET_PRESET="full", BYPASS=True)
    elif row.forward:
        k["BYPASS"] = row.forward == "bypass"
    if row.online:  # the encoders run every step: the real architectures, so they cost what they cost
        k.update(TEXT_ENCODER="random", VAE="random", VAE_ENCODE="online", TEXT_ENCODE="online")
    if row.fp8:
        k["BASE_PRECISION"] = "fp8"
    if weights:  # the same random values as MODEL_PRESET's with SEED 0, loaded from the file
        k["WEIGHTS"] = str(weights)
    if row.base:
        k["BASE_PRECISION"] = row.base
    if row.profile:
        k["MEMORY_PROFILE"] = row.profile
    if row.engine:
        k.update(DISTRIBUTED=row.engine, DEVICES=["cpu"] * row.gpus if a.device == "cpu" else row.gpus)
    if a.device == "cpu":
        k.update(PRECISION="fp32", MIN_SIDE=32)
    for item in a.set:  # every row's extra knobs, as kogine reads them (`--set GC_EVERY=1`)
        name, _, value = item.partition("=")
        k[name] = value
    return k


def kogine_argv(k: dict) -> list[str]:
    argv = [sys.executable, "-m", "kohakuengine.cli", "run", str(ROOT / "scripts" / "train" / "moss.py")]
    for name, value in k.items():
        argv += [
            "--set",
            f"{name}={value if isinstance(value, str) else repr(value)}",
        ]  # kogine: bare strings
    return argv


def read_run(run: Path, warmup: int) -> dict:
    """What the trainer wrote: its metrics after the warm-up, its plan and predicted peak, first-step cost."""
    lines = (run / "metrics.jsonl").read_text().splitlines() if (run / "metrics.jsonl").exists() else []
    metrics = [json.loads(line) for line in lines if line.strip()]
    late = [m for m in metrics if m["step"] > warmup] or metrics
    log = (run / "log.txt").read_text() if (run / "log.txt").exists() else ""
    out: dict = {"steps": metrics[-1]["step"] if metrics else 0}
    if late:
        out["tokens_per_s"] = statistics.median(m["tokens_per_s"] for m in late)
        out["step_s"] = statistics.median(m["step_s"] for m in late)
        tokens = [m["tokens"] for m in late if "tokens" in m]  # real tokens: captions shorter than the budget
        out["tokens_per_step"] = statistics.median(tokens) if tokens else None
    if metrics:
        out["peak_gib"] = max(m["peak_mem_gib"] for m in metrics)
        reserved = [m["peak_reserved_gib"] for m in metrics if "peak_reserved_gib" in m]
        out["reserved_gib"] = max(reserved) if reserved else None
        out["first_step_s"] = metrics[0]["step_s"]
    plan = re.search(r"memory plan: (.*)", log)
    out["plan"] = plan.group(1) if plan else None
    predicted = re.search(r"predicted peak ([\d.]+) GiB", log)
    out["predicted_gib"] = float(predicted.group(1)) if predicted else None
    prewarm = re.search(
        r"kernel prewarm: timed (\d+) new shape keys(?: and (\d+) launch configs)? in (\d+) s", log
    )
    out["prewarm"] = (
        f"{prewarm.group(1)} keys, {prewarm.group(2) or 0} launch configs, {prewarm.group(3)} s"
        if prewarm
        else None
    )
    compiled = re.search(r"first micro-step: Triton compiled (\d+) kernels in (\d+) s", log)
    out["triton_compiles"] = int(compiled.group(1)) if compiled else 0
    out["triton_compile_s"] = float(compiled.group(2)) if compiled else 0.0
    stopped = re.search(r"stopped(?: by [A-Za-z]+)?: (.*)", log)
    out["stopped"] = stopped.group(1)[:200] if stopped else None
    return out


def data_dir(a, work: Path) -> Path:
    """The synthetic dataset of this many images, size and caption words (made once, reused)."""
    return work / f"data-{a.images}x{a.size}-{a.caption_words}"


def phase_cache(a, row: Row, work: Path, phase: str | None) -> Path:
    """The user cache a row's run starts from, made ready: empty (a fresh machine; --seed-cache's copy),
    the cold phase's as it left it (warm), or a fresh one holding only the cold phase's tuning table."""
    if phase is None:
        cache = work / "tuning-cache" / run_name(row)
        shutil.rmtree(cache, ignore_errors=True)  # a machine kept warm between calls still starts empty
        if a.seed_cache:  # a machine that ran before: its tuning table reused
            shutil.copytree(a.seed_cache, cache, dirs_exist_ok=True)
        return cache
    cold = work / "first-step" / run_name(row, "cold")
    if phase == "warm":
        return cold
    cache = work / "first-step" / run_name(row, phase)
    shutil.rmtree(cache, ignore_errors=True)
    for table in ("tuning", "lycoris/kernels"):  # ours and lycoris-lora's: what ship_tuning.py ships
        if phase == "shipped" and (cold / table).is_dir():
            shutil.copytree(cold / table, cache / table, ignore=shutil.ignore_patterns("*.lock", "*.tmp"))
    return cache


def row_env(a, cache: Path, work: Path, phase: str | None) -> dict:
    """The run's environment: its user cache; without --first-step every row compiles into one shared
    folder (as Triton's own ~/.triton would be), a phase into its own cache's."""
    env = {k: v for k, v in os.environ.items() if k not in COMPILE_CACHE_ENV}
    env.update(KOHAKUMOSS_CACHE=str(cache), LYCORIS_KERNEL_CACHE_DIR=str(cache / "lycoris"))
    if phase is None:
        compiled = work / "compiled"
        env.update(TRITON_CACHE_DIR=str(compiled / "triton"), TORCHINDUCTOR_CACHE_DIR=str(compiled / "inductor"),
                   TILELANG_CACHE_DIR=str(compiled / "tilelang"))  # fmt: skip
    if a.empty_table:
        env["KOHAKUMOSS_SHIPPED_TABLES"] = "0"
    return env


def run_row(a, row: Row, work: Path, phase: str | None = None) -> dict:
    cache = phase_cache(a, row, work, phase)
    env = row_env(a, cache, work, phase)
    name = run_name(row, phase)
    # a row starts fresh: an earlier call's run of the same row (a machine kept warm) would be refused
    shutil.rmtree(work / "runs" / name, ignore_errors=True)
    t0 = time.perf_counter()
    log_path = work / f"{name}.log"
    with open(log_path, "w") as f:
        proc = subprocess.Popen(kogine_argv(knobs(a, row, work, phase)), env=env, stdout=f, stderr=subprocess.STDOUT,
                                cwd=ROOT)  # fmt: skip
        try:
            rc = proc.wait(timeout=a.row_timeout)
        except subprocess.TimeoutExpired:  # where it was: the trainer prints its stacks on SIGUSR1
            rc = "timeout"
            if hasattr(signal, "SIGUSR1"):
                proc.send_signal(signal.SIGUSR1)
                time.sleep(3)
            proc.kill()
            proc.wait()
    result = {"row": row.name, "rc": rc, "wall_s": time.perf_counter() - t0, "cap_gib": row.card_gb or None}
    if phase:
        result["phase"] = phase
    run = work / "runs" / name
    result.update(read_run(run, a.warmup))
    if a.logs:  # the run's own records, without its checkpoints
        keep = Path(a.logs) / run.name
        keep.mkdir(parents=True, exist_ok=True)
        for src in (run / "log.txt", run / "metrics.jsonl", log_path, *(run / "profile").glob("*")):
            if src.exists():  # profile/: PROFILE_STEPS' kernels.txt and trace
                shutil.copy(src, keep / src.name)
        for table in ("tuning", "lycoris/kernels"):  # the row's tables: for --seed-cache or ship_tuning.py
            if (cache / table).is_dir():
                shutil.copytree(cache / table, keep / table, dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns("*.lock", "*.tmp"))  # fmt: skip
    for heavy in ("checkpoints", "export"):  # a full fine-tune's are tens of GiB: the next row needs the disk
        shutil.rmtree(run / heavy, ignore_errors=True)
    result["completed"] = rc == 0 and result["steps"] == a.steps
    if not result["completed"] and not result.get("stopped"):
        tail = log_path.read_text().strip().splitlines()[-1:] if log_path.exists() else []
        result["stopped"] = f"exit {rc}: {tail[0][:200] if tail else ''}"
    return result


def bench_row(row: Row, plan: str | None) -> str | None:
    """train_step.py's row of the same plan: a whole-card LoRA or full fine-tune at the benchmark's images
    per step, caches hit, under the profile the run used (named, or the one 'auto' picked), with the same
    FORWARD part (its rank is train_step.py's --rank: 32, the whole card's layer has 64)."""
    if (
        row.card_gb
        or row.adapter == "lokr"
        or row.images != BENCH_SAMPLES
        or row.online
        or row.fp8
        or row.engine
        or row.weights
    ):
        return None
    picked = re.search(r"profile '(\w+)'", plan or "")
    profile = row.profile or (picked.group(1) if picked else "speed")
    forward = f"/{row.forward}" if row.forward else ""  # train_step.py's rows take the same FORWARD parts
    return f"{row.adapter}/{profile}/latent_text{forward}"


def bench_match(result: dict, bench: dict | None) -> dict | None:
    """The benchmark row of the same plan (`bench_row`) in train_step.py's JSON, if it ran."""
    if not bench:
        return None
    want = bench_row(parse_row(result["row"]), result.get("plan"))
    return next((r for r in bench.get("rows", []) if r.get("row") == want), None)


def bench_ratio(result: dict, bench: dict | None) -> float | None:
    """The trainer's tokens/s over the benchmark row of the same plan."""
    match = bench_match(result, bench)
    other = match and ((match.get("trainer") or {}).get("tokens_per_s") or match.get("tokens_per_s"))
    return result["tokens_per_s"] / other if other and result.get("tokens_per_s") else None


def bench_step_ratio(result: dict, bench: dict | None) -> float | None:
    """The benchmark row's s/step over the trainer's: tells a slower step from a step holding fewer tokens
    (captions shorter than the benchmark's 256 tokens per image)."""
    match = bench_match(result, bench)
    other = match and ((match.get("trainer") or {}).get("step_s") or match.get("step_s"))
    return other / result["step_s"] if other and result.get("step_s") else None


def scaling(result: dict, results: list[dict]) -> float | None:
    """A several-GPU row's tokens/s over N x its one-GPU row's (1.0: linear), when both ran."""
    row = parse_row(result["row"])
    one = next((r for r in results if r["row"] == single_gpu_row(row.name)), None)
    if not row.engine or not one or not one.get("tokens_per_s") or not result.get("tokens_per_s"):
        return None
    return result["tokens_per_s"] / (row.gpus * one["tokens_per_s"])


def fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def table(rows: list[dict]) -> list[str]:
    lines = [f"{'row':<24} {'done':>4} {'steps':>5} {'tokens/s':>9} {'tok/step':>8} {'s/step':>6} {'peak GiB':>8} "
             f"{'reserved':>8} {'cap':>4} {'pred GiB':>8} {'vs bench':>8} {'step vs':>7} {'scaling':>7} {'step 1 s':>8}  "
             "plan / why stopped"]  # fmt: skip
    for r in rows:
        lines.append(
            f"{r['row']:<24} {'yes' if r['completed'] else 'NO':>4} {r['steps']:>5} "
            f"{fmt(r.get('tokens_per_s'), ',.0f'):>9} {fmt(r.get('tokens_per_step'), ',.0f'):>8} "
            f"{fmt(r.get('step_s'), '.3f'):>6} "
            f"{fmt(r.get('peak_gib'), '.1f'):>8} {fmt(r.get('reserved_gib'), '.1f'):>8} "
            f"{fmt(r.get('cap_gib'), 'g'):>4} {fmt(r.get('predicted_gib'), '.1f'):>8} "
            f"{fmt(r.get('bench_ratio'), '.2f'):>8} {fmt(r.get('bench_step_ratio'), '.2f'):>7} "
            f"{fmt(r.get('scaling'), '.2f'):>7} "
            f"{fmt(r.get('first_step_s'), '.0f'):>8}  "
            f"{r.get('stopped') or r.get('plan') or ''}"
        )
    return lines


def first_step_table(rows: list[dict]) -> list[str]:
    """--first-step's table: a row's phases side by side."""
    lines = [f"{'row':<24} {'phase':<8} {'done':>4} {'step 1 s':>8} {'compiles':>8} {'compile s':>9} "
             f"{'wall s':>7}  prewarm (keys timed, launch configs timed, seconds)"]  # fmt: skip
    for r in rows:
        lines.append(
            f"{r['row']:<24} {r.get('phase', ''):<8} {'yes' if r['completed'] else 'NO':>4} "
            f"{fmt(r.get('first_step_s'), '.1f'):>8} {r.get('triton_compiles', 0):>8} "
            f"{fmt(r.get('triton_compile_s'), '.0f'):>9} {fmt(r.get('wall_s'), '.0f'):>7}  "
            f"{r.get('stopped') or r.get('prewarm') or 'nothing timed'}"
        )
    return lines


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", default="default", help=f"groups {sorted(GROUPS)} and/or rows, comma-separated")
    p.add_argument("--preset", default="moss-image-5b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--size", type=int, default=1024, help="image side in pixels (1 MP: 1024)")
    p.add_argument("--text-tokens", type=int, default=TEXT_TOKENS)
    p.add_argument(
        "--caption-words",
        default="3-40",
        help="words per synthetic caption: a range (captions differ, as real ones do) or one count "
        "(every caption that long: '256' gives the step benchmark's text tokens per image)",
    )
    p.add_argument(
        "--rank", type=int, default=0, help="adapter rank (0: the GPU or algo layer's; legacy rows 32)"
    )
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the medians")
    p.add_argument("--images", type=int, default=16, help="synthetic images in the data set")
    p.add_argument("--row-timeout", type=float, default=900)
    p.add_argument("--bench", default=None, help="train_step.py JSON of the same device call (ratio column)")
    p.add_argument("--work", default=None, help="working folder (default $OUT/user_runs or /tmp)")
    p.add_argument("--out", default=None, help="JSON of every row (default $OUT/user_runs.json)")
    p.add_argument(
        "--seed-cache", default=None, help="start each row from a copy of this kernel cache folder"
    )
    p.add_argument(
        "--empty-table", action="store_true", help="no shipped tuning table either (a card never timed here)"
    )
    p.add_argument(
        "--first-step",
        action="store_true",
        help="time each row's first step cold, warm and from a shipped table (see --phases)",
    )
    p.add_argument(
        "--phases",
        default=",".join(PHASES),
        help=f"--first-step's phases, comma-separated, of {PHASES} (warm and shipped follow cold)",
    )
    p.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE",
                   help="a trainer knob for every row, as kogine's --set takes it (repeatable)")  # fmt: skip
    p.add_argument(
        "--weights-dir", default=WEIGHTS_DIR, help="where the WEIGHTS rows' files are written once"
    )
    p.add_argument(
        "--logs", default=None, help="copy each run's log.txt, metrics.jsonl, console log and profile/ here"
    )
    a = p.parse_args(argv)
    if a.preset == "tiny":
        a.size, a.text_tokens = min(a.size, 128), min(a.text_tokens, 16)
    names = [n for part in a.rows.split(",") for n in GROUPS.get(part.strip(), part.strip()).split(",")]
    rows = [parse_row(n) for n in names if n]
    work = Path(
        a.work or (Path(os.environ["OUT"]) / "user_runs" if os.environ.get("OUT") else "/tmp/user_runs")
    )
    work.mkdir(parents=True, exist_ok=True)
    if not data_dir(a, work).exists():
        subprocess.run([sys.executable, str(ROOT / "scripts/bench/make_images.py"), str(data_dir(a, work)),
                        str(a.images), str(a.size), a.caption_words], check=True)  # fmt: skip
    write_weight_files(a, rows)
    bench = json.loads(Path(a.bench).read_text()) if a.bench and Path(a.bench).exists() else None
    if a.first_step:
        first_step(a, rows, work)
        return
    results = []
    for row in rows:
        print(f"=== {row.name}", flush=True)
        result = run_row(a, row, work)
        result["bench_ratio"] = bench_ratio(result, bench)
        result["bench_step_ratio"] = bench_step_ratio(result, bench)
        results.append(result)
        result["scaling"] = scaling(result, results)
        print("\n".join(table([result])[1:]), flush=True)
    for result in results:  # a one-GPU row listed after its several-GPU row
        result["scaling"] = scaling(result, results)
    print(f"\n{a.preset} random weights, synthetic encoders (/online rows: random-weight Qwen3.5 and FLUX.2 VAE), "
          f"{a.size}x{a.size} images, {a.steps} steps per row "
          f"(medians after {a.warmup}), each row from "
          f"{'a copy of ' + a.seed_cache if a.seed_cache else 'an empty tuning cache'}"
          f"{' (no shipped table)' if a.empty_table else ' (and the shipped table, if the card has one)'}")  # fmt: skip
    print("\n".join(table(results)))
    out = a.out or (os.path.join(os.environ["OUT"], "user_runs.json") if os.environ.get("OUT") else None)
    if out:
        Path(out).write_text(json.dumps({"config": vars(a), "rows": results}, indent=2, default=str))
        print(f"wrote {out}")


def first_step(a, rows: list[Row], work: Path) -> None:
    """--first-step: each row's phases in order, each a fresh process; the table, and the JSON in --out."""
    phases = [p.strip() for p in a.phases.split(",") if p.strip()]
    if unknown := sorted(set(phases) - set(PHASES)):
        raise SystemExit(f"--phases: unknown {unknown}; known {PHASES}")
    phases = [p for p in PHASES if p in phases]
    results = []
    for row in rows:
        for phase in phases:
            print(f"=== {row.name} ({phase})", flush=True)
            results.append(run_row(a, row, work, phase))
            print("\n".join(first_step_table(results[-1:])[1:]), flush=True)
    print(f"\n{a.preset} random weights, synthetic encoders, {a.size}x{a.size} images: the first step cold (empty "
          f"user cache{', no shipped table' if a.empty_table else ''}), warm (the same cache, a second process), "
          "shipped (only the cold run's tuning table)")  # fmt: skip
    print("\n".join(first_step_table(results)))
    out = a.out or (os.path.join(os.environ["OUT"], "user_runs.json") if os.environ.get("OUT") else None)
    if out:
        Path(out).write_text(json.dumps({"config": vars(a), "rows": results}, indent=2, default=str))
        print(f"wrote {out}")


if __name__ == "__main__":
    main()

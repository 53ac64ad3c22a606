"""One training step of the moss-image-5b architecture (random bf16 weights) per memory profile and mode.

    python scripts/bench/train_step.py                       # every row, each in its own subprocess
    python scripts/bench/train_step.py --rows main,baseline  # row groups or row specs, comma-separated
    python scripts/bench/train_step.py --row lora/speed/latent_text   # one row, in this process
    python scripts/bench/train_step.py --preset tiny --device cpu --steps 2   # CPU smoke (CI)
    python scripts/bench/train_step.py --rows lora/speed/latent_text --profile-steps 3  # + a kernel table
    python scripts/bench/train_step.py --rows lora/speed/latent_text --references 1   # an edit step

A row is `MODE/PROFILE/CACHE[/capN][/FORWARD][/field=value...]` or `baseline/eager|compiled`:
- MODE `lora` (LoRA rank RANK on TARGET_PRESET's linears, BYPASS as the trainer's: the shipped adapter,
  'attn-mlp' and 'auto'; AdamW) or `full` (full fine-tune, Muon + AdamW as optim/build.build_full_ft_optimizer);
- FORWARD (lora rows) `legacy`: the adapter these rows ran before, every DiT linear (TARGET_PRESET 'full')
  with BYPASS=True; `bypass` / `merged`: the row's adapter with BYPASS=True / False;
- PROFILE a memory profile (kohakumoss.memory.profiles.PROFILES), a catalog id (c0292), or `auto` (with capN:
  the catalog's fastest fit for the cap, as `new train` picks); `field=value` parts (and --plan-knobs) override
  plan fields (as their per-engine knobs);
- CACHE `latent_text` (latents and text embeddings cached: random tensors), `latent` (the text encoder,
  a random Qwen3.5, runs every step) or `none` (the FLUX.2 VAE architecture, random weights, also
  encodes SAMPLES images every step);
- `capN`: CARD_GB=N (the process capped to N GiB before anything is allocated, the plan sized for it).
The DiT (MODEL_PRESET random weights), its memory plan, the cap, BASE_PRECISION and the predicted peak come
from the trainer's train/components.build_components on the row's config (`row_config`); the adapter, optimizer
and step from build_trainable / build_runner: the benchmark measures the trainer's own code.
The baseline is plain torch (scripts/bench/baseline_model.py): padded [SAMPLES, L, d], SDPA, a tiny
LoRA module on every linear, no engines, eager or with each block torch.compile'd.

Per row: samples/s and tokens/s (medians of the measured steps), MFU, the step peak
(torch.cuda.max_memory_allocated, restarted before each step: the largest of all steps, and of the steps
after the warm-up; each step's own in the JSON), the predicted peak (kohakumoss.memory.estimate),
the nvidia-smi peak of the process, steps completed. Random weights and random inputs: a benchmark of
speed and memory, not of training. Writes every row as JSON to --out (default $OUT/train_step.json).
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # baseline_model.py sits beside this script

from kohakumoss.memory.allocator import allocator_for_references  # noqa: E402
from kohakumoss.memory.flops import step_flops  # noqa: E402
from kohakumoss.precision import BASE_PRECISIONS  # noqa: E402
from kohakumoss.train.collector import StepCollector  # noqa: E402
from kohakumoss.train.profiling import device_kernels  # noqa: E402
from kohakumoss_common.timing import copy_gbs  # noqa: E402
from kohakumoss_kernels.backends import triton_utils  # noqa: E402

PRESET = "moss-image-5b"  # MossConfig preset, random weights
DEVICE = "cuda"  # cuda | cpu (cpu: rows in this process, no caps, no nvidia-smi)
SAMPLES = 2  # samples packed per step
IMAGE_TOKENS = 0  # image tokens per sample (a square grid); 0: 4096 (1024 x 1024 px), 64 for the tiny preset
TEXT_TOKENS = 0  # text tokens per sample; 0: 256, 8 for the tiny preset
REFERENCES = 0  # reference images per sample (an edit step, model/seq.py), each at the target's size; 0: none
RANK = 32  # LoRA rank (alpha = rank)
TARGET_PRESET = "attn-mlp"  # the LoRA's modules: attn-mlp (the six block linears, the trainer's default) | full (every DiT linear)
BYPASS = "auto"  # the LoRA's forward, as the trainer's BYPASS: auto (its default) | True | False
LR = 1e-4  # learning rate (AdamW; Muon for full fine-tune)
GRAD_CLIP = 1.0  # gradient norm clip
FULL_OPTIMIZER = (
    "muon"  # full fine-tune: muon (Muon on hidden matrices + AdamW, the trainer's) | adamw (AdamW only)
)
WARMUP = 3  # untimed steps per row
STEPS = 10  # measured steps per row
CAP_STEPS = 40  # measured steps of a capped row
PEAK_TFLOPS = 790.0  # the bf16 matrix rate MFU divides by (measured on the H200)
ROWS = "default"  # row groups (see GROUPS) and row specs, comma-separated
TEXT_ENCODER = "auto"  # random Qwen3.5 for caches 'latent'/'none': qwen3.5-9b | tiny | auto (by preset)
CUDA_GRAPHS = "auto"  # replay the micro-step from a CUDA graph where the plan allows (as the trainer) | off
TIMING = "synced"  # synced: the device synchronized around each step | trainer: back to back, loss read
# to loss read | both: synced, then the measured steps again back to back (reported beside)
GC_EVERY = 0  # as the trainer's knob: 0 Python's own collector; N: setup frozen, collected every N steps after the launches
BUILD_DEVICE = (
    "auto"  # where the DiT is built before install: auto (cpu when capped or streaming) | cpu | device
)
BASELINE_LORA_DTYPE = "float32"  # the baseline LoRA's weights: float32 (as the trainer) | bfloat16
PLAN_KNOBS = ""  # JSON of MemoryPlan fields applied to every row's plan
BASE_PRECISION = (
    "same"  # LoRA rows' frozen block linears: same (bf16) | fp8 (fp8 GEMMs) | fp8_weight (storage)
)
ROW_TIMEOUT = 1200  # seconds per row subprocess
SMI_INTERVAL = 0.2  # seconds between nvidia-smi readings (0: one reading at the row's end)
SEED = 0
PROFILE_STEPS = 0  # steps run under torch.profiler after a row's measured steps (not timed): kernel table

PROFILE_NAMES = ("speed", "balanced", "low_vram", "minimal")
CACHES = ("latent_text", "latent", "none")
# A full fine-tune whose profile puts the optimizer on the host ('host': Muon + AdamW step 5B parameters on
# the CPU, minutes a step) runs here with optimizer=stream: the same host masters, stepped on the GPU per
# chunk. The profile as it is runs in the group 'full_host' (not in 'default').
GROUPS = {
    "main": [
        *(f"lora/{p}/latent_text" for p in PROFILE_NAMES),
        "full/speed/latent_text",
        "full/balanced/latent_text",
        "full/low_vram/latent_text/optimizer=stream",
        "full/minimal/latent_text/optimizer=stream",
    ],
    "cache": [f"lora/{p}/{c}" for p in ("speed", "minimal") for c in ("latent", "none")],
    "baseline": ["baseline/eager", "baseline/compiled"],
    "capped": [
        "lora/low_vram/latent_text/cap8",
        "lora/minimal/latent_text/cap8",
        "lora/minimal/latent_text/cap6",
        "lora/minimal/latent_text/cap4",
        "full/minimal/latent_text/cap24/optimizer=stream",
    ],
    "auto": [  # what `new train` would pick per card size (the catalog's fastest fit), run under that cap
        "lora/auto/latent_text/cap8",
        "lora/auto/latent_text/cap6",
        "full/auto/latent_text/cap24",
    ],
    "full_host": ["full/low_vram/latent_text", "full/minimal/latent_text"],
    # the shipped adapter against the one these rows ran before (every DiT linear, BYPASS=True)
    "fastpath": [
        "lora/speed/latent_text",
        "lora/speed/latent_text/legacy",
        "lora/auto/latent_text/cap24",
        "lora/auto/latent_text/cap24/legacy",
    ],
}
FORWARDS = ("legacy", "bypass", "merged")
GROUPS["default"] = GROUPS["main"] + GROUPS["baseline"] + GROUPS["cache"] + GROUPS["capped"]
GROUPS["cpu"] = [*(f"{m}/{p}/latent_text" for m in ("lora", "full") for p in PROFILE_NAMES), *GROUPS["cache"]]
GROUPS["cpu"].append("baseline/eager")
FLOP_FORMULA = (
    "MFU = FLOPs / step time / PEAK_TFLOPS; FLOPs (kohakumoss.memory.flops.step_flops) = 2 x multiply-adds x "
    "(1 forward + 1 input grad, + 1 weight grad in a full fine-tune) over the blocks' q/k/v/o/ffn_up_gate/"
    "ffn_down on every token, the text refiner and text_embedder.proj on the text tokens, video_embedder and "
    "final_linear_video on the image tokens (embedders: no input grad), the time embedding and modulations "
    "per sample; + (4 + 10) x L^2 x d per block and sample of L tokens (attention; the refiner's over the "
    "text); outside the blocks only the head's backward unless TARGET_PRESET 'full' or a full fine-tune; "
    "adapter and encoder FLOPs (cache 'latent'/'none') are not counted"
)
GIB = 1 << 30
GPU_BASE_MIB: list[float | None] = [None]  # nvidia-smi's used memory at the row's start
PROGRESS_PATH: list[str | None] = [None]  # a row subprocess appends a JSON line per step here


@dataclass(frozen=True)
class RowSpec:
    name: str
    mode: str  # lora | full | baseline
    profile: str = "speed"  # memory profile; for the baseline: eager | compiled
    cache: str = "latent_text"
    cap_gb: float | None = None
    overrides: tuple[tuple[str, object], ...] = field(default=())  # plan field overrides
    forward: str = ""  # '': the adapter of --target-preset / --bypass; else one of FORWARDS

    @property
    def baseline(self) -> bool:
        return self.mode == "baseline"


def parse_row(name: str) -> RowSpec:
    parts = name.strip().split("/")
    if parts[0] == "baseline":
        if len(parts) != 2 or parts[1] not in ("eager", "compiled"):
            raise SystemExit(f"row '{name}': a baseline row is baseline/eager or baseline/compiled")
        return RowSpec(name, "baseline", parts[1])
    if len(parts) < 3 or parts[0] not in ("lora", "full") or parts[2] not in CACHES:
        raise SystemExit(
            f"row '{name}': expected MODE/PROFILE/CACHE[/capN][/field=value], MODE lora|full, CACHE {CACHES}"
        )
    cap, overrides, forward = None, [], ""
    for extra in parts[3:]:
        if extra in FORWARDS and parts[0] == "lora" and not forward:
            forward = extra
        elif extra.startswith("cap"):
            cap = float(extra[3:])
        elif "=" in extra:
            key, value = extra.split("=", 1)
            with contextlib.suppress(json.JSONDecodeError):
                value = json.loads(value)
            overrides.append((key, value))
        else:
            raise SystemExit(f"row '{name}': unknown part '{extra}'")
    return RowSpec(name, parts[0], parts[1], parts[2], cap, tuple(overrides), forward)


def expand_rows(text: str) -> list[str]:
    out: list[str] = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        for name in GROUPS.get(item, [item]):
            if name not in out:
                parse_row(name)
                out.append(name)
    return out


# ---------------------------------------------------------------- FLOPs, memory, nvidia-smi


def row_adapter(a, spec: RowSpec) -> tuple[str, bool | str]:
    """(TARGET_PRESET, BYPASS) of a row's adapter: --target-preset and --bypass, or its FORWARD's."""
    if spec.forward == "legacy":
        return "full", True
    bypass = {"auto": "auto", "true": True, "false": False}[str(a.bypass).lower()]
    return a.target_preset, {"bypass": True, "merged": False}.get(spec.forward, bypass)


def reference_tokens(a) -> int:
    """Reference-image tokens per sample: REFERENCES grids of the target's size."""
    return a.references * token_layout(a)[1]


def row_flops(a, cfg, seq_lens: list[int], full: bool, target_preset: str | None = None) -> float:
    """The step's FLOPs (FLOP_FORMULA) for samples of seq_lens tokens, each with the row's text tokens
    and its references' tokens."""
    n_text, n_ref = token_layout(a)[2], reference_tokens(a)
    text, refs = [n_text] * len(seq_lens), [n_ref] * len(seq_lens)
    image = [n - n_text - n_ref for n in seq_lens]
    outside = (target_preset or a.target_preset) == "full"
    return step_flops(cfg, image, text, full, outside_trains=outside, ref_lens=refs)


class SmiPoller:
    """nvidia-smi's view of memory during the row: the max used memory of this pid (MiB), else of the
    whole GPU. Two long-lived nvidia-smi processes in loop mode (-lms) stream their readings to reader
    threads: one process start per row, not one per poll (a start initialises NVML against the busy GPU,
    inside the timed steps). interval 0: one reading when the row ends only (the allocator's cache is
    still held then, so the process peak is usually what it shows)."""

    def __init__(self, interval: float, gpu_base_mib: float | None):
        self.interval, self.pid = interval, os.getpid()
        self.process_mib: float | None = None
        self.gpu_mib: float | None = None
        self.gpu_base_mib = gpu_base_mib  # the GPU's used memory before this process touched it
        self.clocks: list[tuple[float, float, float]] = []  # (perf_counter, SM MHz, watts) per reading
        self.power_limit_w: float | None = None  # the card's power limit: a step at it runs a lower clock
        self._procs: list[subprocess.Popen] = []
        self._threads: list[threading.Thread] = []

    @staticmethod
    def gpu_index() -> str:
        return os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"

    @staticmethod
    def query(args: list[str]) -> list[str]:
        try:
            out = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return []
        return [line for line in out.stdout.splitlines() if line.strip()]

    APPS = ["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]

    @classmethod
    def gpu_query(cls) -> list[str]:
        fields = "memory.used,clocks.sm,power.draw,power.limit"  # is a slow step the card's own clock?
        return [f"--query-gpu={fields}", "--format=csv,noheader,nounits", "-i", cls.gpu_index()]

    @classmethod
    def gpu_used(cls) -> float | None:
        lines = cls.query(cls.gpu_query())
        return _number(lines[0].split(",")[0]) if lines else None

    def _read_app(self, line: str) -> None:
        pid, _, mib = line.partition(",")
        if pid.strip() == str(self.pid) and mib.strip().isdigit():
            self.process_mib = max(self.process_mib or 0.0, float(mib))

    def _read_gpu(self, line: str) -> None:
        fields = [_number(f) for f in line.split(",")] + [None, None, None]
        used, clock, watts, limit = fields[:4]
        if used is not None:
            self.gpu_mib = max(self.gpu_mib or 0.0, used)
        if limit is not None:
            self.power_limit_w = limit
        if clock is not None and watts is not None:
            self.clocks.append((time.perf_counter(), clock, watts))

    def per_step(self, spans: list[tuple[float, float]]) -> list[tuple[float | None, float | None]]:
        """(mean SM MHz, mean watts) of the readings inside each (start, end) perf_counter span."""
        out = []
        for t0, t1 in spans:
            inside = [(c, w) for t, c, w in self.clocks if t0 <= t <= t1]
            n = len(inside)
            out.append((sum(c for c, _ in inside) / n, sum(w for _, w in inside) / n) if n else (None, None))
        return out

    def _poll(self) -> None:
        for line in self.query(self.APPS):
            self._read_app(line)
        for line in self.query(self.gpu_query()):
            self._read_gpu(line)

    def _stream(self, args: list[str], read) -> None:
        try:
            proc = subprocess.Popen(
                ["nvidia-smi", *args, "-lms", str(max(int(self.interval * 1000), 1))],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            )  # fmt: skip
        except OSError:
            return
        self._procs.append(proc)

        def loop() -> None:
            for line in proc.stdout:
                read(line)

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        self._threads.append(thread)

    def __enter__(self) -> SmiPoller:
        if self.interval > 0:
            self._stream(self.APPS, self._read_app)
            self._stream(self.gpu_query(), self._read_gpu)
        return self

    def __exit__(self, *exc) -> None:
        for proc in self._procs:
            proc.terminate()
        for proc, thread in zip(self._procs, self._threads):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
            thread.join(timeout=10)
        self._poll()

    def result(self) -> tuple[float | None, str]:
        """(GiB, what it is): the process's peak, else the GPU's peak less what was used before."""
        if self.process_mib is not None:
            return self.process_mib / 1024, "process"
        if self.gpu_mib is not None:
            return (self.gpu_mib - (self.gpu_base_mib or 0.0)) / 1024, "gpu-delta (pid not listed)"
        return None, "nvidia-smi n/a"


def _number(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def compute_dtype(device: torch.device) -> torch.dtype:
    """bf16 on the GPU; float32 on the CPU (the smoke path: CPU bf16 matmuls are very slow)."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------- plan, install, estimate


def row_config(a, spec: RowSpec):
    """The trainer's typed config for this row: what build_components (model, plan, cap, estimate),
    build_trainable and build_runner read. The row's `field=value` parts and --plan-knobs are MemoryPlan
    fields, given as their per-engine knobs."""
    from kohakumoss.config.train import TRAIN_SCHEMA, TrainConfig
    from kohakumoss.memory.plan import FIELD_KNOBS
    from kohakumoss.memory.profiles import profile_problem

    if spec.profile == "auto" and spec.cap_gb is None:
        raise SystemExit(f"row '{spec.name}': profile 'auto' picks for a cap: add /capN")
    if problem := profile_problem(spec.profile):
        raise SystemExit(f"row '{spec.name}': {problem}")
    changes = {**(json.loads(a.plan_knobs) if a.plan_knobs else {}), **dict(spec.overrides)}
    if unknown := sorted(set(changes) - set(FIELD_KNOBS)):
        known = sorted(FIELD_KNOBS)
        raise SystemExit(f"row '{spec.name}': unknown MemoryPlan fields {unknown}; known: {known}")
    full = spec.mode == "full"
    _, n_img, n_text = token_layout(a)
    target_preset, bypass = row_adapter(a, spec)
    knobs = {
        **TRAIN_SCHEMA.defaults(),
        "MODEL_PRESET": a.preset,  # random weights
        "DEVICE": a.device,
        "PRECISION": "bf16" if compute_dtype(torch.device(a.device)) == torch.bfloat16 else "fp32",
        "BASE_PRECISION": "same" if full else a.base_precision,
        "MEMORY_PROFILE": spec.profile,
        "CARD_GB": float(spec.cap_gb or 0.0),  # build_components caps the process to it
        "TOKENS_PER_STEP": a.samples * (n_img + n_text + reference_tokens(a)),
        # the encoders are the script's random architectures (below), not a file: '' for the components
        "TEXT_ENCODER": "",
        "VAE": "",
        "TEXT_ENCODE": "auto" if spec.cache in ("latent", "none") else "cache",
        "VAE_ENCODE": "auto" if spec.cache == "none" else "cache",
        **{FIELD_KNOBS[f]: value for f, value in changes.items()},
        "ALGO": "full" if full else "lora",
        "RANK": a.rank,
        "ALPHA": float(a.rank),
        "TARGET_PRESET": target_preset,
        "BYPASS": bypass,
        "LR": a.lr,
        "GRAD_CLIP": a.grad_clip,
        "USE_MUON": a.full_optimizer == "muon",
        "SEED": a.seed,
        "CUDA_GRAPHS": a.cuda_graphs,
        "DETERMINISTIC": a.deterministic,
    }
    # the memory estimate prices a dataset with references; with no scan of it (this one is synthetic) one
    # per target, of its area (calibration.ASSUMED_REFERENCES): a row of more is predicted as one
    if a.references:
        dataset = TRAIN_SCHEMA.defaults()["DATASET"]
        knobs.update(
            DATASET={**dataset, "references": "references"}, AREA=n_img * 256, MAX_TEXT_TOKENS=n_text
        )
    return TrainConfig.from_knobs(knobs)


# ---------------------------------------------------------------- encoders


def text_encoder_size(name: str, preset: str) -> tuple[str, str]:
    """--text-encoder -> (the random encoder's size, its name in the notes)."""
    from kohakumoss.encoders.random_weights import random_size

    if name == "auto":
        name = "tiny" if random_size(preset) == "tiny" else "qwen3.5-9b"
    if name in ("tiny", "qwen3.5-9b"):
        return ("tiny" if name == "tiny" else "full"), name
    raise SystemExit(f"--text-encoder: '{name}' is not qwen3.5-9b, tiny or auto")


def encoder_plan(plan, cache: str, notes: list[str]):
    """The plan with an 'off' encoder that this cache mode runs every step turned 'streamed' (noted)."""
    needed = {"text_encoder": cache in ("latent", "none"), "vae": cache == "none"}
    for name, runs in needed.items():
        if runs and getattr(plan, name) == "off":
            notes.append(f"{name} placement 'off' but cache '{cache}' runs it every step: streamed")
            plan = replace(plan, **{name: "streamed"})
    return plan


def build_text_encoder(
    a, where: str, device: torch.device, dtype: torch.dtype, capped: bool, notes: list[str]
):
    """A random Qwen3.5 text model (what TEXT_ENCODER='random' builds) placed by the encoder engine; returns
    (encoder, vocab, width, bytes)."""
    from kohakumoss.encoders.random_weights import build_random_text_encoder
    from kohakumoss.memory.engines.encoders import place_encoder

    size, name = text_encoder_size(a.text_encoder, a.preset)
    build = device if (where == "resident" or not capped) else torch.device("cpu")
    t0 = time.perf_counter()
    encoder = build_random_text_encoder(size, a.seed, build, dtype)
    n = sum(p.numel() for p in encoder.model.parameters())
    placed = place_encoder(encoder, where, device)
    notes.append(
        f"text encoder random {name} ({n / 1e9:.2f}B, {where}, built in {time.perf_counter() - t0:.0f}s)"
    )
    return placed, encoder.vocab_size, encoder.hidden_size, placed.weight_bytes


def build_vae(a, where: str, device: torch.device, dtype: torch.dtype, capped: bool, notes: list[str]):
    """The FLUX.2 VAE architecture (AutoencoderKLFlux2, random weights: what VAE='random' builds) placed by the
    encoder engine."""
    from kohakumoss.encoders.random_weights import build_random_vae, random_size
    from kohakumoss.memory.engines.encoders import place_encoder

    size = random_size(a.preset)
    build = device if (where == "resident" or not capped) else torch.device("cpu")
    vae = build_random_vae(size, a.seed, build, dtype)
    placed = place_encoder(vae, where, device)
    n = sum(p.numel() for p in vae.model.parameters())
    notes.append(
        f"VAE {'tiny' if size == 'tiny' else 'FLUX.2'} AutoencoderKLFlux2 random ({n / 1e6:.0f}M, {where})"
    )
    return placed, placed.weight_bytes


# ---------------------------------------------------------------- rows


def token_layout(a) -> tuple[int, int, int]:
    """(grid side, image tokens, text tokens) per sample."""
    image = a.image_tokens or (64 if a.preset == "tiny" else 4096)
    text = a.text_tokens or (8 if a.preset == "tiny" else 256)
    side = math.isqrt(image)
    if side * side != image:
        raise SystemExit(f"--image-tokens {image} is not a square grid")
    return side, image, text


def report_progress(i: int, n: int, seconds: float, device: torch.device, peak: float | None = None) -> None:
    """One line per step on stdout and, for a row subprocess, in PROGRESS_PATH (read back on a timeout);
    peak: this step's own peak allocated GiB."""
    cuda = device.type == "cuda"
    # a capped row that crawls: allocator retries (cache flushed, each a device sync) tell it from slow engines
    retries = torch.cuda.memory_stats(device).get("num_alloc_retries", 0) if cuda else 0
    line = f"  step {i + 1}/{n}: {seconds:.3f} s" + (f", peak {peak:.2f} GiB" if peak else "")
    print(line + (f", {retries} allocator retries" if retries else ""), flush=True)
    if PROGRESS_PATH[0]:
        with open(PROGRESS_PATH[0], "a") as f:
            f.write(json.dumps({"step": i, "s": seconds, "peak_gib": peak, "alloc_retries": retries}) + "\n")


def timed_steps(
    step, n: int, device: torch.device, timing: str = "synced"
) -> tuple[list[float], int, str, list[float], list[float]]:
    """Run `step(i)` n times: (seconds per step, steps completed, error or '', each step's own peak
    allocated GiB, each step's start on perf_counter). The allocator's peak restarts before every step
    (host-side bookkeeping: no sync needed), so a warm-up step that times kernels or fills caches is told
    from the steady ones.

    timing "synced": the device is synchronized before and after each step, and the step is what lies
    between (its last queued work, the optimizer's, included; the GPU idles while the next step's first
    launches are made). "trainer": steps run back to back as the trainer runs them, each timed from the
    previous step's end (its loss read on the host, which every step function ends with) to its own."""
    if timing not in ("synced", "trainer"):
        raise ValueError(f"timing '{timing}' is not synced or trainer")
    times: list[float] = []
    peaks: list[float] = []
    starts: list[float] = []
    cuda = device.type == "cuda"
    sync(device)
    t_end = time.perf_counter()
    for i in range(n):
        try:
            if timing == "synced":
                sync(device)
            if cuda:
                torch.cuda.reset_peak_memory_stats(device)
            t0 = time.perf_counter() if timing == "synced" else t_end
            starts.append(t0)
            step(i)
            if timing == "synced":
                sync(device)
            t_end = time.perf_counter()
            times.append(t_end - t0)
        except Exception as e:
            traceback.print_exc()
            if cuda:
                peaks.append(torch.cuda.max_memory_allocated(device) / GIB)
            why = f"step {i}: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
            return times, i, why, peaks, starts
        if cuda:
            peaks.append(torch.cuda.max_memory_allocated(device) / GIB)
        report_progress(i, n, times[-1], device, peaks[-1] if cuda else None)
    sync(device)
    return times, n, "", peaks, starts


def partial_row(name: str, progress: Path, warmup: int, samples: int, why: str) -> dict:
    """A row whose subprocess died or timed out: what its per-step progress lines say."""
    lines = progress.read_text().splitlines() if progress.exists() else []
    steps = [json.loads(line) for line in lines if line.strip()]
    measured = [s["s"] for s in steps[warmup:]]
    med = statistics.median(measured) if measured else None
    peaks = [s["peak_gib"] for s in steps if s.get("peak_gib") is not None]
    return {
        "row": name,
        "error": f"{why} after {len(steps)} steps",
        "steps_done": len(steps),
        "step_s": med,
        "samples_per_s": samples / med if med else None,
        "step_peak_gib": max(peaks) if peaks else None,
        "notes": ["partial: from the per-step progress lines"],
    }


KERNEL_KINDS = (  # (kind, substrings of a kernel name), first match wins
    ("attention", ("sdpa", "flash", "fmha", "_attention_", "attn")),
    ("Triton row ops", ("_norm_modulate_", "_gated_residual_", "_qk_norm_rope_", "_rms_norm_", "_rope_",
                        "_situ_glu_", "_per_sample_", "_per_program_", "_lowrank_")),
    ("GEMM", ("nvjet", "gemm", "cutlass", "xmma", "splitkreduce")),
    ("optimizer", ("adam", "multi_tensor")),
    ("copies and fills", ("copy", "memcpy", "memset", "fill")),
)  # fmt: skip


def kernel_kind(name: str) -> str:
    low = name.lower()
    return next((kind for kind, keys in KERNEL_KINDS if any(k in low for k in keys)), "other")


def kinds_table(
    kernels: list[tuple[str, float]], steps: int, wall_ms: float | None = None, launches: int | None = None
) -> str:
    """(kernel name, device ms summed over `steps`) -> ms per step and share by kind, largest first; with
    the steps' wall time (ms, summed) also the time per step the GPU ran no kernel, and with the number of
    kernels, memsets and copies run (`launches`, summed) how many a step has: the gaps between them are
    most of that idle time in a graphed step."""
    by: dict[str, float] = {}
    for name, ms in kernels:
        kind = kernel_kind(name)
        by[kind] = by.get(kind, 0.0) + ms / steps
    total = sum(by.values()) or 1.0
    lines = [f"{'kind':<20} {'ms/step':>9} {'share':>6}"]
    lines += [f"{k:<20} {v:9.2f} {v / total:6.1%}" for k, v in sorted(by.items(), key=lambda kv: -kv[1])]
    lines.append(f"{'device time':<20} {total:9.2f}")
    if wall_ms is not None:
        wall = wall_ms / steps
        lines.append(f"{'step (profiled)':<20} {wall:9.2f}  GPU idle {wall - total:.2f} ms per step")
    if launches is not None:
        lines.append(f"{'kernels per step':<20} {launches / steps:9.0f}")
    return "\n".join(lines)


# The bf16 [T, width] tensors one call of a row kernel must read and write once (as counted in
# docs/performance/kernels.md); width "d" is the model dim, "h" the MLP hidden. norm_modulate's backward
# reads the fork's residual gradient too (every block calls it with fork=True; the final layer's one call
# a step without it is counted the same, 1 call in 43 on moss-image-5b).
ROW_KERNEL_TENSORS = {
    "_rms_norm_fwd": (2, "d"), "_rms_norm_bwd": (3, "d"),
    "_norm_modulate_fwd": (2, "d"), "_norm_modulate_bwd": (4, "d"),
    "_residual_norm_modulate_fwd": (4, "d"), "_residual_norm_modulate_bwd": (6, "d"),
    "_gated_residual_fwd": (3, "d"), "_gated_residual_bwd": (3, "d"),
    "_qk_norm_rope_fwd": (2, "d"), "_qk_norm_rope_fwd_token": (2, "d"), "_qk_norm_rope_bwd": (3, "d"),
    "_situ_glu_fwd": (3, "h"), "_situ_glu_bwd": (5, "h"),
}  # fmt: skip


def row_kernel_table(
    kernels: list[tuple[str, float, int]], steps: int, tokens: int, dim: int, hidden: int, ceiling_gbs: float
) -> str:
    """(kernel name, device ms summed, calls) of the profiled steps -> per row kernel: calls per step, us
    per call, GB/s and % of the copy ceiling; '' when no row kernel ran."""
    width = {"d": dim, "h": hidden}
    lines = []
    for name, ms, calls in sorted(kernels, key=lambda k: -k[1]):
        if name not in ROW_KERNEL_TENSORS or not calls:
            continue
        n, w = ROW_KERNEL_TENSORS[name]
        us = ms * 1e3 / calls
        gbs = n * tokens * width[w] * 2 / (us * 1e-6) / 1e9
        lines.append(f"{name:<30} {calls / steps:7.1f} {us:9.1f} {gbs:9.0f} {gbs / ceiling_gbs:7.1%}")
    if not lines:
        return ""
    head = f"{'row kernel':<30} {'calls':>7} {'us/call':>9} {'GB/s':>9} {'of copy':>7}"
    return "\n".join(
        [f"row kernels against a {ceiling_gbs:.0f} GB/s copy measured in this process", head, *lines]
    )


def profile_steps(
    step, start: int, count: int, device: torch.device, name: str, trace: bool = False, shape: tuple = ()
) -> None:
    """Run `count` more steps under torch.profiler; print the kernels by device time (and save the table
    under $OUT, when set). Where the step's time goes, for the next optimisation, not a measured row.
    trace: also write a gzipped Chrome trace with input shapes under $OUT (with --cuda-graphs off each
    kernel sits under the op that launched it). shape: (tokens, dim, MLP hidden) for the row kernels'
    bandwidth table."""
    import gzip

    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, record_shapes=trace) as prof:
        sync(device)
        began = time.perf_counter()
        for i in range(start, start + count):
            step(i)
        sync(device)
        wall_ms = (time.perf_counter() - began) * 1e3
    out_dir = os.environ.get("OUT")
    if trace and out_dir:
        raw = Path(out_dir, f"trace_{name.replace('/', '_')}.json")
        prof.export_chrome_trace(str(raw))
        with open(raw, "rb") as f, gzip.open(f"{raw}.gz", "wb") as g:
            g.write(f.read())
        raw.unlink()
    sort = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events = prof.key_averages()
    text = f"profile of {count} steps of {name} (times summed over the steps)\n" + events.table(
        sort_by=sort, row_limit=40, max_name_column_width=90
    )
    if device.type == "cuda":  # kernels only (no CPU-side ranges): by kind, per step
        counted = device_kernels(events)
        launches = sum(calls for _, _, calls in counted)
        text += "\n" + kinds_table([(key, ms) for key, ms, _ in counted], count, wall_ms, launches)
        if shape and any(key in ROW_KERNEL_TENSORS for key, _, _ in counted):
            text += "\n" + row_kernel_table(counted, count, *shape, copy_gbs(device, gib=1.0))
    print(text, flush=True)
    if out_dir:
        Path(out_dir, f"profile_{name.replace('/', '_')}.txt").write_text(text)


def measure_row(a, spec: RowSpec, cfg, step, n: int, seq_lens: list[int], device, full: bool) -> dict:
    """Run `step` n times from a fresh peak, polling nvidia-smi; the summarized row."""
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    poller = SmiPoller(a.smi_interval, GPU_BASE_MIB[0]) if cuda else contextlib.nullcontext()
    first = "synced" if a.timing == "both" else a.timing
    back_to_back = None
    with poller:
        times, done, error, peaks, starts = timed_steps(step, n, device, first)
        if (
            a.timing == "both" and not error and n > a.warmup
        ):  # the same steps again, as the trainer runs them
            back_to_back = timed_steps(lambda j: step(n + j), n - a.warmup, device, "trainer")
    if back_to_back is not None:
        peaks, starts = peaks + back_to_back[3], starts + back_to_back[4]
    if a.profile_steps and not error:
        shape = (sum(seq_lens), cfg.dim, cfg.mlp_hidden)
        profile_steps(step, n, a.profile_steps, device, spec.name, a.profile_trace, shape)
    row = summarize(
        a, spec, cfg, seq_lens, times, done, n, error, a.warmup, device,
        row_flops(a, cfg, seq_lens, full, row_adapter(a, spec)[0]),
    )  # fmt: skip
    row["timing"] = first
    if back_to_back is not None:
        row["trainer"] = timing_summary(a, seq_lens, row["flops_per_step"], *back_to_back[:3])
        times = times + back_to_back[0]
    if cuda:  # every step's peak (the cap's check) and the steps' after the warm-up (the estimate's)
        row["step_peak_gib"] = max(peaks, default=None)
        row["steady_peak_gib"] = max(peaks[a.warmup :], default=None)
        row["step_peaks_gib"] = [round(p, 3) for p in peaks]
        if spec.cap_gb is not None:
            row["under_cap"] = row["step_peak_gib"] <= spec.cap_gb and not error
    if cuda:
        row["smi_peak_gib"], row["smi_kind"] = poller.result()
        # each step's mean SM clock and power: a step slower on the same kernels shows its cause here
        per_step = poller.per_step([(t0, t0 + dt) for t0, dt in zip(starts, times)])
        row["step_sm_mhz"] = [None if c is None else round(c) for c, _ in per_step]
        row["step_power_w"] = [None if w is None else round(w, 1) for _, w in per_step]
        row["power_limit_w"] = poller.power_limit_w
        if any(c is not None for c, _ in per_step[a.warmup :]):
            print(
                f"  SM clock MHz / power W (limit {fmt(poller.power_limit_w, '.0f')} W) per measured step: "
                + " ".join(f"{c or 0:.0f}/{w or 0:.0f}" for c, w in per_step[a.warmup :]),
                flush=True,
            )
        # the allocator freeing its cache and retrying (a synchronizing cudaMalloc), what a cap can cost
        stats = torch.cuda.memory_stats(device)
        row["alloc_retries"] = stats.get("num_alloc_retries", 0)
        row["device_ooms"] = stats.get("num_ooms", 0)
    return row


def step_rates(a, seq_lens: list[int], flops: float, times: list[float]) -> dict:
    """The median step of `times` and what it gives: samples/s, tokens/s, MFU."""
    med = statistics.median(times) if times else None
    tokens = sum(seq_lens)
    return {
        "step_s": med,
        "samples_per_s": a.samples / med if med else None,
        "tokens_per_s": tokens / med if med else None,
        "mfu": flops / med / (a.peak_tflops * 1e12) if med else None,
    }


def timing_summary(a, seq_lens: list[int], flops: float, times: list[float], done: int, error: str) -> dict:
    """The medians of a second run of steps timed another way (every one after the warm-up)."""
    return {"timing": "trainer", "steps_done": done, **step_rates(a, seq_lens, flops, times), "error": error}


def summarize(a, spec: RowSpec, cfg, seq_lens, times, done, asked, error, warmup, device, flops) -> dict:
    rates = step_rates(a, seq_lens, flops, times[warmup:])
    med = rates["step_s"]
    row = {
        "row": spec.name,
        "mode": spec.mode,
        "profile": spec.profile,
        "cache": spec.cache,
        "cap_gib": spec.cap_gb,
        "steps_done": done,
        "steps_asked": asked,
        "warmup": warmup,
        **rates,
        "image_tokens_per_s": (
            (sum(seq_lens) - a.samples * (token_layout(a)[2] + reference_tokens(a))) / med if med else None
        ),
        "reference_tokens_per_step": a.samples * reference_tokens(a),
        "flops_per_step": flops,
        "error": error,
    }
    if device.type == "cuda":
        row["step_peak_gib"] = torch.cuda.max_memory_allocated(device) / GIB
        row["step_reserved_gib"] = torch.cuda.memory_reserved(device) / GIB  # the cache held at the end
    return row


def run_moss_row(a, spec: RowSpec) -> dict:
    from kohakumoss.encoders.latents import patchify
    from kohakumoss.model import PackedSeq
    from kohakumoss.train.components import build_components, ops_backend, predicted_peak_gib
    from kohakumoss.train.graphs import graph_refusal
    from kohakumoss.train.loop import build_runner, build_trainable, step_loss_fn
    from kohakumoss.train.prefetch import Prefetcher
    from kohakumoss.train.step import DeviceBatch
    from kohakumoss_data.batch import HostBatch

    full = spec.mode == "full"
    side, n_img, n_text = token_layout(a)
    train_cfg = row_config(a, spec)
    # a capped row's DiT is built on the host (the cap holds the device copy only); else as the trainer
    build = {"cpu": torch.device("cpu"), "device": torch.device(a.device)}.get(a.build_device)
    if a.build_device == "auto" and spec.cap_gb is not None:
        build = torch.device("cpu")
    t0 = time.perf_counter()
    # the model, its memory plan (MEMORY_PROFILE, CARD_GB's cap) and BASE_PRECISION as the trainer's
    comps = build_components(train_cfg, build_device=build)
    device, dtype, model, plan = comps.device, comps.dtype, comps.backbone, comps.plan
    cfg = model.config
    notes = [f"plan: {comps.plan_why}"]
    notes += [f"DETERMINISTIC: kernel backends {ops_backend(train_cfg)}"] if a.deterministic else []
    n_params = sum(p.numel() for p in model.parameters())
    if train_cfg.device.base_precision != "same":
        notes.append(f"BASE_PRECISION {train_cfg.device.base_precision}: frozen block linears quantized")
    # the adapter, its optimizer and the step as the trainer builds them (train/loop.py), from its knobs
    tr = build_trainable(train_cfg, comps)
    n_train = sum(p.numel() for p in tr.params)
    where = "host" if build is not None and build.type == "cpu" else "the trainer's choice"
    notes.append(f"built in {time.perf_counter() - t0:.0f}s (build device: {where}); plan: {plan.label()}")

    plan = encoder_plan(plan, spec.cache, notes)
    text_enc = vae = None
    te_bytes = vae_bytes = 0
    if spec.cache in ("latent", "none"):
        text_enc, vocab, width, te_bytes = build_text_encoder(
            a, plan.text_encoder, device, dtype, spec.cap_gb is not None, notes
        )
        if width != cfg.text_dim:
            raise SystemExit(f"text encoder width {width} != the DiT's text_dim {cfg.text_dim}")
    if spec.cache == "none":
        vae, vae_bytes = build_vae(a, plan.vae, device, dtype, spec.cap_gb is not None, notes)
    if device.type == "cuda":
        torch.cuda.empty_cache()  # what the build left cached is not the step's

    g = torch.Generator().manual_seed(a.seed)
    ref_grids = [[(side, side)] * a.references] * a.samples if a.references else None
    seq = PackedSeq.build([n_text] * a.samples, [(side, side)] * a.samples, device, ref_sizes=ref_grids)
    pixels = ids = None
    if vae is not None:
        pixels = torch.rand(a.samples, 3, 16 * side, 16 * side, generator=g).mul_(2).sub_(1)
        pixels = pixels.pin_memory() if device.type == "cuda" else pixels
    if text_enc is not None:
        ids = torch.randint(0, vocab, (a.samples, n_text), generator=g)
    latents = [torch.randn(cfg.in_channels // 4, 2 * side, 2 * side, generator=g) for _ in range(a.samples)]
    text_hidden = torch.randn(a.samples * n_text, cfg.text_dim, generator=g)
    host = HostBatch(0, [], [], [(16 * side, 16 * side)] * a.samples, latents, None, text_hidden,
                     torch.full((a.samples,), n_text))  # fmt: skip
    if a.references:  # cached reference latents in every row (a 'none' row does not VAE-encode them)
        host.references = [
            [torch.randn(cfg.in_channels // 4, 2 * side, 2 * side, generator=g) for _ in range(a.references)]
            for _ in range(a.samples)
        ]
        refs = torch.cat([patchify(r) for rs in host.references for r in rs]).to(device, dtype)
        notes.append(f"references: {a.references} per sample at the target's size, cached latents")
    prefetch = None
    if vae is None and text_enc is None:  # caches hit: host batches through the trainer's prefetcher
        prefetch = Prefetcher(itertools.repeat(host), device, dtype)

    def encoded_batch() -> DeviceBatch:
        """Encoders online: what the loader hands the step, encoded for this step on the device."""
        x0 = torch.cat([patchify(lat) for lat in latents]).to(device, dtype)
        text = text_hidden.to(device, dtype)
        if vae is not None:
            with vae.on_device():  # one load per step when streamed
                lats = [vae.encode(pixels[i : i + 1].to(device, non_blocking=True)) for i in range(a.samples)]
            x0 = torch.cat([patchify(lat.float()) for lat in lats]).to(dtype)
        if text_enc is not None:
            with text_enc.on_device():  # one load per step when streamed
                text = text_enc.encode_ids(ids).to(dtype)
        return DeviceBatch(x0, text, seq, refs=refs if a.references else None)

    model.train()
    runner = build_runner(
        train_cfg,
        comps,
        tr,
        step_loss_fn(train_cfg.objective, model, dtype),
        prefetch.next_batch if prefetch else encoded_batch,
    )
    graphs = runner.graphs
    refusal = graph_refusal(plan, device, train_cfg.adapter.algo, 0.0, dtype)
    notes.append("CUDA graphs: " + ("on" if graphs else f"off ({refusal or 'CUDA_GRAPHS off'})"))
    nonfinite: list[int] = []

    def step(i: int) -> None:
        result = runner.run(i)
        runner.prepare_next(i)
        collector.after_launch(i)
        if not result.applied() or not math.isfinite(result.loss()):  # random weights: counted, not fatal
            nonfinite.append(i)
        gc_ms.append(collector.take_paused_ms())

    measured = a.cap_steps if spec.cap_gb is not None else a.steps
    resident = torch.cuda.memory_allocated(device) / GIB if device.type == "cuda" else None
    seq_lens = list(seq.seq_lens)
    collector, gc_ms = StepCollector(a.gc_every), []
    with collector, prefetch if prefetch is not None else contextlib.nullcontext():
        row = measure_row(a, spec, cfg, step, a.warmup + measured, seq_lens, device, full)
    row["gc_pause_ms"] = [round(ms, 2) for ms in gc_ms]  # per step, automatic collections or ours
    if any(gc_ms):
        print(f"  gc pauses, ms per step: {' '.join(f'{ms:.1f}' for ms in gc_ms)}", flush=True)
    if graphs is not None and "step_peak_gib" in row:  # replays allocate nothing: the capture step's peak
        row["step_peak_gib"] = max(row["step_peak_gib"], graphs.capture_peak_bytes / GIB)
        if row.get("steady_peak_gib") is not None:  # the graph's memory is what the capture allocated
            row["steady_peak_gib"] = max(row["steady_peak_gib"], graphs.capture_peak_bytes / GIB)
        row["graph_replays"] = graphs.replays
    # the trainer's estimate, with the encoders
    peak = predicted_peak_gib(train_cfg, plan, te_bytes, vae_bytes)
    why = "" if peak is not None else "n/a (the estimate cannot price this plan)"
    row.update(predicted_gib=peak, predicted_note=why, trainable_params=n_train, params=n_params)
    row["plan"] = plan.knobs()
    row["triton_launch_configs"] = triton_utils.picked()  # empty with KOHAKUMOSS_TRITON_PICK=0 (defaults)
    if resident is not None:
        row["resident_before_step_gib"] = resident
    row["nonfinite_steps"] = len(nonfinite)
    row["notes"] = notes
    return row


def run_baseline_row(a, spec: RowSpec) -> dict:
    from baseline_model import PlainDiT, rope_angles

    from kohakumoss.model import get_preset

    device = torch.device(a.device)
    dtype = compute_dtype(device)
    lora_dtype = getattr(torch, a.baseline_lora_dtype)
    cfg = get_preset(a.preset)
    if a.references:
        raise SystemExit("the baseline rows take no --references (plain text-to-image torch)")
    side, n_img, n_text = token_layout(a)
    t0 = time.perf_counter()
    with torch.device(device):
        model = PlainDiT(cfg, a.rank, dtype, lora_dtype).init_frozen()
    if spec.profile == "compiled":
        model.compile_blocks()
    g = torch.Generator().manual_seed(a.seed)
    B = a.samples
    img = torch.randn(B, n_img, cfg.in_channels, generator=g).to(device, dtype)
    text = torch.randn(B, n_text, cfg.text_dim, generator=g).to(device, dtype)
    target = torch.randn(B, n_img, cfg.in_channels, generator=g).to(device, dtype)
    cos, sin = rope_angles(cfg, n_text, side, side, device)
    cos, sin = cos.expand(B, -1, -1), sin.expand(B, -1, -1)
    params = model.trainable()
    opt = torch.optim.AdamW(params, lr=a.lr)
    notes = [
        f"plain torch, padded [{B}, {n_img + n_text}, {cfg.dim}], SDPA, LoRA r{a.rank} {a.baseline_lora_dtype}"
    ]
    notes.append(f"built in {time.perf_counter() - t0:.0f}s")

    nonfinite: list[int] = []

    def step(i: int) -> None:
        sigma = torch.rand(B, generator=g).to(device)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            pred = model(img, text, sigma, cos, sin)
        loss = torch.nn.functional.mse_loss(pred.float(), target.float())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, a.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if not math.isfinite(loss.item()):  # random weights: counted, not fatal (the timing stands)
            nonfinite.append(i)

    seq_lens = [n_img + n_text] * B
    row = measure_row(a, spec, cfg, step, a.warmup + a.steps, seq_lens, device, False)
    row.update(predicted_gib=None, predicted_note="", trainable_params=sum(p.numel() for p in params))
    row["nonfinite_steps"] = len(nonfinite)
    row["notes"] = notes
    return row


def watch_row(every: float, device: torch.device) -> None:
    """Every `every` seconds: the allocator's state and every thread's Python stack on stderr (where a
    crawling row spends its time: allocator retries under a cap, or a host-side loop)."""

    def loop() -> None:
        while True:
            time.sleep(every)
            if device.type == "cuda":
                st = torch.cuda.memory_stats(device)
                print(
                    f"[watch] allocated {st.get('allocated_bytes.all.current', 0) / GIB:.2f} GiB, reserved "
                    f"{st.get('reserved_bytes.all.current', 0) / GIB:.2f} GiB, "
                    f"{st.get('num_alloc_retries', 0)} allocator retries, {st.get('num_ooms', 0)} OOMs",
                    file=sys.stderr,
                    flush=True,
                )
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)

    threading.Thread(target=loop, daemon=True, name="watch_row").start()


def run_row(a, name: str) -> dict:
    spec = parse_row(name)
    if a.stack_every:
        watch_row(a.stack_every, torch.device(a.device))
    device = torch.device(a.device)
    if device.type == "cuda":
        GPU_BASE_MIB[0] = SmiPoller.gpu_used()  # before this process holds any GPU memory
    if spec.cap_gb is not None and device.type != "cuda":  # the cap itself: CARD_GB in build_components
        return {"row": name, "error": "capped rows need CUDA", "steps_done": 0, "notes": []}
    torch.manual_seed(a.seed)
    try:
        return run_baseline_row(a, spec) if spec.baseline else run_moss_row(a, spec)
    except Exception as e:  # setup failed (OOM under a cap, a missing engine): the row says so
        traceback.print_exc()
        return {
            "row": name,
            "error": f"setup: {type(e).__name__}: {str(e).splitlines()[0][:200]}",
            "steps_done": 0,
            "notes": [],
        }


# ---------------------------------------------------------------- driver and table


COMMON = (
    "preset", "device", "samples", "image_tokens", "text_tokens", "references", "rank", "target_preset", "bypass", "lr", "grad_clip", "full_optimizer", "warmup",
    "steps", "cap_steps", "peak_tflops", "text_encoder", "cuda_graphs", "build_device", "baseline_lora_dtype",
    "plan_knobs", "base_precision", "smi_interval", "seed", "profile_steps", "stack_every", "gc_every", "timing",
)  # fmt: skip
FLAGS = ("profile_trace", "deterministic")  # store_true options, passed on when set


def child_argv(a, name: str, out: str) -> list[str]:
    argv = [sys.executable, str(Path(__file__).resolve()), "--row", name, "--row-out", out]
    for dest in COMMON:
        argv += [f"--{dest.replace('_', '-')}", str(getattr(a, dest))]
    return argv + [f"--{dest.replace('_', '-')}" for dest in FLAGS if getattr(a, dest)]


def run_subprocess(a, name: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "row.json")
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(child_argv(a, name, out), timeout=a.row_timeout)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        wall = time.perf_counter() - t0
        if os.path.exists(out):
            row = json.loads(Path(out).read_text())
        else:
            why = "timed out" if rc == "timeout" else f"subprocess exited {rc} (killed? OOM?)"
            row = partial_row(name, Path(out + ".progress"), a.warmup, a.samples, why)
        row["wall_s"] = wall
        return row


def fmt(v, spec: str, missing: str = "-") -> str:
    return missing if v is None else format(v, spec)


def table(rows: list[dict]) -> list[str]:
    head = f"{'row':<46} {'steps':>5} {'samples/s':>9} {'tokens/s':>9} {'MFU %':>6} {'peak GiB':>9} {'steady':>6} {'pred GiB':>9} {'smi GiB':>8} {'cap':>4} {'<cap':>5}  error"
    lines = [head]
    for r in rows:
        under = r.get("under_cap")
        nan = f" ({r['nonfinite_steps']} non-finite losses)" if r.get("nonfinite_steps") else ""
        nan += f" ({r['alloc_retries']} allocator retries)" if r.get("alloc_retries") else ""
        lines.append(
            f"{r['row']:<46} {r.get('steps_done', 0):>5} {fmt(r.get('samples_per_s'), '.2f'):>9} "
            f"{fmt(r.get('tokens_per_s'), ',.0f'):>9} {fmt(r.get('mfu') and 100 * r['mfu'], '.1f'):>6} "
            f"{fmt(r.get('step_peak_gib'), '.1f'):>9} {fmt(r.get('steady_peak_gib'), '.1f'):>6} "
            f"{fmt(r.get('predicted_gib'), '.1f', 'n/a'):>9} "
            f"{fmt(r.get('smi_peak_gib'), '.1f'):>8} {fmt(r.get('cap_gib'), 'g'):>4} "
            f"{'-' if under is None else ('yes' if under else 'NO'):>5}  {r.get('error') or ''}{nan}"
        )
        b2b = r.get("trainer")
        if b2b:  # --timing both: the same row's steps run again back to back
            lines.append(
                f"{'  (back to back, loss read to loss read)':<46} {b2b.get('steps_done', 0):>5} "
                f"{fmt(b2b.get('samples_per_s'), '.2f'):>9} {fmt(b2b.get('tokens_per_s'), ',.0f'):>9} "
                f"{fmt(b2b.get('mfu') and 100 * b2b['mfu'], '.1f'):>6}  {b2b.get('error') or ''}"
            )
    return lines


def ratios(rows: list[dict]) -> dict[str, float]:
    """speed row / baseline tokens/s, synced; and back to back where both rows ran that way too."""
    out = {}
    for suffix, get in (("", lambda r: r.get("tokens_per_s")),
                        (" (back to back)", lambda r: (r.get("trainer") or {}).get("tokens_per_s"))):  # fmt: skip
        by = {r["row"]: get(r) for r in rows}
        speed = by.get("lora/speed/latent_text")
        for base in ("eager", "compiled"):
            other = by.get(f"baseline/{base}")
            if speed and other:
                out[f"speed/{base}{suffix}"] = speed / other
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", default=ROWS, help=f"groups {sorted(GROUPS)} and/or row specs, comma-separated")
    p.add_argument("--row", default=None, help="run this one row in this process")
    p.add_argument("--row-out", default=None, help="(with --row) write the row's JSON here")
    p.add_argument(
        "--in-process", action="store_true", help="run all rows in this process (default on the CPU)"
    )
    p.add_argument("--preset", default=PRESET)
    p.add_argument("--device", default=DEVICE)
    p.add_argument("--samples", type=int, default=SAMPLES)
    p.add_argument("--image-tokens", type=int, default=IMAGE_TOKENS)
    p.add_argument("--text-tokens", type=int, default=TEXT_TOKENS)
    p.add_argument(
        "--references",
        type=int,
        default=REFERENCES,
        help="reference images per sample (an edit step), each at the target's size",
    )
    p.add_argument("--rank", type=int, default=RANK)
    p.add_argument(
        "--target-preset",
        default=TARGET_PRESET,
        help="the adapter's TARGET_PRESET: the trainer's default attn-mlp (the six block linears) or full "
        "(every DiT linear: the refiner, embedders and modulations too)",
    )
    p.add_argument(
        "--bypass",
        default=str(BYPASS),
        choices=("auto", "True", "False"),
        help="the adapter's BYPASS: auto (the trainer's default) or True / False",
    )
    p.add_argument("--lr", type=float, default=LR)
    p.add_argument("--grad-clip", type=float, default=GRAD_CLIP)
    p.add_argument("--full-optimizer", default=FULL_OPTIMIZER, choices=("muon", "adamw"))
    p.add_argument("--warmup", type=int, default=WARMUP)
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument("--cap-steps", type=int, default=CAP_STEPS)
    p.add_argument(
        "--cap-gb",
        default=None,
        help="add a capped copy of each selected LoRA row per cap (GiB, comma-separated)",
    )
    p.add_argument("--peak-tflops", type=float, default=PEAK_TFLOPS)
    p.add_argument("--text-encoder", default=TEXT_ENCODER)
    p.add_argument("--cuda-graphs", default=CUDA_GRAPHS, choices=("auto", "off"))
    p.add_argument("--gc-every", type=int, default=GC_EVERY)
    p.add_argument(
        "--timing",
        default=TIMING,
        choices=("synced", "trainer", "both"),
        help="synced: the device synchronized around each step; trainer: steps back to back, from one loss "
        "read to the next; both: synced, then the measured steps again back to back (one more column)",
    )
    p.add_argument("--build-device", default=BUILD_DEVICE, choices=("auto", "cpu", "device"))
    p.add_argument("--baseline-lora-dtype", default=BASELINE_LORA_DTYPE, choices=("float32", "bfloat16"))
    p.add_argument("--plan-knobs", default=PLAN_KNOBS, help="JSON of MemoryPlan fields for every row")
    p.add_argument("--base-precision", default=BASE_PRECISION, choices=BASE_PRECISIONS)
    p.add_argument("--row-timeout", type=float, default=ROW_TIMEOUT)
    p.add_argument("--smi-interval", type=float, default=SMI_INTERVAL)
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument(
        "--profile-steps", type=int, default=PROFILE_STEPS, help="steps profiled after a row's measured ones"
    )
    p.add_argument(
        "--stack-every",
        type=float,
        default=0.0,
        help="seconds: every row prints its Python stacks this often (where a crawling row spends its time)",
    )
    p.add_argument(
        "--deterministic",
        action="store_true",
        help="as the trainer's DETERMINISTIC=True: deterministic algorithms, fixed cuBLAS workspace, no atomic backends",
    )
    p.add_argument(
        "--profile-trace",
        action="store_true",
        help="with --profile-steps: a Chrome trace (shapes) under $OUT",
    )
    p.add_argument(
        "--out", default=None, help="JSON of all rows (default $OUT/train_step.json when OUT is set)"
    )
    return p.parse_args(argv)


def selected_rows(a) -> list[str]:
    cpu = a.device == "cpu"
    names = expand_rows("cpu" if cpu and a.rows == "default" else a.rows)
    if a.cap_gb:  # --cap-gb 8,6: a capped copy of each uncapped non-baseline row
        base = [n for n in names if not parse_row(n).baseline and parse_row(n).cap_gb is None]
        names += [f"{n}/cap{c.strip()}" for c in str(a.cap_gb).split(",") for n in base]
    if cpu:
        names = [n for n in names if parse_row(n).cap_gb is None]  # no caps without CUDA
    return names


def main(argv=None) -> None:
    a = parse_args(argv)
    # as the trainer does for a dataset with references (before CUDA starts; the row subprocesses inherit it)
    allocator_for_references(a.references > 0)
    if a.row is not None:  # one row (a subprocess of the driver, or by hand)
        name = a.row + (f"/cap{a.cap_gb}" if a.cap_gb and "/cap" not in a.row else "")
        PROGRESS_PATH[0] = a.row_out + ".progress" if a.row_out else None
        row = run_row(a, name)
        if a.row_out:
            Path(a.row_out).write_text(json.dumps(row, indent=2, default=str))
        print("\n".join(table([row])))
        return
    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            "--device cuda but torch sees no GPU (use --preset tiny --device cpu for the smoke path)"
        )
    names = selected_rows(a)
    in_process = a.in_process or a.device == "cpu"
    rows = []
    for name in names:
        print(f"=== {name}", flush=True)
        t0 = time.perf_counter()
        row = run_row(a, name) if in_process else run_subprocess(a, name)
        row.setdefault("wall_s", time.perf_counter() - t0)
        rows.append(row)
    side, n_img, n_text = token_layout(a)
    gpu = torch.cuda.get_device_name() if a.device == "cuda" else "cpu"
    print(
        f"\n{a.preset} (random weights, synthetic inputs), {a.samples} x ({n_img} image + {n_text} text) tokens packed, "
        f"bf16, {gpu}, torch {torch.__version__}; warm-up {a.warmup}, measured {a.steps} (capped: {a.cap_steps})"
    )
    print(f"{FLOP_FORMULA}; PEAK_TFLOPS = {a.peak_tflops:g}")
    print(
        "peak GiB: torch.cuda.max_memory_allocated over the row's steps (the cap's check); steady: over the "
        "steps after the warm-up (kernel tuning done; what pred GiB estimates); smi GiB: nvidia-smi, the process"
    )
    ratio = ratios(rows)
    for key, value in ratio.items():
        print(f"tokens/s ratio {key}: {value:.2f}")
    print("\n".join(table(rows)))
    out = a.out or (os.path.join(os.environ["OUT"], "train_step.json") if os.environ.get("OUT") else None)
    if out:
        from kohakumoss_common.io import atomic_write_json

        config = {k: getattr(a, k) for k in COMMON}
        atomic_write_json(
            out,
            {
                "config": config,
                "device": gpu,
                "torch": torch.__version__,
                "formula": FLOP_FORMULA,
                "ratios": ratio,
                "rows": rows,
            },
        )
        print(f"wrote {out}")


if __name__ == "__main__":
    main()

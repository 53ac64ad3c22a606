"""The training loop: knobs in, runs/<RUN_NAME>/ out.

    build components -> data and plan -> base samples -> adapter or full fine-tune -> (resume) ->
    for each step: GRAD_ACCUM micro-steps (loss, backward) -> clip -> optimizer -> EMA -> log,
    validate, sample, checkpoint (with exports) -> final checkpoint, exports, grid, loss plot.

Written so that a run stopped at step k and resumed replays exactly what an uninterrupted run does:
the plan is a pure function of the data and knobs, sigmas and noise are drawn from (SEED, micro-step),
and the global RNG states travel in the checkpoint.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import random
import resource
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from kohakumoss.adapters import adapter_param_groups, build_adapter, clear_tlora_mask
from kohakumoss.diffusion import TimestepConfig
from kohakumoss.distributed import current
from kohakumoss.distributed.trainer import RankRun
from kohakumoss.export import export_all
from kohakumoss.export.metadata import run_metadata
from kohakumoss.export.verify import ExportMismatch
from kohakumoss_common.errors import CheckpointError, ConfigError, DataError, KohakuMossError
from kohakumoss_common.io import atomic_write_json, disk_full_as_error, ensure_free_space
from kohakumoss_common.log import add_file_log, get_logger

from .checkpoint import (
    clean_stale,
    load_checkpoint,
    resolve_checkpoint,
    save_checkpoint,
    set_aside_later,
    step_dirname,
    tensor_bytes,
)
from .collector import StepCollector
from .components import Components, build_components
from .data import (
    RunData,
    check_data_position,
    make_loader,
    open_run_data,
    plan_prefix_sha256,
    validation_batches,
)
from .ema import EMA
from .graphs import StepGraphs, graph_refusal, resolve_graphs
from .logbook import MetricsWriter, ProgressLines, loss_plot
from .optim import (
    CombinedOptimizer,
    build_adapter_optimizer,
    build_full_ft_optimizer,
    eval_weights,
    set_train_mode,
)
from .prefetch import Prefetcher
from .resume import check_resume_knobs, check_run_folder
from .rng import restore_rng
from .runner import StepRunner
from .samples import draw_row, grid, load_row, sample_captions, save_row
from .schedule import LRSchedule
from .state import load_trainable_state, trainable_state
from .step import draw_step_noise, flow_loss, to_device_batch
from .tracking import Trackers
from .validation import validation_loss

log = get_logger(__name__)


class NonFiniteLoss(KohakuMossError):
    pass


@dataclass
class Trainable:
    module: torch.nn.Module  # what holds the trainable weights: the LyCORIS network or the backbone
    network: Any  # LycorisNetwork or None (full fine-tune)
    params: list[torch.nn.Parameter]
    optimizer: CombinedOptimizer
    schedule: LRSchedule
    ema: EMA | None


class CacheOnly:
    """An encoder stand-in for VAE_ENCODE / TEXT_ENCODE = 'cache': same identity, a miss is an error."""

    def __init__(self, encoder, knob: str, script: str):
        self.encoder, self.knob, self.script = encoder, knob, script
        self.identity = encoder.identity
        for attr in ("template", "layer_choice"):
            if hasattr(encoder, attr):
                setattr(self, attr, getattr(encoder, attr))

    def encode(self, *args, **kwargs):
        raise DataError(
            f"{self.knob}='cache' but the cache misses an entry: run {self.script} first, or set {self.knob}='auto'"
        )


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def build_trainable(k: dict[str, Any], comps: Components) -> Trainable:
    model, device = comps.backbone, comps.device
    total = int(k["STEPS"])
    schedule = LRSchedule(k["LR_SCHEDULE"], int(k["LR_WARMUP_STEPS"]), total, float(k["LR_MIN_RATIO"]))
    if k["ALGO"] == "full":
        model.requires_grad_(True)
        optimizer = build_full_ft_optimizer(
            model,
            lr=k["LR"],
            muon_lr=k["MUON_LR"] or None,
            weight_decay=k["WEIGHT_DECAY"],
            use_muon=k["USE_MUON"],
            optimizer=k["OPTIMIZER"],
            optimizer_args=k["OPTIMIZER_ARGS"],
        )
        module, network = model, None
    else:
        algo_args = dict(k["ALGO_ARGS"])
        network = build_adapter(
            model,
            algo=k["ALGO"],
            rank=int(k["RANK"]),
            alpha=float(k["ALPHA"]),
            preset=k["TARGET_PRESET"],
            patterns=tuple(k["TARGET_PATTERNS"]),
            dropout=k["DROPOUT"],
            rank_dropout=k["RANK_DROPOUT"],
            module_dropout=k["MODULE_DROPOUT"],
            bypass=k["BYPASS"],
            **algo_args,
        )
        network.to(device=device, dtype=torch.float32)  # adapter weights train in fp32
        ratio = k["LORA_PLUS_RATIO"] or None
        groups = adapter_param_groups(network, k["LR"], ratio, k["WEIGHT_DECAY"])
        optimizer = build_adapter_optimizer(groups, k["LR"], k["OPTIMIZER"], k["OPTIMIZER_ARGS"])
        module = network
    if comps.engines is not None:  # states on the GPU, streamed or on the host, as the plan says
        optimizer = comps.engines.place_optimizer(optimizer)
    params = [p for p in module.parameters() if p.requires_grad]
    ema = EMA(module, k["EMA_DECAY"], int(k["EMA_WARMUP"]), int(k["EMA_EVERY"])) if k["EMA"] else None
    n = sum(p.numel() for p in params)
    log.info(f"training {'the full model' if network is None else k['ALGO']}: {n:,} trainable parameters")
    return Trainable(module, network, params, optimizer, schedule, ema)


def timestep_config(k: dict[str, Any]) -> TimestepConfig:
    return TimestepConfig(
        mode=k["TIMESTEP_SAMPLING"],
        logit_mean=k["LOGIT_MEAN"],
        logit_std=k["LOGIT_STD"],
        shift=k["TIMESTEP_SHIFT"],
        static_shift=k["STATIC_SHIFT"],
        mode_scale=k["MODE_SCALE"],
    )


def step_loss_fn(k: dict[str, Any], forward, dtype: torch.dtype):
    """The micro-step's loss as the knobs define it: (batch, sigma, noise) -> loss."""
    options = dict(loss_type=k["LOSS_TYPE"], huber_c=k["HUBER_C"], min_snr_gamma=k["MIN_SNR_GAMMA"])

    def step_loss(batch, sigma, noise):
        return flow_loss(
            forward, batch, sigma, noise, dtype, k["LOSS_WEIGHTING"], k["LOSS_REDUCTION"], **options
        )

    return step_loss


def build_runner(
    k: dict[str, Any], comps: Components, tr: Trainable, loss_fn, next_batch, scaler=None
) -> StepRunner:
    """The step the trainer runs (and scripts/bench/train_step.py measures): graphs where allowed."""
    graphs = build_step_graphs(k, comps, tr, loss_fn)
    return StepRunner(
        tr.optimizer,
        loss_fn,
        next_batch,
        device=comps.device,
        seed=int(k["SEED"]),
        accum=int(k["GRAD_ACCUM"]),
        timesteps=timestep_config(k),
        grad_clip=float(k["GRAD_CLIP"]),
        graphs=graphs,
        engines=comps.engines,
        scaler=scaler,
        tuning=lambda: comps.backbone.ops.tuning(device_time=graphs is not None),
        tlora_rank=int(k["RANK"]) if k["ALGO"] == "tlora" else None,
    )


def build_step_graphs(k: dict[str, Any], comps: Components, tr: Trainable, loss_fn) -> StepGraphs | None:
    """CUDA_GRAPHS: the micro-step's graphs where the run allows them (train/graphs.py says why not)."""
    refusal = graph_refusal(comps.plan, comps.device, k["ALGO"], float(k["MODULE_DROPOUT"]), comps.dtype)
    if not resolve_graphs(k["CUDA_GRAPHS"], refusal):
        if k["CUDA_GRAPHS"] == "auto" and comps.device.type == "cuda":
            log.info(f"CUDA graphs off ({refusal})")
        return None
    log.info("CUDA graphs on: each batch shape is captured on its second micro-step, then replayed")
    return StepGraphs(loss_fn, tr.params, backward_scale=1.0 / int(k["GRAD_ACCUM"]))


def resume_point(k: dict[str, Any], ckpt_root: Path) -> Path | None:
    if not k["RESUME"]:
        return None
    try:
        path = resolve_checkpoint(ckpt_root, k["RESUME"])
    except CheckpointError as e:
        raise ConfigError("RESUME", str(e)) from e
    if path is None:
        if k["RESUME"] == "latest":
            log.info(f"RESUME='latest': no checkpoint under {ckpt_root}, starting fresh")
            return None
        raise ConfigError("RESUME", f"no checkpoint at '{k['RESUME']}'")
    return path


def peak_memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux: process peak RSS


def export_bytes(comps: Components, tr: Trainable, k: dict[str, Any]) -> int:
    """An upper estimate of what `export_run` writes: adapter files at their stored size, merged models in bf16."""
    adapter = 2 * tensor_bytes(trainable_state(tr.module)) if tr.network is not None else 0
    backbone = sum(p.numel() for p in comps.backbone.parameters()) * 2
    merged = (bool(k["SAVE_MERGED"]) or tr.network is None) + bool(k["SAVE_DIFFUSERS"])
    return adapter + merged * backbone


def export_run(
    comps: Components, tr: Trainable, k: dict[str, Any], folder: Path, step: int | None = None
) -> dict[str, Path]:
    """The run's files into `folder`: ComfyUI / LyCORIS adapter (per SAVE_FORMAT), merged, diffusers, each
    verified (export/verify.py); the adapter files carry the run's ss_* / modelspec.* metadata at `step`
    (None: STEPS, the final export: the only one with full-difference ComfyUI files unless COMFY_DIFFS='every')."""
    clear_tlora_mask()
    metadata = run_metadata(k, int(k["STEPS"]) if step is None else step)

    def write() -> dict[str, Path]:
        written = export_all(
            comps.backbone,
            tr.network,
            folder,
            k["RUN_NAME"],
            save_merged_model=k["SAVE_MERGED"],
            save_diffusers=k["SAVE_DIFFUSERS"],
            metadata=metadata,
            save_format=k["SAVE_FORMAT"],
            full_diffs=step is None or k["COMFY_DIFFS"] == "every",
        )
        return written

    if tr.ema is not None and k["EXPORT_EMA"]:
        with tr.ema.swapped():
            return write()
    return write()


def save_run_checkpoint(
    comps, tr: Trainable, data: RunData, k: dict[str, Any], ckpt_root: Path, step: int
) -> Path:
    if not current().is_main:  # DISTRIBUTED: the weights are equal on every rank; rank 0 writes them
        return ckpt_root / step_dirname(step)
    with eval_weights(tr.optimizer):  # schedule-free: its averaged weights, saved with an eval-mode state
        return _save_run_checkpoint(comps, tr, data, k, ckpt_root, step)


def _save_run_checkpoint(
    comps, tr: Trainable, data: RunData, k: dict[str, Any], ckpt_root: Path, step: int
) -> Path:
    failed: list[ExportMismatch] = []
    path = save_checkpoint(
        ckpt_root,
        step,
        trainable_state(tr.module),
        tr.optimizer.state_dict(),
        tr.ema.state_dict() if tr.ema is not None else None,
        data_position={
            "step": step,
            "micro_step": step * int(k["GRAD_ACCUM"]),
            "plan_sha256": data.plan.sha256,
            "seen_sha256": plan_prefix_sha256(data.plan, step * int(k["GRAD_ACCUM"])),
        },
        config=k,
        keep_last=int(k["KEEP_LAST"]),
        write_extra=lambda tmp: _checked(failed, export_run, comps, tr, k, tmp / "export", step),
        extra_bytes=export_bytes(comps, tr, k),
    )
    if failed:  # the checkpoint is saved, its trainable weights and every export file kept; then stop
        raise failed[0]
    return path


def _checked(failed: list, fn, *args) -> None:
    """fn(*args), an ExportMismatch kept in `failed` instead of aborting the checkpoint being written."""
    try:
        fn(*args)
    except ExportMismatch as e:
        failed.append(e)


def export_final(comps: Components, tr: Trainable, k: dict[str, Any], folder: Path) -> dict[str, Path]:
    """The run's exports, refused (path, needed, free) when they would not fit on the disk."""
    if not current().is_main:
        return {}
    needed = export_bytes(comps, tr, k)
    ensure_free_space(folder, needed)
    with disk_full_as_error(folder, needed), eval_weights(tr.optimizer):
        return export_run(comps, tr, k, folder)


def dump_stacks_on_signal() -> None:
    """`kill -USR1 <pid>` prints every thread's stack to the console: where a silent run is spending its time."""
    if hasattr(signal, "SIGUSR1"):  # not on Windows
        faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)


def train(k: dict[str, Any]) -> Path:
    """Run training as the (validated) knobs say; returns the run folder."""
    run_dir = Path(k["RUNS_DIR"]) / k["RUN_NAME"]
    ckpt_root = run_dir / "checkpoints"
    rr = RankRun(k)  # one process, or this rank of a DISTRIBUTED run: rank 0 owns the run folder
    dump_stacks_on_signal()
    if rr.is_main:
        check_run_folder(k, run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    handler = add_file_log(rr.own(run_dir) / "log.txt")
    try:
        for stale in clean_stale(ckpt_root) if rr.is_main else ():
            log.info(f"removed {stale.name}, left in {ckpt_root} by an interrupted save or prune")
        resume_path = resume_point(k, ckpt_root)
        if resume_path is not None:  # before any weight is loaded
            for change in check_resume_knobs(k, resume_path):
                log.info(f"resume: {change} (RESUME_ALLOW_CHANGES)")
            step = json.loads((resume_path / "meta.json").read_text())["step"]
            later = set_aside_later(ckpt_root, step) if rr.is_main else []
            for moved in later:  # else 'latest' and KEEP_LAST would count them
                log.warning(f"checkpoint past the resumed step {step} set aside as {moved}")
        return _train(k, run_dir, ckpt_root, resume_path)
    except KohakuMossError as e:  # why the run stopped, in log.txt (the console gets it from the caller)
        handler.handle(log.makeRecord(log.name, logging.ERROR, __file__, 0, f"stopped: {e}", None, None))
        raise
    except Exception as e:  # a bug or a library's error: its traceback goes to the console
        why = f"stopped by {type(e).__name__}: {e}"
        handler.handle(log.makeRecord(log.name, logging.ERROR, __file__, 0, why, None, None))
        raise
    finally:
        logging.getLogger("kohakumoss").removeHandler(handler)
        handler.close()


def _train(k: dict[str, Any], run_dir: Path, ckpt_root: Path, resume_path: Path | None) -> Path:
    seed_everything(int(k["SEED"]))
    rr = RankRun(k)
    atomic_write_json(rr.own(run_dir) / "config.json", k)
    comps = build_components(k)
    model, device, dtype = comps.backbone, comps.device, comps.dtype
    log.info(f"device {device}, precision {k['PRECISION']}, run folder {run_dir}")
    image_encoder = (
        comps.vae
        if k["VAE_ENCODE"] != "cache"
        else CacheOnly(comps.vae, "VAE_ENCODE", "scripts/data/cache_latents.py")
    )
    text_encoder = (
        comps.text_encoder
        if k["TEXT_ENCODE"] != "cache"
        else CacheOnly(comps.text_encoder, "TEXT_ENCODE", "scripts/data/cache_text.py")
    )
    data = open_run_data(k, image_encoder, text_encoder)
    val = [
        to_device_batch(b, device, dtype) for b in validation_batches(data, k, image_encoder, text_encoder)
    ]

    val = val if rr.is_main else []  # the validation loss is rank 0's to log
    prompts = sample_captions(k)
    samples_dir = run_dir / "samples"
    can_sample = rr.is_main and bool(prompts) and comps.text_encoder is not None and comps.vae is not None
    base_row = None
    if can_sample:  # the base model's row, drawn before any training and kept for every later grid
        base_row = load_row(samples_dir / "base", "base", len(prompts))
        if base_row is None:
            with comps.text_encoder.on_device(), comps.vae.on_device():
                base_row = draw_row(model, comps.text_encoder, comps.vae, k, device, dtype)
            save_row(base_row, samples_dir / "base", "base")

    tr = build_trainable(k, comps)
    start = 0
    if resume_path is not None:
        ckpt = load_checkpoint(resume_path)
        check_data_position(data.plan, ckpt.data_position, resume_path, bool(k.get("RESUME_REPLAN")))
        if comps.engines is not None and comps.engines.streamer is not None:
            comps.engines.streamer.invalidate()  # streamed parameters point at their host copies
        load_trainable_state(tr.module, ckpt.trainable, resume_path)
        if ckpt.optimizer is not None:
            tr.optimizer.load_state_dict(ckpt.optimizer)
            set_train_mode(tr.optimizer, True)  # schedule-free states are saved in eval mode
        if tr.ema is not None and ckpt.ema is not None:
            tr.ema.load_state_dict(ckpt.ema)
        restore_rng(ckpt.rng)
        start = ckpt.step
        log.info(f"resumed from {resume_path} at step {start}")
    resume_step = start if resume_path is not None else None
    loggers = list(k["LOGGERS"]) if rr.is_main else []  # other ranks: their metrics in ranks/<rank>/
    trackers = Trackers(loggers, run_dir, k, resume_step)  # TensorBoard / wandb beside the jsonl
    metrics = MetricsWriter(rr.own(run_dir) / "metrics.jsonl", resume_step=resume_step, trackers=trackers)

    tcfg = timestep_config(k)
    accum, steps = int(k["GRAD_ACCUM"]), int(k["STEPS"])
    stop_at = min(int(k["STOP_AT"]) or steps, steps)
    scaler = torch.amp.GradScaler(device.type) if dtype == torch.float16 else None
    loader = make_loader(rr.local_data(data), k, image_encoder, text_encoder, start * accum)
    forward = rr.wrap(model, tr.network, comps.plan)  # DISTRIBUTED='ddp': DDP around the backbone

    step_loss = rr.loss_fn(step_loss_fn(k, forward, dtype), tcfg, draw_step_noise)  # this rank's share
    prefetch = Prefetcher(loader, device, dtype, start=start * accum)
    runner = build_runner(k, comps, tr, step_loss, rr.next_batch(prefetch.next_batch, start * accum), scaler)
    model.train()
    bad_in_row, skipped, step = 0, 0, start
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    quiet = None if rr.is_main else True  # one progress bar: rank 0's
    bar = tqdm(total=steps, initial=start, desc=k["RUN_NAME"], unit="step", dynamic_ncols=True, disable=quiet)
    progress = ProgressLines(log, steps) if bar.disable and rr.is_main else None  # no terminal: log lines
    collector = StepCollector(int(k["GC_EVERY"]))
    try:
        collector.start()
        while step < stop_at:
            t0 = time.perf_counter()
            lr_factor = tr.schedule.apply(tr.optimizer, step)
            result = runner.run(step)
            if step + 1 < stop_at:  # host work for the next step before this one's read
                runner.prepare_next(step)
            collector.after_launch(step)
            if not result.applied():  # read here, after the launches
                bad_in_row, skipped = bad_in_row + 1, skipped + 1
                log.warning(f"step {step}: non-finite loss, step skipped ({bad_in_row} in a row)")
                if bad_in_row >= int(k["MAX_BAD_STEPS"]):
                    raise NonFiniteLoss(
                        f"{bad_in_row} non-finite losses in a row (MAX_BAD_STEPS); lower LR, check the data or use PRECISION='bf16'"
                    )
                runner.skip_rest(result)  # keep the data aligned with the step count
                step += 1
                bar.update(1)
                continue
            bad_in_row = 0
            samples, tokens, grad_norm = result.samples, result.tokens, result.grad_norm
            if tr.ema is not None:
                tr.ema.update(step)
            step += 1
            dt = time.perf_counter() - t0
            bar.update(1)
            loss_value = result.loss()
            loss_value, samples, tokens = rr.step_totals(step, loss_value, samples, tokens)  # all ranks
            bar.set_postfix(loss=f"{loss_value:.4f}")
            if progress is not None:
                progress.update(step, loss_value, tokens / dt)
            if step % int(k["LOG_EVERY"]) == 0 or step == steps:
                record = dict(
                    step=step,
                    loss=loss_value,
                    lr=k["LR"] * lr_factor,
                    grad_norm=float(grad_norm),
                    samples=samples,
                    tokens=tokens,
                    samples_per_s=samples / dt,
                    tokens_per_s=tokens / dt,
                    step_s=dt,
                    peak_mem_gib=peak_memory_gib(device),
                    skipped=skipped,
                    gc_ms=collector.take_paused_ms(),
                )
                if k["VAL_EVERY"] and val and (step % int(k["VAL_EVERY"]) == 0 or step == steps):
                    with eval_weights(tr.optimizer):
                        record["val_loss"] = validation_loss(
                            model, val, list(k["VAL_SIGMAS"]), dtype, int(k["SEED"])
                        )
                metrics.write(record)
                log.debug(str(record))
            if can_sample and k["SAMPLE_EVERY"] and step % int(k["SAMPLE_EVERY"]) == 0 and step < steps:
                with eval_weights(tr.optimizer):
                    sample_grid(comps, k, base_row, samples_dir, step, metrics)
            if k["SAVE_EVERY"] and step % int(k["SAVE_EVERY"]) == 0 and step < steps:
                path = save_run_checkpoint(comps, tr, data, k, ckpt_root, step)
                log.info(f"checkpoint {path}")
    except KeyboardInterrupt:
        bar.close()
        path = save_run_checkpoint(comps, tr, data, k, ckpt_root, step)
        log.info(f"interrupted: saved {path}; continue with RESUME='latest'")
        raise
    finally:
        collector.stop()
        prefetch.close()
    bar.close()
    path = save_run_checkpoint(comps, tr, data, k, ckpt_root, step)
    log.info(f"checkpoint {path}")
    if step < steps:
        log.info(f"stopped at step {step} (STOP_AT); continue with RESUME='latest'")
        return run_dir
    if can_sample:  # before the exports: their thumbnail is the last grid
        with eval_weights(tr.optimizer):
            sample_grid(comps, k, base_row, samples_dir, step, metrics)
    written = export_final(comps, tr, k, run_dir / "export")
    log.info("exports: " + ", ".join(f"{kind} {p}" for kind, p in written.items()))
    loss_plot(metrics.read(), run_dir / "loss.png")
    metrics.close()
    log.info(f"done: {step} steps, {skipped} skipped; run folder {run_dir}")
    return run_dir


def sample_grid(
    comps: Components,
    k: dict[str, Any],
    base_row,
    samples_dir: Path,
    step: int,
    metrics: MetricsWriter | None = None,
) -> Path:
    clear_tlora_mask()
    with comps.text_encoder.on_device(), comps.vae.on_device():
        row = draw_row(comps.backbone, comps.text_encoder, comps.vae, k, comps.device, comps.dtype)
    save_row(row, samples_dir / step_dirname(step), "sample")
    image = grid([("base", base_row), (f"step {step}", row)], sample_captions(k))
    path = samples_dir / f"grid_{step_dirname(step)}.png"
    image.save(path)
    if metrics is not None:
        metrics.image("samples/grid", image, step)
    log.info(f"samples {path}")
    return path

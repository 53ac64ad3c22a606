"""The Trainer: one run built from its typed config, then trained over the shared step runner.

    Trainer(cfg, run_dir, rr) checkpoints to resume -> components -> data -> base samples -> trainable
                              -> (resume) -> metrics -> step runner
    .train()                  train_step() until STOP_AT or STEPS, a checkpoint; at STEPS the last grid,
                              the exports and the loss plot
    .train_step()             one optimizer step (GRAD_ACCUM micro-steps, clip, optimizer, EMA), then log,
                              validate, sample, checkpoint as their *_EVERY knobs say
    .save() .export() .sample() .validate()

Written so that a run stopped at step k and resumed replays exactly what an uninterrupted run does:
the plan is a pure function of the data and knobs, sigmas and noise are drawn from (SEED, micro-step),
and the global RNG states travel in the checkpoint.

Everything reads the typed config (`cfg.optim.lr`, or the section a builder takes). The flat knob dict,
`cfg.knobs()`, is only what the run writes out (config.json, a checkpoint's knobs that resume compares, the
trackers' config, the adapter metadata) and what the packages below still take as knobs (the memory plan
and its estimate, the data package's settings through data_knobs.py, the distributed run).
"""

from __future__ import annotations

import functools
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from kohakumoss.adapters import adapter_param_groups, build_from_spec, kernel_probe
from kohakumoss.adapters.algos import adapter_algo, reset_step_hook
from kohakumoss.checkpoint.folders import clean_stale, resolve_checkpoint, set_aside_later, step_dirname
from kohakumoss.checkpoint.read import load_checkpoint
from kohakumoss.checkpoint.rng import restore_rng
from kohakumoss.checkpoint.state import load_trainable_state, trainable_state
from kohakumoss.checkpoint.write import save_checkpoint, tensor_bytes
from kohakumoss.config.train import AdapterConfig, ObjectiveConfig, OptimConfig, TrainConfig
from kohakumoss.diffusion import TimestepConfig
from kohakumoss.diffusion.grid import grid
from kohakumoss.distributed.checkpoint import load_sharded
from kohakumoss.distributed.rank_run import RankRun, Shards
from kohakumoss.export import export_all
from kohakumoss.export.metadata import run_metadata
from kohakumoss.export.run_facts import dataset_facts, write_run_facts
from kohakumoss.export.verify import ExportMismatch
from kohakumoss.memory.estimate import references_per_target
from kohakumoss.model import linear_rows
from kohakumoss.optim.build import (
    build_adapter_optimizer,
    build_full_ft_optimizer,
    eval_weights,
    set_train_mode,
)
from kohakumoss.optim.combined import CombinedOptimizer
from kohakumoss_common.errors import CheckpointError, ConfigError, DataError, KohakuMossError
from kohakumoss_common.io import (
    atomic_write_json,
    disk_full_as_error,
    ensure_free_space,
    link_tree,
    save_image,
)
from kohakumoss_common.log import get_logger
from kohakumoss_common.paths import user_cache_dir
from kohakumoss_common.progress import StepProgress

from .collector import StepCollector
from .components import Components, build_components
from .data import (
    check_data_position,
    fill_caches_first,
    make_loader,
    open_run_data,
    plan_prefix_sha256,
    scan_dataset,
    validation_batches,
)
from .ema import EMA
from .epochs import resolve_epochs
from .finite import NonFiniteWeights, nonfinite_tensors
from .graphs import TEXT_PAD, StepGraphs, graph_refusal, resolve_graphs
from .interrupt import StepInterrupt
from .lengths import LengthSwitch
from .logbook import MetricsWriter, ProgressLines, loss_plot
from .prefetch import Prefetcher
from .preflight import RUNTIME_KEY, check_run, runtime_record
from .profiling import StepProfiler
from .resume import check_resume_knobs
from .runner import StepResult, StepRunner
from .samples import (
    draw_row,
    load_row,
    sample_captions,
    sample_png_info,
    sample_requests,
    save_row,
    timeline_rows,
)
from .schedule import LRSchedule
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
        for attr in ("template", "layer_choice", "references_in_prompt"):  # what the cache keys read
            if hasattr(encoder, attr):
                setattr(self, attr, getattr(encoder, attr))

    def encode(self, *args, **kwargs):
        raise DataError(
            f"{self.knob}='cache' but the cache misses an entry: run {self.script} first, or set {self.knob}='auto'"
        )


class Trainer:
    """One run (or this rank's part of a DISTRIBUTED one): `Trainer(cfg, run_dir, rr).train()`."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, rr: RankRun):
        self.cfg, self.rr = cfg, rr
        self.knobs = cfg.knobs()  # the flat dict the run writes out: config.json, checkpoints, metadata
        self.run_dir, self.ckpt_root, self.samples_dir = run_dir, run_dir / "checkpoints", run_dir / "samples"
        self.steps, self.accum = int(cfg.optim.steps), int(cfg.optim.grad_accum)
        self.stop_at = min(int(cfg.run.stop_at) or self.steps, self.steps)
        check_run(cfg)  # every refusal kohakumoss-config check reports, before anything loads
        resume_path = self.find_resume()
        seed_everything(int(cfg.run.seed))
        atomic_write_json(rr.own(run_dir) / "config.json", {**self.knobs, RUNTIME_KEY: runtime_record()})
        self.scanned = scan_dataset(cfg)  # a dataset with nothing usable is refused before the models load
        self.comps = build_components(cfg)
        rr.check_plan(self.comps.plan)  # fsdp, a pipeline: the engines it cannot run, refused here
        threads = f" ({torch.get_num_threads()} threads)" if self.comps.device.type == "cpu" else ""
        log.info(
            f"device {self.comps.device}{threads}, precision {cfg.device.precision}, run folder {run_dir}"
        )
        self.build_data()
        self.resolve_epochs()
        self.base_row = self.base_samples()
        self.tr = self.build_trainable()
        self.bad_in_row, self.skipped = 0, 0  # the run's counters: a resume takes its checkpoint's
        self.start = self.load(resume_path) if resume_path is not None else 0
        self.step = self.start
        self.interrupt = StepInterrupt()  # its handlers are installed while train() loops
        self.build_metrics(self.start if resume_path is not None else None)
        self.build_runner()

    # ---- build: each piece in the order the run needs them (a resumed run replays this order)

    def find_resume(self) -> Path | None:
        """Stale temporaries removed; RESUME's checkpoint, its knobs checked before any weight is loaded."""
        for stale in clean_stale(self.ckpt_root) if self.rr.is_main else ():
            log.info(f"removed {stale.name}, left in {self.ckpt_root} by an interrupted save or prune")
        path = resume_point(self.cfg.run.resume, self.ckpt_root)
        if path is None:
            return None
        for change in check_resume_knobs(self.cfg, path):
            log.info(f"resume: {change} (RESUME_ALLOW_CHANGES)")
        step = json.loads((path / "meta.json").read_text())["step"]
        # checkpoints past the resumed step move aside: else 'latest' and KEEP_LAST would count them
        for moved in set_aside_later(self.ckpt_root, step) if self.rr.is_main else ():
            log.warning(f"checkpoint past the resumed step {step} set aside as {moved}")
        return path

    def build_data(self) -> None:
        """The encoders (or their cache-only stand-ins), the data plan and rank 0's validation batches."""
        cfg, comps = self.cfg, self.comps
        self.image_encoder = (
            comps.vae
            if cfg.data.vae_encode != "cache"
            else CacheOnly(comps.vae, "VAE_ENCODE", "scripts/data/cache_latents.py")
        )
        self.text_encoder = (
            comps.text_encoder
            if cfg.data.text_encode != "cache"
            else CacheOnly(comps.text_encoder, "TEXT_ENCODE", "scripts/data/cache_text.py")
        )
        self.data = open_run_data(cfg, self.image_encoder, self.text_encoder, self.scanned)
        if self.rr.is_main:  # what the exports' ss_* keys say about the data (basenames, counts, tags)
            side = math.isqrt(int(cfg.data.area))
            write_run_facts(
                self.run_dir, dataset_facts(cfg.data.dataset, self.data.catalog, self.data.plan, side)
            )
        if fill_caches_first(self.data, cfg, self.image_encoder, self.text_encoder, self.rr.is_main):
            self.rr.barrier()  # rank 0 filled the caches; the others read them again
            fill_caches_first(self.data, cfg, self.image_encoder, self.text_encoder, fill=False)
        batches = validation_batches(self.data, cfg, self.image_encoder, self.text_encoder)
        val = [to_device_batch(b, comps.device, comps.dtype) for b in batches]
        # the validation loss is rank 0's to log; under FSDP2 every rank runs the forward (it gathers)
        self.val = val if self.rr.is_main or self.rr.fsdp else []

    def resolve_epochs(self) -> None:
        """EPOCHS / SAVE_EVERY_EPOCHS / SAMPLE_EVERY_EPOCHS as steps, now that the plan knows an epoch's length."""
        per_epoch = self.data.steps_per_epoch
        self.cfg = resolve_epochs(self.cfg, per_epoch)
        self.steps = int(self.cfg.optim.steps)
        self.stop_at = min(int(self.cfg.run.stop_at) or self.steps, self.steps)
        if self.cfg.optim.epochs:
            log.info(f"EPOCHS {self.cfg.optim.epochs}: {per_epoch} steps per epoch, {self.steps} steps")

    def base_samples(self):
        """The base model's sample row (rank 0), drawn before any training and kept for every later grid."""
        comps, self.prompts = self.comps, sample_captions(self.cfg.samples)
        encoders = comps.text_encoder is not None and comps.vae is not None
        self.can_sample = self.rr.is_main and bool(self.prompts) and encoders
        # under FSDP2 every rank draws every row with rank 0 (the forward gathers each block)
        self.draws = self.can_sample or (self.rr.fsdp and bool(self.prompts) and encoders)
        if not self.draws:
            return None
        row = load_row(self.samples_dir / "base", "base", len(self.prompts)) if self.can_sample else None
        if self.rr.main_decides(row is None):  # rank 0 found no saved row: every drawing rank draws
            row = self.draw_row("base model samples")
            if self.can_sample:
                infos = [
                    sample_png_info(r, self.cfg.samples, "base", comps.text_encoder)
                    for r in sample_requests(self.cfg.samples)
                ]
                save_row(row, self.samples_dir / "base", "base", infos)
        return row if self.can_sample else None

    def build_trainable(self) -> Trainable:
        """The trainable weights and their optimizer. Under DISTRIBUTED='fsdp' the backbone was built sharded
        (an adapter wraps the sharded linears and stays whole); rr.sharding records it before a full
        fine-tune's optimizer is built (it steps the shards)."""
        comps = self.comps
        with self.rr.sharding(comps.backbone, comps.dtype, comps.plan):
            return build_trainable(self.cfg, comps)

    def load(self, path: Path) -> int:
        """The checkpoint's trainable weights, optimizer, EMA and RNG states and the run's counters; returns its step."""
        tr, engines = self.tr, self.comps.engines
        ckpt = load_checkpoint(path, sharded_weights=False)  # shards: loaded into the model below
        check_data_position(self.data.plan, ckpt.data_position, path, self.cfg.run.resume_replan)
        if engines is not None and engines.streamer is not None:
            engines.streamer.invalidate()  # streamed parameters point at their host copies
        if ckpt.metadata.get("sharded"):  # an FSDP2 run's: DCP reshards it to this run's ranks (or one)
            load_sharded(path / "sharded", tr.module, optimizer_members(tr.optimizer))
        elif self.rr.fsdp and tr.network is None:
            raise CheckpointError(
                path,
                "a full fine-tune's whole-model checkpoint cannot resume under DISTRIBUTED='fsdp' (its "
                "optimizer states are not sharded); resume it with DISTRIBUTED='none' or 'ddp'",
            )
        else:
            load_trainable_state(tr.module, ckpt.trainable, path)
        if ckpt.optimizer is not None:
            tr.optimizer.load_state_dict(ckpt.optimizer)
            set_train_mode(tr.optimizer, True)  # schedule-free states are saved in eval mode
        if tr.ema is not None and ckpt.ema is not None:
            tr.ema.load_state_dict(ckpt.ema)
        restore_rng(ckpt.rng)
        counters = ckpt.metadata.get("counters", {})  # absent in older checkpoints: counted from here
        self.skipped, self.bad_in_row = int(counters.get("skipped", 0)), int(counters.get("bad_in_row", 0))
        log.info(f"resumed from {path} at step {ckpt.step}")
        return ckpt.step

    def build_metrics(self, resume_step: int | None) -> None:
        """metrics.jsonl (this rank's), with TensorBoard / wandb beside it on rank 0."""
        loggers = list(self.cfg.run.loggers) if self.rr.is_main else []  # other ranks: ranks/<rank>/
        trackers = Trackers(loggers, self.run_dir, self.knobs, resume_step)
        path = self.rr.own(self.run_dir) / "metrics.jsonl"
        self.metrics = MetricsWriter(path, resume_step=resume_step, trackers=trackers)

    def build_runner(self) -> None:
        """The shared step runner over this rank's prefetched batches from the start step's micro-step."""
        cfg, comps, rr, first = self.cfg, self.comps, self.rr, self.start * self.accum
        scaler = torch.amp.GradScaler(comps.device.type) if comps.dtype == torch.float16 else None
        loader = make_loader(rr.prepare_data(self.data), cfg, self.image_encoder, self.text_encoder, first)
        forward = rr.prepare_model(comps.backbone, self.tr.network, comps.plan)  # DDP, the stages, or itself
        loss_fn = step_loss_fn(cfg.objective, forward, comps.dtype)
        step_loss = rr.step_fn(loss_fn, timestep_config(cfg.objective), draw_step_noise)  # this rank's share
        self.tr.optimizer = rr.prepare_optimizer(self.tr.optimizer)  # a pipeline clips by every rank's grads
        # the prefetcher is built below, once the runner says whether the batches are padded
        self.runner = build_runner(cfg, comps, self.tr, step_loss, lambda: self.prefetch.next_batch(), scaler)
        pad = text_pad(comps.device, self.runner.graphs is not None, rr.pipelined)
        if (
            pad and self.runner.graphs is None
        ):  # eager over fixed shapes: lengths on the device once they vary
            self.runner.lengths = LengthSwitch(comps.backbone.ops, "no kernel is rebuilt per caption length")
        self.prefetch = Prefetcher(loader, comps.device, comps.dtype, start=first, pad_to=pad)

    def begin(self) -> None:
        """Train mode, the peak-memory counter, rank 0's progress (a bar, or log lines off a terminal; log.txt
        gets the lines either way)."""
        device = self.comps.device
        self.comps.backbone.train()
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the build's cached blocks: the reserved peak is then the training's
            torch.cuda.reset_peak_memory_stats(device)
        quiet = None if self.rr.is_main else True
        self.bar = tqdm(
            total=self.steps,
            initial=self.start,
            desc=self.cfg.run.run_name,
            unit="step",
            dynamic_ncols=True,
            disable=quiet,
        )
        self.progress = ProgressLines(log, self.steps, console=self.bar.disable) if self.rr.is_main else None
        self.collector = StepCollector(int(self.cfg.runtime.gc_every))
        self.profiler = StepProfiler(
            self.cfg.runtime.profile_steps, self.rr.own(self.run_dir), self.comps.device
        )

    # ---- the loop

    def train(self) -> Path:
        """train_step() until STOP_AT (or STEPS) and a checkpoint; at STEPS the last grid and the exports."""
        self.begin()
        try:
            self.collector.start()
            with self.interrupt:  # Ctrl-C or SIGTERM: after the step in flight
                while self.step < self.stop_at:
                    self.train_step()
                    self.interrupt.check()
        except KeyboardInterrupt:
            self.bar.close()
            if self.interrupt.torn:  # stopped inside an update: no checkpoint holds one step's state
                log.info("interrupted inside a step's update: the last checkpoint stands")
                raise
            if self.rr.collective_saves:  # the ranks stop at different points: no collective save
                log.info("interrupted: the last checkpoint stands (its saves need every rank in step)")
                raise
            log.info(f"interrupted: saved {self.save()}; continue with RESUME='latest'")
            raise
        finally:
            self.profiler.close()
            self.collector.stop()
            self.prefetch.close()
        self.bar.close()
        final = self.step >= self.steps
        if final and self.draws:
            self.sample()  # the last grid: the final exports' thumbnail
        checkpoint = self.save(final=final)
        log.info(f"checkpoint {checkpoint}")
        if not final:
            log.info(f"stopped at step {self.step} (STOP_AT); continue with RESUME='latest'")
            return self.run_dir
        self.finish(checkpoint)
        return self.run_dir

    def train_step(self) -> None:
        """One optimizer step over the runner; its result is read on the host only after the launches."""
        step = self.step
        self.profiler.before(step + 1)
        t0 = time.perf_counter()
        with self.interrupt.critical():  # a stop signal waits until the update is counted in self.step
            lr_factor = self.tr.schedule.apply(self.tr.optimizer, step)
            result = self.runner.run(step)
            if step + 1 < self.stop_at:  # host work for the next step before this one's read
                self.runner.prepare_next(step)
            self.collector.after_launch(step)
            applied = result.applied()  # read here, after the launches
            if applied:
                self.bad_in_row = 0
                if self.tr.ema is not None:
                    self.tr.ema.update(step)
                self.step = step + 1
            else:
                self.skip(result)
        if not applied:
            return
        dt = time.perf_counter() - t0
        self.bar.update(1)
        self.log_step(result, lr_factor, dt)
        self.profiler.after(self.step)
        if self.step < self.steps:  # the last step's grid and checkpoint come after the loop
            if self.draws and self.every(self.cfg.samples.sample_every):
                self.sample()
            if self.every(self.cfg.run.save_every):
                log.info(f"checkpoint {self.save()}")

    def skip(self, result: StepResult) -> None:
        """A non-finite step: counted, its remaining batches taken; MAX_BAD_STEPS in a row stop the run."""
        self.bad_in_row, self.skipped = self.bad_in_row + 1, self.skipped + 1
        log.warning(
            f"step {self.step}: non-finite loss or gradients, step skipped ({self.bad_in_row} in a row)"
        )
        if self.bad_in_row >= int(self.cfg.objective.max_bad_steps):
            raise NonFiniteLoss(
                f"{self.bad_in_row} non-finite losses in a row (MAX_BAD_STEPS); lower LR, check the data or use PRECISION='bf16'"
            )
        self.runner.skip_rest(result)  # keep the data aligned with the step count
        self.step += 1
        self.bar.update(1)

    def log_step(self, result: StepResult, lr_factor: float, dt: float) -> None:
        """The step's loss on the progress line; every LOG_EVERY steps (and the last) a metrics record."""
        step = self.step
        logged = self.every(self.cfg.run.log_every) or step == self.steps
        totals = self.rr.reduce_step(  # every rank's; on a logged step each rank's (threaded: stage's) peak
            step,
            result.loss(),
            result.samples,
            result.tokens,
            self.comps.device if logged else None,
            result.reference_tokens,
        )
        loss, samples, tokens, peaks = totals.loss, totals.samples, totals.tokens, totals.peaks_gib
        self.bar.set_postfix(loss=f"{loss:.4f}")
        if self.progress is not None:
            self.progress.update(step, loss, tokens / dt)
        if not logged:
            return
        record = dict(
            step=step,
            loss=loss,
            lr=self.cfg.optim.lr * lr_factor,
            grad_norm=float(result.grad_norm),
            samples=samples,
            tokens=tokens,
            samples_per_s=samples / dt,
            tokens_per_s=tokens / dt,
            step_s=dt,
            peak_mem_gib=max(peaks),
            skipped=self.skipped,
            gc_ms=self.collector.take_paused_ms(),
        )
        if totals.reference_tokens:  # an edit step: tokens counts its reference images' too
            record["reference_tokens"] = totals.reference_tokens
        if len(peaks) > 1:
            record["peak_mem_gib_ranks"] = peaks
        if self.comps.device.type == "cuda":  # the allocator's cache on top: what the card must hold
            record["peak_reserved_gib"] = torch.cuda.max_memory_reserved(self.comps.device) / 2**30
        if self.profiler.active(step):
            record["profiled"] = True
        val_every = self.cfg.data.val_every
        if self.val and (self.every(val_every) or (val_every and step == self.steps)):
            record["val_loss"] = self.validate()
        self.metrics.write(record)
        log.debug(str(record))

    def every(self, n: int) -> bool:
        """The step is a multiple of an *_EVERY knob's value `n` (0: never)."""
        return bool(n) and self.step % int(n) == 0

    def finish(self, checkpoint: Path) -> None:
        """After the last step and its checkpoint: the run's exports, the loss plot."""
        written = self.export(checkpoint)
        log.info("exports: " + ", ".join(f"{kind} {p}" for kind, p in written.items()))
        if self.rr.is_main:  # the run's plot is rank 0's (other ranks' metrics live in ranks/<rank>/)
            loss_plot(self.metrics.read(), self.run_dir / "loss.png")
        self.metrics.close()
        log.info(f"done: {self.step} steps, {self.skipped} skipped; run folder {self.run_dir}")

    # ---- what a step may do besides training: validate, sample, save, export

    def validate(self) -> float:
        """The validation loss at VAL_SIGMAS (schedule-free: at its averaged weights)."""
        cfg, comps = self.cfg, self.comps
        with eval_weights(self.tr.optimizer), self.rr.whole_forward(comps.backbone):
            return validation_loss(
                comps.backbone, self.val, list(cfg.data.val_sigmas), comps.dtype, int(cfg.run.seed)
            )

    def sample(self) -> Path:
        """The sample grid at this step: the base row beside this step's row, saved and logged."""
        step = self.step
        with eval_weights(self.tr.optimizer):
            reset_step_hook(self.cfg.adapter.algo)
            row = self.draw_row(f"samples at step {step}")
            if not self.rr.is_main:  # an FSDP2 rank drew with rank 0; rank 0 keeps the row
                return self.samples_dir
            infos = [
                sample_png_info(r, self.cfg.samples, f"step {step}", self.comps.text_encoder)
                for r in sample_requests(self.cfg.samples)
            ]
            save_row(row, self.samples_dir / step_dirname(step), "sample", infos)
            image = grid([("base", self.base_row), (f"step {step}", row)], self.prompts)
            path = self.samples_dir / f"grid_{step_dirname(step)}.png"
            save_image(image, path)
            # every row so far under the base one: how the samples moved across the run
            timeline = [("base", self.base_row), *timeline_rows(self.samples_dir, len(row), step)]
            save_image(grid(timeline, self.prompts), self.samples_dir / "timeline.png")
            self.metrics.image("samples/grid", image, step)
        log.info(f"samples {path}")
        return path

    def draw_row(self, desc: str):
        """One image per sample prompt from the backbone as it is now, the encoders on the device meanwhile;
        rank 0 shows the sampler's steps as `desc` (a bar, or progress lines)."""
        comps = self.comps
        progress = StepProgress(desc, leave=False) if self.rr.is_main else None
        with comps.text_encoder.on_device(), comps.vae.on_device(), self.rr.whole_forward(comps.backbone):
            try:
                return draw_row(
                    comps.backbone,
                    comps.text_encoder,
                    comps.vae,
                    self.cfg,
                    comps.device,
                    comps.dtype,
                    progress,
                )
            finally:
                if progress is not None:
                    progress.close()

    def save(self, final: bool = False) -> Path:
        """A checkpoint at this step, its exports inside (`final`: the run's final exports, linked into
        run_dir/export afterwards); rank 0 writes it (the weights are equal on every rank). Under FSDP2
        every rank writes its shards into it and takes part in the exports' gather. Non-finite trainable
        weights are refused first (`NonFiniteWeights`): nothing of them is written."""
        self.refuse_nonfinite_weights()
        # a pipeline: rank 0 holds every stage's; FSDP2: every rank writes its shards into rank 0's folder
        with self.rr.saving(self.tr, self.comps.backbone) as shards:
            if not self.rr.is_main:
                return self.ckpt_root / step_dirname(self.step)
            with eval_weights(self.tr.optimizer):  # schedule-free: its averaged weights, an eval-mode state
                return self.write_checkpoint(shards, final)

    def refuse_nonfinite_weights(self) -> None:
        """Stop with NonFiniteWeights when a rank's trainable weights hold inf or nan (all ranks together)."""
        bad = nonfinite_tensors(self.tr.module)
        if self.rr.any_rank(bool(bad)):
            where = f"{len(bad)} tensor(s), first {bad[0]}" if bad else "on another rank"
            raise NonFiniteWeights(
                f"step {self.step}: the trainable weights are not finite ({where}; {self.skipped} step(s) "
                f"skipped so far): no checkpoint or export written; lower LR or check the data, then "
                "resume from the last checkpoint"
            )

    def write_checkpoint(self, shards: Shards | None = None, final: bool = False) -> Path:
        """Rank 0's checkpoint folder; `shards` (FSDP2): every rank's DCP state, written by all of them
        into `sharded/` instead of trainable.safetensors and optimizer.pt. `final`: its exports are the
        run's final ones (full ComfyUI differences, metadata at STEPS)."""
        tr, step, micro = self.tr, self.step, self.step * self.accum
        failed: list[ExportMismatch] = []

        def exports(tmp: Path) -> None:
            with self.rr.whole_weights(tr, self.comps.backbone):  # FSDP2: every rank gathers, rank 0 writes
                _checked(failed, self.write_exports, tmp / "export", None if final else step)

        path = save_checkpoint(
            self.ckpt_root,
            step,
            trainable_state(tr.module) if shards is None else None,
            tr.optimizer.state_dict() if shards is None else None,
            tr.ema.state_dict() if tr.ema is not None else None,
            data_position={
                "step": step,
                "micro_step": micro,
                "plan_sha256": self.data.plan.sha256,
                "seen_sha256": plan_prefix_sha256(self.data.plan, micro),
            },
            config=self.knobs,
            metadata={"counters": {"skipped": self.skipped, "bad_in_row": self.bad_in_row}},
            keep_last=int(self.cfg.run.keep_last),
            write_extra=exports,
            extra_bytes=self.export_bytes() + (tensor_bytes(shards.state) if shards is not None else 0),
            write_sharded=shards.write if shards is not None else None,
        )
        if failed:  # the checkpoint is saved, its trainable weights and every export file kept; then stop
            raise failed[0]
        return path

    def export(self, checkpoint: Path) -> dict[str, Path]:
        """The run's final exports in run_dir/export: the final checkpoint's export files, hard-linked (the
        bytes are on disk once). Where they cannot be linked (another filesystem, FSDP2) they are written
        again, refused (path, needed, free) when they would not fit; under FSDP2 every rank gathers the
        weights and rank 0 writes them (the files of a one-process run)."""
        if not self.rr.fsdp:
            linked = link_tree(checkpoint / "export", self.run_dir / "export") if self.rr.is_main else []
            # every rank learns whether rank 0 writes them again: under a pipeline that gathers the stages
            if not self.rr.main_decides(not linked):
                return {p.name: p for p in linked}
        with self.rr.whole_weights(self.tr, self.comps.backbone):  # rank 0 holds every weight
            if not self.rr.is_main:
                return {}
            folder, needed = self.run_dir / "export", self.export_bytes()
            ensure_free_space(folder, needed)
            with disk_full_as_error(folder, needed), eval_weights(self.tr.optimizer):
                return self.write_exports(folder)

    def write_exports(self, folder: Path, step: int | None = None) -> dict[str, Path]:
        """ComfyUI / LyCORIS adapter (per SAVE_FORMAT), merged, diffusers, each verified (export/verify.py);
        the adapter files carry the run's ss_* / modelspec.* metadata at `step` (None: STEPS, the final
        export: the only one with full-difference ComfyUI files unless COMFY_DIFFS='every')."""
        export = self.cfg.export
        reset_step_hook(self.cfg.adapter.algo)
        knobs = {**self.knobs, "STEPS": self.steps}  # EPOCHS resolved: the files name the run's steps
        metadata = run_metadata(knobs, self.steps if step is None else step)  # written into the files

        def write() -> dict[str, Path]:
            return export_all(
                self.comps.backbone,
                self.tr.network,
                folder,
                self.cfg.run.run_name,
                save_merged_model=export.save_merged,
                save_diffusers=export.save_diffusers,
                metadata=metadata,
                save_format=export.save_format,
                full_diffs=step is None or export.comfy_diffs == "every",
            )

        if self.tr.ema is not None and self.cfg.optim.export_ema:
            with self.tr.ema.swapped():
                return write()
        return write()

    def export_bytes(self) -> int:
        """An upper estimate of what the exports write: adapter files at their stored size, merged models in bf16."""
        tr, export = self.tr, self.cfg.export
        adapter = 2 * tensor_bytes(trainable_state(tr.module)) if tr.network is not None else 0
        backbone = sum(p.numel() for p in self.comps.backbone.parameters()) * 2
        merged = (bool(export.save_merged) or tr.network is None) + bool(export.save_diffusers)
        return adapter + merged * backbone


# ---- the trainer's pieces as functions of the knobs (scripts/bench/train_step.py builds its step from them)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def build_trainable(cfg: TrainConfig, comps: Components) -> Trainable:
    """The adapter (ALGO) or the whole backbone (ALGO='full'), its optimizer (placed by the memory plan),
    LR schedule and EMA."""
    model, optim = comps.backbone, cfg.optim
    schedule = LRSchedule(
        optim.lr_schedule,
        int(optim.lr_warmup_steps),
        int(optim.steps),
        float(optim.lr_min_ratio),
        cycles=int(optim.lr_cycles),
        power=float(optim.lr_power),
    )
    if cfg.adapter.algo == "full":
        model.requires_grad_(True)
        module, network = model, None
    else:
        probe_adapter_kernels(cfg, comps)
        # lycoris draws the initial weights from the global generator: seeded here, they are a function of
        # SEED alone (a backbone build that stopped drawing once changed every run's adapter, and the demo's)
        torch.manual_seed(int(cfg.run.seed))
        network = build_from_spec(model, cfg.adapter.spec())
        network.to(device=comps.device, dtype=torch.float32)  # adapter weights train in fp32
        if model.block_runner is not None:  # recomputation restores the RNG state only for dropout
            model.block_runner.recompute_rng(adapter_draws_random(cfg.adapter))
        module = network
    optimizer = build_optimizer(optim, model, network, cfg.adapter.lora_plus_ratio)
    if comps.engines is not None:  # states on the GPU, streamed or on the host, as the plan says
        optimizer = comps.engines.place_optimizer(optimizer)
    params = [p for p in module.parameters() if p.requires_grad]
    ema = EMA(module, optim.ema_decay, int(optim.ema_warmup), int(optim.ema_every)) if optim.ema else None
    n = sum(p.numel() for p in params)
    what = "the full model" if network is None else cfg.adapter.algo
    log.info(f"training {what}: {n:,} trainable parameters")
    return Trainable(module, network, params, optimizer, schedule, ema)


def probe_adapter_kernels(cfg: TrainConfig, comps: Components) -> None:
    """On a GPU, an adapter that runs lycoris's own kernels tries them in a child process first, at the
    step's shapes (`adapters/kernel_probe.py`): a kernel that faults there costs the run its speed, not
    the run."""
    spec = cfg.adapter.spec()
    if comps.device.type != "cuda" or not kernel_probe.needs_probe(spec):
        return
    shapes = kernel_probe.probe_shapes(comps.backbone, spec, step_rows(cfg))
    kernel_probe.probe_lycoris_kernels(spec, shapes, comps.dtype, comps.device, user_cache_dir())


def step_rows(cfg: TrainConfig) -> Callable[[str], int]:
    """Rows each linear of the backbone multiplies in a full step (`model.linear_rows`): the step's
    samples of AREA's image tokens, MAX_TEXT_TOKENS and, for an edit dataset, the references the memory
    estimate prices, each at the target's area (they pass the blocks and the video embedder)."""
    image, text = cfg.data.area // 256, cfg.data.max_text_tokens
    refs = image * references_per_target(cfg)
    n = max(1, cfg.data.tokens_per_step // (image + text + refs))  # samples in a full step
    return lambda name: linear_rows(name, n * image, n * text, n, n * refs)


def build_optimizer(
    optim: OptimConfig, model: torch.nn.Module, network: Any = None, lora_plus_ratio: float = 0.0
) -> CombinedOptimizer:
    """OPTIMIZER over the adapter's LoRA+ groups, or (network None) Muon and OPTIMIZER over the whole model."""
    if network is None:
        return build_full_ft_optimizer(
            model,
            lr=optim.lr,
            muon_lr=optim.muon_lr or None,
            weight_decay=optim.weight_decay,
            use_muon=optim.use_muon,
            optimizer=optim.optimizer,
            optimizer_args=optim.optimizer_args,
        )
    groups = adapter_param_groups(network, optim.lr, lora_plus_ratio or None, optim.weight_decay)
    return build_adapter_optimizer(groups, optim.lr, optim.optimizer, optim.optimizer_args)


def optimizer_members(optimizer) -> list[torch.optim.Optimizer]:
    """The torch optimizers inside a CombinedOptimizer (or the memory plan's placed one)."""
    return list(optimizer.optimizers.values())


def timestep_config(objective: ObjectiveConfig) -> TimestepConfig:
    return TimestepConfig(
        mode=objective.timestep_sampling,
        logit_mean=objective.logit_mean,
        logit_std=objective.logit_std,
        shift=objective.timestep_shift,
        static_shift=objective.static_shift,
        mode_scale=objective.mode_scale,
    )


def step_loss_fn(objective: ObjectiveConfig, forward, dtype: torch.dtype):
    """The micro-step's loss as the objective defines it: (batch, sigma, noise) -> loss."""
    o = objective
    options = dict(loss_type=o.loss_type, huber_c=o.huber_c, min_snr_gamma=o.min_snr_gamma)

    def step_loss(batch, sigma, noise):
        return flow_loss(forward, batch, sigma, noise, dtype, o.loss_weighting, o.loss_reduction, **options)

    return step_loss


def text_pad(device: torch.device, graphed: bool, pipeline: bool) -> int:
    """The batches' text padding (`PackedSeq.build(pad_to=...)`): on CUDA, so that batches of one
    bucket have one shape whatever their captions. A graph replays it; an eager step keeps its kernels
    (cuDNN plans, Triton specializations by token count) instead of building new ones per batch, which
    a profile of an eager run found in its host time. Not under a pipeline, which cuts batches by sample."""
    return TEXT_PAD if graphed or (device.type == "cuda" and not pipeline) else 0


def build_runner(
    cfg: TrainConfig, comps: Components, tr: Trainable, loss_fn, next_batch, scaler=None
) -> StepRunner:
    """The step the trainer runs (and scripts/bench/train_step.py measures): graphs where allowed."""
    graphs = build_step_graphs(cfg, comps, tr, loss_fn)
    adapter = cfg.adapter
    return StepRunner(
        tr.optimizer,
        loss_fn,
        next_batch,
        device=comps.device,
        seed=int(cfg.run.seed),
        accum=int(cfg.optim.grad_accum),
        timesteps=timestep_config(cfg.objective),
        grad_clip=float(cfg.optim.grad_clip),
        graphs=graphs,
        engines=comps.engines,
        scaler=scaler,
        tuning=lambda: comps.backbone.ops.tuning(device_time=graphs is not None),
        step_hook=step_hook(adapter),
    )


def step_hook(adapter: AdapterConfig) -> Callable[[torch.Tensor], None] | None:
    """What the adapter's algorithm sets from each micro-step's sigmas (T-LoRA's rank mask), or None."""
    algo = adapter_algo(adapter.algo)
    if algo is None or algo.step_hook is None:
        return None
    return functools.partial(algo.step_hook.before, rank=int(adapter.rank))


def adapter_draws_random(adapter: AdapterConfig) -> bool:
    """Whether the adapter's forward draws random numbers (its dropouts): checkpointing then restores RNG state."""
    drops = (adapter.dropout, adapter.rank_dropout, adapter.module_dropout)
    return adapter.algo != "full" and any(float(d) > 0 for d in drops)


def build_step_graphs(cfg: TrainConfig, comps: Components, tr: Trainable, loss_fn) -> StepGraphs | None:
    """CUDA_GRAPHS: the micro-step's graphs where the run allows them (train/graphs.py says why not)."""
    adapter, mode = cfg.adapter, cfg.runtime.cuda_graphs
    draws = adapter_draws_random(adapter)
    refusal = graph_refusal(
        comps.plan, comps.device, adapter.algo, float(adapter.module_dropout), comps.dtype, draws
    )
    if not resolve_graphs(mode, refusal):
        if mode == "auto" and comps.device.type == "cuda":
            log.info(f"CUDA graphs off ({refusal})")
        return None
    log.info("CUDA graphs on: each batch shape is captured on its second micro-step, then replayed")
    scale = 1.0 / int(cfg.optim.grad_accum)
    return StepGraphs(loss_fn, tr.params, backward_scale=scale, ops=comps.backbone.ops)


def resume_point(resume: str, ckpt_root: Path) -> Path | None:
    """The checkpoint RESUME names; None for a fresh start ('latest' with none yet)."""
    if not resume:
        return None
    try:
        path = resolve_checkpoint(ckpt_root, resume)
    except CheckpointError as e:
        raise ConfigError("RESUME", str(e)) from e
    if path is None:
        if resume == "latest":
            log.info(f"RESUME='latest': no checkpoint under {ckpt_root}, starting fresh")
            return None
        raise ConfigError("RESUME", f"no checkpoint at '{resume}'")
    return path


def _checked(failed: list, fn, *args) -> None:
    """fn(*args), an ExportMismatch kept in `failed` instead of aborting the checkpoint being written."""
    try:
        fn(*args)
    except ExportMismatch as e:
        failed.append(e)

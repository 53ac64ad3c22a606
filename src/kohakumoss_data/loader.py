"""Loader: worker processes decode and resize planned items; a feeder thread builds HostBatches into a
bounded prefetch queue. Caches are read first; only misses reach the encoders (online write-back).

What a step contains depends only on the plan, never on the worker count or timing.

Stopping is bounded: every wait on a worker checks the stop, and the pool is shut down without joining a
worker that is still busy (`stop_pool`): past a grace period it is terminated. A loader nobody closed
is stopped the same way when the interpreter exits, before concurrent.futures joins its workers.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import signal
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass

import torch

from kohakumoss_common.errors import DataError
from kohakumoss_common.log import get_logger

from .batch import HostBatch
from .cache import SHARD_ITEMS, TensorCache
from .cache_keys import latent_cache_identity, latent_key, text_cache_identity
from .catalog import Catalog
from .encode import (
    WRITE_BACK,
    PromptReference,
    caption_embeddings,
    encode_images,
    reference_reader,
    references_in_prompt,
)
from .masks import missing_masks
from .plan import Plan, reference_item
from .protocols import ImageEncoder, TextEncoder
from .sources.base import Source
from .transform import to_chw
from .worker import ItemResult, ItemTask, init_worker, run_task

_DONE = object()
FEEDER_WAIT_S = 30.0  # a stop waits this long for the feeder thread (mid-encode) before leaving it
_POLL_S = 0.1
log = get_logger(__name__)


@dataclass
class LoaderKnobs:
    workers: int = 2
    prefetch_steps: int = 2
    write_back: bool = WRITE_BACK  # online mode: encode a miss in the step and store it
    pin_memory: bool | None = None  # None: pin when CUDA is available
    start_method: str | None = None  # None: fork on Linux, spawn elsewhere (Windows, macOS)
    stop_grace_s: float = 5.0  # on a stop, a worker still busy after this long is terminated


def open_caches(
    cache_dir: str | None,
    image_encoder: ImageEncoder | None,
    text_encoder: TextEncoder | None,
    shard_items: int = SHARD_ITEMS,
) -> tuple[TensorCache | None, TensorCache | None]:
    """The latent and text caches under `cache_dir` for these encoders (None without a dir or encoder):
    the trainer and the data scripts (scripts/data/cache_*.py) open them here, so their identities agree."""
    if cache_dir is None:
        return None, None
    latents = (
        TensorCache(cache_dir, latent_cache_identity(image_encoder.identity), shard_items)
        if image_encoder
        else None
    )
    texts = (
        TensorCache(
            cache_dir,
            text_cache_identity(text_encoder.identity, text_encoder.template, text_encoder.layer_choice),
            shard_items,
        )
        if text_encoder
        else None
    )
    return latents, texts


def _close_to_submits(pool: Executor) -> tuple[list, threading.Thread | None]:
    """Mark `pool` shut and return its workers and manager thread, both under the lock a first submit forks
    the workers in: a submit racing the stop (the feeder thread, while `Loader.close()` runs in another)
    then either forked before, and its workers are stopped with the rest, or raises; it never forks
    workers nobody stops, whose join at the interpreter's exit could wait forever."""
    # ProcessPoolExecutor's fields, 3.8 to 3.14 (3.14 adds terminate_workers())
    lock = getattr(pool, "_shutdown_lock", None) or contextlib.nullcontext()
    with lock:
        if hasattr(pool, "_shutdown_thread"):
            pool._shutdown_thread = True
            pool._cancel_pending_futures = True
        procs = list((getattr(pool, "_processes", None) or {}).values())
        manager = getattr(pool, "_executor_manager_thread", None)  # shutdown() drops the reference
    return procs, manager


def stop_pool(pool: Executor, grace_s: float = LoaderKnobs.stop_grace_s, warn: bool = True) -> int:
    """Shut `pool` down without waiting on a stuck worker: queued tasks are cancelled, running ones get
    `grace_s` to finish, then their workers are terminated (killed 2 s later). Returns how many were.
    `warn`: say so as a warning (a stuck read is worth knowing); off for a Ctrl-C or the interpreter's exit.

    `shutdown(wait=True)` and the interpreter's exit join every worker with no timeout, so one worker that
    never returns (a read on a hung mount, a lock a fork copied held) would hang a stop forever. Workers
    only read (results are assembled and cached in the parent), so ending one mid-task loses nothing.
    """
    procs, manager = _close_to_submits(pool)
    pool.shutdown(wait=False, cancel_futures=True)
    deadline = time.monotonic() + grace_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    busy = [p for p in procs if p.is_alive()]
    for p in busy:
        p.kill()  # workers ignore SIGTERM (a scheduler sends it to the whole group while the parent saves)
    for p in busy:
        p.join(2.0)
    if manager is not None:
        # its exit closes its wake-up pipe, which the interpreter's exit hook (concurrent.futures) would
        # otherwise write to at the same moment: "Bad file descriptor" at exit (Python 3.11)
        manager.join(2.0)
    if busy:
        (log.warning if warn else log.debug)(
            f"terminated {len(busy)} loader worker(s) still busy after {grace_s:.1f} s "
            f"(pids {', '.join(str(p.pid) for p in busy)})"
        )
    return len(busy)


_live: weakref.WeakSet[Loader] = weakref.WeakSet()
_exit_hook = False


def _stopping_quietly() -> bool:
    """A stop during Ctrl-C or an abandoned iteration: the user hears one line, and a reader ended mid-task
    loses nothing, so its termination is not reported as a warning."""
    return isinstance(sys.exc_info()[1], (KeyboardInterrupt, GeneratorExit))


def _stop_live_loaders() -> None:
    for loader in list(_live):
        loader.close(quiet=True)  # the process is ending: its workers go with it, nothing to report


def _stop_at_exit() -> None:
    """Once: stop every live loader when the interpreter exits, before concurrent.futures joins workers.

    threading's exit callbacks run newest first, so this one (registered after concurrent.futures.process
    registered its join) runs before that join; atexit's handlers would run after it, too late.
    """
    global _exit_hook
    register = getattr(threading, "_register_atexit", None)
    if not _exit_hook and register is not None:
        register(_stop_live_loaders)
        _exit_hook = True


def _block_sigint() -> None:
    """Block Ctrl-C and SIGTERM in this (non-main) thread: processes forked from it start with them blocked,
    so a signal before a worker's initializer ignores it cannot print a worker traceback or end it (Python handles
    signals in the main thread whatever thread the kernel picks)."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})


def _put(out: queue.Queue, item: object, stop: threading.Event) -> bool:
    """Queue `item` unless stopped first (the consumer may be gone, its queue full)."""
    while not stop.is_set():
        try:
            out.put(item, timeout=_POLL_S)
            return True
        except queue.Full:
            continue
    return False


def _results(futures: list, stop: threading.Event) -> list[ItemResult] | None:
    """The step's item results in order, or None once stopped (never blocks on one worker)."""
    waiting = [f for f in futures if isinstance(f, Future)]
    while waiting:
        if stop.is_set():
            return None
        waiting = list(wait(waiting, timeout=_POLL_S).not_done)
    return [f.result() if isinstance(f, Future) else f for f in futures]


def worker_pool(
    workers: int, source: Source, cache: TensorCache | None, start_method: str | None = None
) -> Executor | None:
    """Worker processes holding their own copy of the source (None: work in this process)."""
    if workers <= 0:
        return None
    method = start_method or ("fork" if sys.platform.startswith("linux") else "spawn")
    return ProcessPoolExecutor(
        workers, mp.get_context(method), initializer=init_worker, initargs=(source, cache, os.getpid())
    )


class Loader:
    """Iterate HostBatches for `plan.steps[start_step:]`."""

    def __init__(
        self,
        plan: Plan,
        catalog: Catalog,
        source: Source,
        image_encoder: ImageEncoder | None = None,
        text_encoder: TextEncoder | None = None,
        latent_cache: TensorCache | None = None,
        text_cache: TensorCache | None = None,
        knobs: LoaderKnobs | None = None,
        start_step: int = 0,
    ):
        if not 0 <= start_step <= len(plan.steps):
            raise DataError(f"start_step {start_step} is outside the plan (0..{len(plan.steps)})")
        if plan.catalog != catalog.fingerprint():
            raise DataError("the plan was built from another catalog (fingerprints differ); rebuild the plan")
        missing = missing_masks([it for step in plan.steps[start_step:] for it in step])
        if missing:
            shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            raise DataError(f"dataset mask: {len(missing)} mask file(s) missing: {shown}")
        self.plan, self.source = plan, source
        self.locators = {it.key: it.locator for it in catalog.usable}
        self.reference_locators = {it.key: [r["locator"] for r in it.references] for it in catalog.usable}
        self.image_encoder, self.text_encoder = image_encoder, text_encoder
        self.latent_cache, self.text_cache = latent_cache, text_cache
        self.knobs = knobs or LoaderKnobs()
        self.start_step = start_step
        self.pin = torch.cuda.is_available() if self.knobs.pin_memory is None else self.knobs.pin_memory
        self._runs: dict[int, tuple[threading.Event, Executor | None]] = {}  # live iterations

    def tasks(self, step: int) -> list[ItemTask]:
        vae = self.image_encoder.identity if self.image_encoder is not None else None
        return [
            ItemTask(
                self.locators[it.key],
                it,
                latent_key(it, vae) if vae and self.latent_cache is not None else None,
                self.plan.knobs.patch_px,
            )
            for it in self.plan.steps[step]
        ]

    def reference_tasks(self, step: int) -> list[tuple[int, ItemTask]]:
        """(owner's place in the step, task) of every reference of the step's items, in order."""
        vae = self.image_encoder.identity if self.image_encoder is not None else None
        out = []
        for i, it in enumerate(self.plan.steps[step]):
            for ref, locator in zip(it.references, self.reference_locators[it.key]):
                as_item = reference_item(it, ref)
                key = latent_key(as_item, vae) if vae and self.latent_cache is not None else None
                out.append((i, ItemTask(locator, as_item, key, self.plan.knobs.patch_px, reference=True)))
        return out

    def all_tasks(self, step: int) -> list[ItemTask]:
        """The step's items, then their references (the order `build` reads results in)."""
        return self.tasks(step) + [t for _, t in self.reference_tasks(step)]

    def _submit(self, pool: Executor | None, step: int) -> list[Future[ItemResult] | ItemResult]:
        if pool is None:
            return [run_task(t, self.source, self.latent_cache) for t in self.all_tasks(step)]
        return [pool.submit(run_task, t) for t in self.all_tasks(step)]

    def _latents(self, tasks: list[ItemTask], results: list[ItemResult]) -> tuple[list[torch.Tensor], int]:
        """Worker hits, then hits written since the workers' index was read, then the encoder."""
        out: list[torch.Tensor | None] = [r.latent for r in results]
        hits = sum(1 for r in results if r.latent is not None)
        misses = []
        for i, task in enumerate(tasks):
            if out[i] is None and self.latent_cache is not None and task.latent_key in self.latent_cache:
                out[i] = self.latent_cache.get(task.latent_key)  # None: its shard was found broken
            if out[i] is None:
                misses.append(i)
            elif results[i].latent is None:
                hits += 1
        encoded = encode_images(self.image_encoder, [to_chw(results[i].pixels) for i in misses])
        for i, latent in zip(misses, encoded):
            out[i] = latent
            if self.latent_cache is not None and self.knobs.write_back:
                self.latent_cache.put(tasks[i].latent_key, latent)
        return out, hits  # type: ignore[return-value]

    def build(self, step: int, results: list[ItemResult]) -> HostBatch:
        """Assemble one step from its item results, then its references' (`all_tasks`; main process: the
        encoders live here)."""
        items = self.plan.steps[step]
        tasks, owners = self.tasks(step), self.reference_tasks(step)
        all_tasks, all_results = tasks + [t for _, t in owners], results
        results = all_results[: len(tasks)]
        batch = HostBatch(
            step, [it.key for it in items], [it.caption for it in items], [it.target for it in items]
        )
        if any(it.mask for it in items):
            batch.masks = [
                torch.from_numpy(r.mask) if r.mask is not None else torch.ones(h // 16, w // 16)
                for r, (w, h) in zip(results, batch.sizes)
            ]
        if any(it.loss_weight != 1.0 for it in items):
            batch.loss_weights = [it.loss_weight for it in items]
        if self.image_encoder is not None:
            latents, batch.hits["latent"] = self._latents(all_tasks, all_results)
            batch.latents = latents[: len(tasks)]
        else:
            latents = [to_chw(r.pixels) for r in all_results]
            batch.pixels = latents[: len(tasks)]
        if owners:
            per_sample: list[list[torch.Tensor]] = [[] for _ in items]
            for (owner, _), tensor in zip(owners, latents[len(tasks) :]):
                per_sample[owner].append(tensor)
            batch.reference_sizes = [[r.target for r in it.references] for it in items]
            if self.image_encoder is not None:
                batch.references = per_sample
            else:
                batch.reference_pixels = per_sample
        if self.text_encoder is not None:
            batch.text_hidden, batch.text_lengths, batch.hits["text"] = caption_embeddings(
                batch.captions,
                self.text_encoder,
                self.text_cache,
                self.knobs.write_back,
                self.plan.knobs.max_text_tokens,
                self.prompt_references(items) if references_in_prompt(self.text_encoder) else None,
            )
        return batch.pin_memory() if self.pin else batch

    def prompt_references(self, items: list) -> list[list[PromptReference]]:
        """Per item, its references as the text encoder's prompt takes them: (content hash, a reader of the
        whole image, called only on a text-cache miss)."""

        return [
            [
                (ref.hash, reference_reader(self.source, loc))
                for ref, loc in zip(it.references, self.reference_locators[it.key])
            ]
            for it in items
        ]

    def _produce(self, out: queue.Queue, stop: threading.Event, pool: Executor | None) -> None:
        """Feeder thread: keep steps in flight in the workers, assemble them in order, queue them."""
        _block_sigint()
        ahead = max(1, self.knobs.prefetch_steps, self.knobs.workers)
        pending: deque[tuple[int, list]] = deque()
        try:
            for step in range(self.start_step, len(self.plan.steps)):
                if stop.is_set():
                    return
                pending.append((step, self._submit(pool, step)))
                if len(pending) >= ahead:
                    self._emit(pending.popleft(), out, stop)
            while pending and not stop.is_set():
                self._emit(pending.popleft(), out, stop)
            self.flush()
            _put(out, _DONE, stop)
        except BaseException as e:  # handed to the consumer, which re-raises it
            _put(out, e, stop)
        finally:
            self.flush()  # written-back entries survive an early stop

    def _emit(self, entry: tuple[int, list], out: queue.Queue, stop: threading.Event) -> None:
        step, futures = entry
        results = _results(futures, stop)
        if results is not None:
            _put(out, self.build(step, results), stop)

    def flush(self) -> None:
        for cache in (self.latent_cache, self.text_cache):
            if cache is not None:
                cache.flush()

    def close(self, quiet: bool = False) -> None:
        """Stop every iteration of this loader (from any thread): its consumer's next() ends the iteration,
        its workers are shut down, a busy one terminated after `stop_grace_s` (logged unless `quiet`)."""
        for key, (stop, pool) in list(self._runs.items()):
            stop.set()
            if pool is not None:
                stop_pool(pool, self.knobs.stop_grace_s, warn=not (quiet or _stopping_quietly()))
            self._runs.pop(key, None)

    def __iter__(self) -> Iterator[HostBatch]:
        out: queue.Queue = queue.Queue(maxsize=max(1, self.knobs.prefetch_steps))
        stop = threading.Event()
        # made here, forked from the feeder thread at its first submit
        pool = worker_pool(self.knobs.workers, self.source, self.latent_cache, self.knobs.start_method)
        key = id(stop)
        self._runs[key] = (stop, pool)
        if pool is not None:
            _live.add(self)
            _stop_at_exit()
        thread = threading.Thread(
            target=self._produce, args=(out, stop, pool), name="kohakumoss-loader", daemon=True
        )
        thread.start()
        try:
            while True:
                try:
                    item = out.get(timeout=_POLL_S)
                except queue.Empty:
                    if stop.is_set():  # Loader.close() from another thread
                        return
                    continue
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            deadline = time.monotonic() + FEEDER_WAIT_S
            while thread.is_alive() and time.monotonic() < deadline:
                try:
                    out.get_nowait()
                except queue.Empty:
                    thread.join(0.05)
            if thread.is_alive():
                log.warning(
                    f"the loader's feeder thread is still busy after {FEEDER_WAIT_S:.0f} s; left behind"
                )
            if pool is not None:
                stop_pool(pool, self.knobs.stop_grace_s, warn=not _stopping_quietly())
            self._runs.pop(key, None)

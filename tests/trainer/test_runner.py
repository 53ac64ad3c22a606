"""The shared step runner, the batch prefetcher and the card cap (CPU)."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from kohakumoss.train.components import cap_to_card
from kohakumoss.train.prefetch import Prefetcher
from kohakumoss.train.step import to_device_batch
from kohakumoss_common.errors import DataError
from kohakumoss_data.batch import HostBatch


def host_batch(step: int, sizes=((4, 6), (2, 2)), text=(3, 5), dim=8) -> HostBatch:
    g = torch.Generator().manual_seed(step)
    latents = [torch.randn(32, h, w, generator=g) for h, w in sizes]
    return HostBatch(
        step,
        [f"k{step}"],
        ["c"],
        [(8 * w, 8 * h) for h, w in sizes],
        latents,
        None,
        torch.randn(sum(text), dim, generator=g),
        torch.tensor(text),
    )


def same_batch(a, b) -> None:
    assert torch.equal(a.x0, b.x0) and torch.equal(a.text, b.text)
    assert a.seq.text_lens == b.seq.text_lens and a.seq.img_sizes == b.seq.img_sizes
    for x, y in zip(a.seq.tensors(), b.seq.tensors()):
        assert torch.equal(x, y)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefetcher_gives_the_loaders_batches_in_order_as_the_direct_path_does(dtype):
    batches = [host_batch(i) for i in range(5)]
    with Prefetcher(iter(batches), torch.device("cpu"), dtype, ahead=2) as pre:
        got = [pre.next_batch() for _ in range(5)]
        with pytest.raises(DataError, match="ran out of steps at micro-step 5"):
            pre.next_batch()
    for b, g in zip(batches, got):
        same_batch(g, to_device_batch(b, torch.device("cpu"), dtype))


def test_prefetcher_raises_the_loaders_error_in_the_training_thread():
    def loader():
        yield host_batch(0)
        raise DataError("shard.tar: cut in the middle")

    with Prefetcher(loader(), torch.device("cpu"), torch.float32) as pre:
        pre.next_batch()
        with pytest.raises(DataError, match="shard.tar"):
            pre.next_batch()


def test_prefetcher_works_ahead_and_close_stops_its_thread():
    taken = []

    def loader():
        for i in range(100):
            taken.append(i)
            yield host_batch(i)

    pre = Prefetcher(loader(), torch.device("cpu"), torch.float32, ahead=2)
    deadline = time.time() + 10
    while len(taken) < 3 and time.time() < deadline:  # two queued, a third waiting for room
        time.sleep(0.01)
    time.sleep(0.1)
    assert len(taken) == 3  # bounded: never more than `ahead` batches (+ the one in hand) prepared
    pre.close()
    assert not pre.thread.is_alive()
    assert not [t for t in threading.enumerate() if t.name == "prefetch" and t.is_alive()]


def test_closing_the_prefetcher_closes_its_loader_even_while_a_read_hangs():
    """A loader (an iterable with close(), as kohakumoss_data's Loader) is closed from the training thread,
    so a worker stuck in a read stops with the run instead of at interpreter exit."""
    released = threading.Event()

    class HangingLoader:
        closed = False

        def __iter__(self):
            yield host_batch(0)
            released.wait(30)  # a read on a hung mount, until close() gives up on it
            return

        def close(self):
            self.closed = True
            released.set()

    source = HangingLoader()
    pre = Prefetcher(source, torch.device("cpu"), torch.float32)
    pre.next_batch()
    t0 = time.time()
    pre.close()
    assert source.closed and time.time() - t0 < 10 and not pre.thread.is_alive()


def test_card_gb_caps_the_process_below_the_card(monkeypatch):
    calls = []

    class Props:
        total_memory = 140 * 2**30

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: Props)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, i: calls.append((f, i)))
    cuda = torch.device("cuda")
    assert cap_to_card(24.0, cuda) == 24.0
    assert calls == [(24 / 140, 0)]
    assert cap_to_card(0.0, cuda) is None  # 0: the whole card
    assert cap_to_card(200.0, cuda) is None  # above the card: nothing to cap
    assert cap_to_card(24.0, torch.device("cpu")) is None
    assert len(calls) == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_prefetcher_on_cuda_copies_pinned_batches_on_its_stream_and_the_step_sees_them():
    cuda = torch.device("cuda")
    batches = [host_batch(i, sizes=((64, 64), (32, 48)), text=(200, 17), dim=4096) for i in range(6)]
    with Prefetcher(iter(batches), cuda, torch.bfloat16) as pre:
        got = []
        for _ in range(6):
            b = pre.next_batch()
            torch.cuda._sleep(1_000_000)  # the step's work, still running when the next copy is queued
            got.append(b)
        torch.cuda.synchronize()
    for b, g in zip(batches, got):
        want = to_device_batch(b, cuda, torch.bfloat16)
        assert g.x0.device.type == "cuda"
        same_batch(g, want)


def test_text_pad_on_cuda_for_every_single_process_step():
    """Graphed steps pad (one graph per bucket); eager CUDA steps too (kernels kept across captions); not
    the CPU, nor a pipeline, which cuts its batches by sample."""
    from kohakumoss.train.graphs import TEXT_PAD
    from kohakumoss.train.trainer import text_pad

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert text_pad(cuda, graphed=True, pipeline=False) == TEXT_PAD
    assert text_pad(cuda, graphed=False, pipeline=False) == TEXT_PAD
    assert text_pad(cuda, graphed=False, pipeline=True) == 0
    assert text_pad(cpu, graphed=False, pipeline=False) == 0


class RankHooks:
    """What a distributed rank's share hangs on its loss (distributed/rank_run.py RankRun.step_fn)."""

    def __init__(self):
        self.calls: list = []

    def graphed(self, on: bool) -> None:
        self.calls.append(("graphed", on))

    def before_micro(self, micro_step: int, batch, sigma, noise):
        self.calls.append(("before", micro_step))
        return sigma * 0 + 0.5, noise  # the rank's cut of the whole step's sigmas

    def after_micro(self, loss):
        self.calls.append("after")
        return loss

    def after_backward(self) -> None:
        self.calls.append("reduce")


def test_the_runner_tells_a_ranks_hooks_each_micro_step_and_uses_their_sigmas():
    """A run resumed at step 3 with GRAD_ACCUM=2: the hooks hear micro-steps 6-9 by number (a rank cuts the
    whole step's noise by it), the loss reads the sigmas they return, the gradients are reduced once a step."""
    from kohakumoss.memory.engines.optimizer import PlacedOptimizer
    from kohakumoss.optim.combined import CombinedOptimizer
    from kohakumoss.train.runner import StepRunner

    w = torch.nn.Parameter(torch.ones(()))
    seen = []

    def loss(batch, sigma, noise):
        seen.append(float(sigma.mean()))
        return w * sigma.mean()

    hooks = loss.hooks = RankHooks()
    batches = iter([to_device_batch(host_batch(i), torch.device("cpu"), torch.float32) for i in range(4)])
    optimizer = PlacedOptimizer(CombinedOptimizer({"sgd": torch.optim.SGD([w], lr=0.1)}), "gpu")
    runner = StepRunner(optimizer, loss, lambda: next(batches), device=torch.device("cpu"), seed=0, accum=2)
    for step in (3, 4):
        assert runner.run(step).finite
    micro = [[("before", m), "after"] for m in (6, 7, 8, 9)]
    assert hooks.calls == [("graphed", False), *micro[0], *micro[1], "reduce", *micro[2], *micro[3], "reduce"]
    assert seen == [0.5] * 4

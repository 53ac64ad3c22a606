"""CUDA graph capture: a failed capture leaves the current stream as it was and later captures replay;
the torch-only backends the graphed step times can be captured."""

from __future__ import annotations

import pytest
import torch

from kohakumoss_kernels.runtime.capture import capture

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _fail_capture(device: torch.device) -> None:
    graph = torch.cuda.CUDAGraph()
    x = torch.ones(1024, device=device)
    with pytest.raises(Exception), capture(graph, device):  # noqa: B017 (torch raises different types per version)
        y = x * 2
        y.sum().item()  # a host read: invalidates the capture


def test_a_capture_after_a_failed_one_replays():
    device = torch.device("cuda")
    _fail_capture(device)
    # the generator left capture mode (torch 2.11 raised 'Offset increment outside graph capture' here)
    a, b = torch.randn(4, device=device), torch.randn(4, device=device)
    assert not torch.equal(a, b)
    torch.cuda.empty_cache()  # the allocator's pool counts stayed right (a double release asserts here)
    x = torch.arange(8.0, device=device)
    graph = torch.cuda.CUDAGraph()
    with capture(graph, device):
        y = x * 3
    x.copy_(torch.ones(8, device=device))
    graph.replay()
    torch.testing.assert_close(y, torch.full((8,), 3.0, device=device))


def test_a_failed_capture_frees_its_pool():
    """A capture that fails after allocating gives its pool back: after empty_cache nothing stays reserved
    (before, the cleanup asked the failed graph for its pool, which raised, and the pool leaked: 4 GiB
    in a capped first step whose timing captures failed)."""
    device = torch.device("cuda")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved()
    graph = torch.cuda.CUDAGraph()
    x = torch.ones(1024, device=device)
    with pytest.raises(Exception), capture(graph, device):  # noqa: B017
        y = torch.empty(256 << 20, dtype=torch.uint8, device=device)  # 256 MiB in the graph's pool
        (x * 2).sum().item()
    del graph, y
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() - before < 64 << 20


def test_the_onehot_backends_capture():
    """F.one_hot checks its indices on the host; per_token.one_hot must not (the graphed step times it)."""
    from kohakumoss_kernels.registry import backend_fn

    device = torch.device("cuda")
    x = torch.randn(300, 64, device=device, dtype=torch.bfloat16)
    shift, scale = (torch.randn(3, 64, device=device, dtype=torch.bfloat16) for _ in range(2))
    token_sample = torch.tensor([0] * 100 + [1] * 150 + [2] * 50, device=device)
    fn = backend_fn("norm_modulate", "onehot")
    want = fn(x, shift, scale, token_sample)
    graph = torch.cuda.CUDAGraph()
    with capture(graph, device):
        out = fn(x, shift, scale, token_sample)
    graph.replay()
    torch.testing.assert_close(out, want)


def test_the_onehot_backends_time_as_graphs():
    """The graphed step's tuning times each candidate, forward and backward, inside a capture
    (`tuning.time_call(device_time=True)`); the onehot backends failed it in a capped trainer run."""
    from kohakumoss_kernels import tuning
    from kohakumoss_kernels.registry import backend_fn

    device = torch.device("cuda")
    x = torch.randn(4096, 256, device=device, dtype=torch.bfloat16, requires_grad=True)
    shift, scale = (torch.randn(2, 256, device=device, requires_grad=True) for _ in range(2))
    token_sample = torch.tensor([0] * 1000 + [1] * 3096, device=device)
    fn = backend_fn("norm_modulate", "onehot")
    try:
        assert tuning.time_call(fn, (x, shift, scale, token_sample), {}, device_time=True) > 0
    finally:
        tuning.release_timing_pools()

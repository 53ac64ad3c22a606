"""A failed CUDA graph capture leaves the allocator and the current stream as they were."""

from __future__ import annotations

import pytest
import torch

from kohakumoss_kernels.capture import capture

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
GIB = 2**30


def _fail_capture(device: torch.device) -> None:
    graph = torch.cuda.CUDAGraph()
    x = torch.ones(1024, device=device)
    with pytest.raises(Exception), capture(graph, device):  # noqa: B017 (torch raises different types per version)
        y = x * 2
        y.sum().item()  # a host read: invalidates the capture


def test_after_a_failed_capture_the_allocator_still_frees_its_cache_to_fit_an_allocation():
    device = torch.device("cuda", torch.cuda.current_device())
    stream = torch.cuda.current_stream(device)
    _fail_capture(device)
    assert torch.cuda.current_stream(device) == stream  # the capture's side stream did not stay current
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_reserved(device) + 3 * GIB) / total, device)
    try:
        a = torch.empty(2 * GIB, dtype=torch.uint8, device=device)
        del a  # cached, not returned: a block of 2 GiB
        b = torch.empty(int(2.5 * GIB), dtype=torch.uint8, device=device)  # fits only if the cache is freed
        del b
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
        torch.cuda.empty_cache()


def test_a_capture_after_a_failed_one_replays():
    device = torch.device("cuda")
    _fail_capture(device)
    x = torch.arange(8.0, device=device)
    graph = torch.cuda.CUDAGraph()
    with capture(graph, device):
        y = x * 3
    x.copy_(torch.ones(8, device=device))
    graph.replay()
    torch.testing.assert_close(y, torch.full((8,), 3.0, device=device))

"""side_stream: work handed to `run` inside an `overlap` window goes to a side stream of the GPU and is
joined before the window ends; outside one (or on a CPU) it runs in place. The LoRA ops give the same
.grad either way (on the GPU: eager, and captured in the trainer's graphs, tests/trainer)."""

from __future__ import annotations

import pytest
import torch

from kohakumoss_kernels import grad_sink, side_stream
from kohakumoss_kernels.ops.lora_group.addmm import lora_group
from kohakumoss_kernels.ops.lora_linear.addmm import lora_linear

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_outside_a_window_or_on_a_cpu_run_calls_in_place():
    calls = []
    side_stream.run(torch.device("cpu"), lambda: calls.append(1), ())
    with side_stream.overlap("cpu") as window:
        assert window is None and not side_stream.active(torch.device("cpu"))
        side_stream.run(torch.device("cpu"), lambda: calls.append(2), ())
    assert calls == [1, 2]


def _lora_grads(device, overlap: bool, group: bool) -> list[torch.Tensor]:
    """The LoRA masters' .grad after one backward with grad_sink (and the side stream when `overlap`)."""
    g = torch.Generator().manual_seed(0)
    T, d, r = 300, 64, 8
    x = torch.randn(T, d, generator=g).to(device)
    ws = [(torch.randn(d, d, generator=g) * d**-0.5).to(device) for _ in range(3)]
    downs = [(torch.randn(r, d, generator=g) * 0.1).to(device).requires_grad_(True) for _ in range(3)]
    ups = [(torch.randn(d, r, generator=g) * 0.1).to(device).requires_grad_(True) for _ in range(3)]
    masters = downs + ups
    for m in masters:
        m.grad = torch.zeros_like(m)
    with grad_sink.into(masters), side_stream.overlap(device, overlap):
        if group:
            outs = lora_group(x, ws, [None] * 3, downs, ups, [0.5] * 3)
        else:
            outs = [lora_linear(x, w, None, dn, up, 0.5) for w, dn, up in zip(ws, downs, ups, strict=True)]
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
    return [m.grad.clone() for m in masters]


@pytest.mark.parametrize("group", [False, True])
def test_lora_grads_unchanged_by_a_window_on_the_cpu(group):
    cpu = torch.device("cpu")
    for a, b in zip(_lora_grads(cpu, True, group), _lora_grads(cpu, False, group), strict=True):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("group", [False, True])
def test_lora_grads_on_a_side_stream_match(group):
    gpu = torch.device("cuda")
    before = side_stream.launches
    aside = _lora_grads(gpu, True, group)
    assert side_stream.launches > before  # the weight gradients went to the side stream
    for a, b in zip(aside, _lora_grads(gpu, False, group), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("runs", [0, 1, 3])
def test_a_window_is_captured_in_a_cuda_graph(runs):
    """The window forks the side stream from the capture and joins it back (an empty window waits for
    nothing: waiting on a stream that never joined the capture would invalidate it)."""
    gpu = torch.device("cuda")
    side_stream.stream_for(gpu)  # before the capture
    x = torch.ones(4096, device=gpu)
    out = torch.zeros_like(x)

    def body():
        for i in range(runs):
            y = x * (i + 2)
            side_stream.run(gpu, lambda y=y: out.add_(y), (y,))

    warm = torch.cuda.Stream(gpu)
    warm.wait_stream(torch.cuda.current_stream(gpu))
    with torch.cuda.stream(warm), side_stream.overlap(gpu):
        body()
    torch.cuda.current_stream(gpu).wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), side_stream.overlap(gpu):
        body()
    x.fill_(3.0)
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, torch.full_like(out, 3.0 * sum(i + 2 for i in range(runs))))

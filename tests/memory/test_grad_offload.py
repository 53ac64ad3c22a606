"""GradOffload: the host fp32 sums equal the plain path's accumulated grads; the device grads are freed."""

from __future__ import annotations

import pytest
import torch

from kohakumoss.memory.engines.grad_offload import GradOffload
from kohakumoss_common.errors import ConfigError

from .test_optimizer_placement import make_model, micro_loss

MICRO = 3


def trainable(model) -> list[torch.nn.Parameter]:
    return [p for n, p in model.named_parameters() if not n.startswith("unused")] + [model.unused.weight]


def plain_micro_grads(
    device: str = "cpu", dtype: torch.dtype = torch.float32
) -> list[list[torch.Tensor | None]]:
    """Per micro-step, each param's grad (taken alone, in the param's dtype)."""
    model = make_model(device=device, dtype=dtype)
    out = []
    for micro in range(MICRO):
        (micro_loss(model, 0, micro) / MICRO).backward()
        out.append([None if p.grad is None else p.grad.clone() for p in trainable(model)])
        model.zero_grad(set_to_none=True)
    return out


def expected_sums(micro_grads) -> list[torch.Tensor | None]:
    sums = []
    for grads in zip(*micro_grads, strict=True):
        if grads[0] is None:
            sums.append(None)
            continue
        total = torch.zeros(grads[0].shape, dtype=torch.float32)
        for g in grads:
            total += g.float().cpu()
        sums.append(total)
    return sums


def offloaded_sums(device: str = "cpu", dtype: torch.dtype = torch.float32, ring: int = 4):
    model = make_model(device=device, dtype=dtype)
    params = trainable(model)
    offload = GradOffload(params, ring=ring)
    for micro in range(MICRO):
        (micro_loss(model, 0, micro) / MICRO).backward()
        assert all(p.grad is None for p in params)  # freed on the device as soon as it was copied
    sums = offload.host_grads()
    assert offload.pending_bytes == 0
    return model, params, offload, sums


def test_sums_equal_the_plain_accumulated_grads():
    ref = make_model()
    for micro in range(MICRO):
        (micro_loss(ref, 0, micro) / MICRO).backward()
    _, params, offload, sums = offloaded_sums()
    assert len(sums) == len(params)
    named = [(n, p) for n, p in ref.named_parameters() if not n.startswith("unused")]
    for (n, p), s in zip(named, sums[:-1], strict=True):
        assert s.dtype == torch.float32 and s.device.type == "cpu"
        torch.testing.assert_close(s, p.grad, atol=1e-7, rtol=1e-6, msg=n)
    assert offload.received == [True] * (len(params) - 1) + [False]
    assert not sums[-1].any()  # no grad arrived for the unused weight
    offload.remove()


def test_zero_and_remove():
    model, params, offload, sums = offloaded_sums()
    assert any(s.abs().sum() > 0 for s in sums)
    offload.zero()
    assert all(not s.any() for s in offload.host_grads())
    assert not any(offload.received)
    micro_loss(model, 1, 0).backward()  # sums start again from zero: the first grad overwrites
    again = [s.clone() for s in offload.host_grads()]
    ref = make_model()
    micro_loss(ref, 1, 0).backward()
    for s, p in zip(again, trainable(ref), strict=True):
        torch.testing.assert_close(s, torch.zeros_like(s) if p.grad is None else p.grad, atol=0, rtol=0)
    assert any(s.abs().sum() > 0 for s in again)
    offload.remove()
    micro_loss(model, 1, 0).backward()  # unhooked: the grads stay on the params, the sums do not move
    assert params[0].grad is not None
    for s, before in zip(offload.host_grads(), again, strict=True):
        torch.testing.assert_close(s, before, atol=0, rtol=0)


def test_bad_setups_are_refused():
    model = make_model()
    with pytest.raises(ConfigError, match="GRAD_OFFLOAD"):
        GradOffload(list(model.parameters()), ring=0)
    p = next(model.parameters())
    with pytest.raises(ConfigError, match="twice"):
        GradOffload([p, p])


def test_bf16_grads_sum_in_fp32_on_the_cpu():
    """The first grad of a step is copied, later ones widened to fp32 and added: the exact fp32 sums."""
    want = expected_sums(plain_micro_grads("cpu", torch.bfloat16))
    _, params, offload, sums = offloaded_sums("cpu", torch.bfloat16)
    for s, w in zip(sums, want, strict=True):
        assert s.dtype == torch.float32
        torch.testing.assert_close(s, torch.zeros_like(s) if w is None else w, atol=0, rtol=0)
    assert offload._scratch.numel() > 0  # the widened path ran
    offload.remove()


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("ring", [1, 2, 8])
def test_cuda_sums_equal_the_per_micro_step_grads(dtype, ring):
    # the same fp32 adds in the same order; the tolerance only covers a non-deterministic device kernel
    want = expected_sums(plain_micro_grads("cuda", dtype))
    _, params, offload, sums = offloaded_sums("cuda", dtype, ring)
    for s, w in zip(sums, want, strict=True):
        assert s.is_pinned()
        if w is None:
            assert not s.any()
        else:
            torch.testing.assert_close(s, w, atol=1e-6, rtol=1e-5)
    offload.remove()

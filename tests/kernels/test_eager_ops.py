"""The references and torch-native backends on the CPU: fused ops equal their unfused composition,
SDPA-over-runs equals the loop, and the compare harness itself can fail."""

from __future__ import annotations

import pytest
import torch

from kohakumoss_kernels.ops.varlen_attention import sdpa_groups
from kohakumoss_kernels.registry import eager_op

from .cases import compare, compare_shuffled, make_inputs


def test_residual_norm_modulate_equals_its_parts():
    x, y, gate, shift, scale, ts, eps = make_inputs("residual_norm_modulate", [3, 4], torch.float32, "cpu")[0]
    r, h = eager_op("residual_norm_modulate")(x, y, gate, shift, scale, ts, eps)
    torch.testing.assert_close(r, eager_op("gated_residual")(x, y, gate, ts))
    torch.testing.assert_close(h, eager_op("norm_modulate")(r, shift, scale, ts, eps))


def test_qk_norm_rope_equals_its_parts():
    x, w, cos, sin, eps = make_inputs("qk_norm_rope", [5], torch.float32, "cpu")[0]
    ref = eager_op("apply_rope")(eager_op("rms_norm")(x, w, eps), cos, sin)
    torch.testing.assert_close(eager_op("qk_norm_rope")(x, w, cos, sin, eps), ref)


@pytest.mark.parametrize("lengths", [[7, 7, 7], [1, 5, 5, 3], [4, 0, 4]])
def test_sdpa_over_runs_matches_the_loop(lengths):
    # the CPU check of this backend's logic; supports() keeps it off the CPU in the registry
    compare("varlen_attention", "sdpa_groups", lengths, torch.float32, "cpu", heads=2, head_dim=16)


def test_sdpa_kernel_preference_is_used_and_matches_eager():
    from torch.nn.attention import SDPBackend

    q = torch.randn(9, 2, 16)
    cu = torch.tensor([0, 4, 8, 9])
    ref = eager_op("varlen_attention")(q, q, q, cu, 4)
    out = sdpa_groups.varlen_attention(
        q, q, q, cu, 4, sdpa_backends=(SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH)
    )
    torch.testing.assert_close(out, ref)  # cuDNN has no CPU kernel: the next preference ran
    with pytest.raises(RuntimeError):  # and with none left, SDPA refuses: the registry's cue to fall back
        sdpa_groups.varlen_attention(q, q, q, cu, 4, sdpa_backends=(SDPBackend.CUDNN_ATTENTION,))


def _graph_nodes(t: torch.Tensor) -> set[str]:
    seen, todo, names = set(), [t.grad_fn], set()
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.add(type(node).__name__)
        todo += [n for n, _ in node.next_functions]
    return names


@pytest.mark.parametrize("lengths", [[4, 4], [3, 4, 4]])
def test_sdpa_groups_takes_no_slices_whose_backward_zeroes_a_full_gradient(lengths):
    # a slice's backward allocates a zeroed [T, H, D] gradient and copies into it, per q, k, v
    x = torch.randn(sum(lengths), 2, 16, requires_grad=True)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    names = _graph_nodes(sdpa_groups.varlen_attention(x, x, x, cu, max(lengths)))
    assert not {n for n in names if n.startswith("Slice")}, names


def test_runs_merge_only_consecutive_equal_lengths():
    cu = torch.tensor([0, 4, 8, 9, 13, 13, 17])
    assert sdpa_groups.runs(cu) == [(0, 2, 4), (8, 1, 1), (9, 2, 4)]


def test_compare_catches_a_wrong_kernel(monkeypatch):
    from kohakumoss_kernels.ops.rms_norm import eager as rms

    def wrong(x, weight=None, eps=1e-6):
        return rms.rms_norm(x, weight, eps) * 1.01

    monkeypatch.setattr("tests.kernels.cases.backend_fn", lambda op, backend: wrong)
    with pytest.raises(AssertionError):
        compare("rms_norm", "triton", [3], torch.float32, "cpu")


def test_lora_linear_reference():
    x, w, b, down, up, scale = make_inputs("lora_linear", [3, 2], torch.float32, "cpu")[0]
    y = eager_op("lora_linear")(x, w, b, down, up, scale)
    torch.testing.assert_close(y, x @ w.T + b + scale * (x @ down.T) @ up.T)


@pytest.mark.parametrize("backend", ["addmm", "addmm_lora_first"])
def test_lora_linear_addmm_matches_eager_on_cpu(backend):
    compare("lora_linear", backend, [3, 5], torch.float32, "cpu")


@pytest.mark.parametrize("lora_first", [False, True])
@pytest.mark.parametrize("trainable_base", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_lora_linear_addmm_gradients_are_exact_in_float64(trainable_base, lora_first, with_bias):
    """The fused backward (LoRA terms folded into the base GEMMs) against torch.autograd.gradcheck."""
    from kohakumoss_kernels.ops.lora_linear.addmm import lora_linear

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 6, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(7, 6, generator=g, dtype=torch.float64, requires_grad=trainable_base)
    b = torch.randn(7, generator=g, dtype=torch.float64, requires_grad=trainable_base) if with_bias else None
    down = torch.randn(3, 6, generator=g, dtype=torch.float64, requires_grad=True)
    up = torch.randn(7, 3, generator=g, dtype=torch.float64, requires_grad=True)
    fn = lambda x, w, b, down, up: lora_linear(x, w, b, down, up, 0.7, lora_first)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, w, b, down, up))
    y = fn(x, w, b, down, up)
    torch.testing.assert_close(y, eager_op("lora_linear")(x, w, b, down, up, 0.7))


@pytest.mark.parametrize("shuffled", [False, True])
@pytest.mark.parametrize("op", ["norm_modulate", "gated_residual", "residual_norm_modulate"])
def test_onehot_per_sample_ops_match_eager(op, shuffled):
    """The one-hot matmul form of the per-sample gather (kohakumoss_kernels/backends/per_token.py), values and
    gradients, samples packed in order and tokens shuffled across samples."""
    (compare_shuffled if shuffled else compare)(op, "onehot", [3, 1, 7], torch.float32, "cpu")


@pytest.mark.parametrize("backend", ["eager", "onehot"])
def test_norm_modulate_fork_gives_x_both_gradients(backend):
    """fork=True returns (h, x): x's gradient is h's path plus whatever the second output receives."""
    import importlib

    fn = importlib.import_module(f"kohakumoss_kernels.ops.norm_modulate.{backend}").norm_modulate
    g = torch.Generator().manual_seed(0)
    x0, shift, scale = (
        torch.randn(7, 16, generator=g),
        torch.randn(2, 16, generator=g),
        torch.randn(2, 16, generator=g),
    )
    ts = torch.tensor([0, 0, 0, 1, 1, 1, 1])
    gh, gres = torch.randn(7, 16, generator=g), torch.randn(7, 16, generator=g)
    x = x0.clone().requires_grad_(True)
    h, alias = fn(x, shift, scale, ts, 1e-6, fork=True)
    torch.autograd.backward([h, alias], [gh, gres])
    x_ref = x0.clone().requires_grad_(True)
    h_ref = fn(x_ref, shift, scale, ts, 1e-6)
    h_ref.backward(gh)
    torch.testing.assert_close(h, h_ref)
    torch.testing.assert_close(x.grad, x_ref.grad + gres)

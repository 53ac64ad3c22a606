"""int8 frozen bases on the GPU (sm80+): the int8 GEMM (torch._int_mm) against the dequantized reference
at the 5B block's shapes, plain and ConvRot-rotated, and LoRA training on an int8 base."""

from __future__ import annotations

import pytest
import torch

from kohakumoss.precision import quantize_frozen_linears
from kohakumoss_common.quant import convrot_hadamard
from kohakumoss_kernels import OpSet
from kohakumoss_kernels.registry import eager_op, load_backend
from kohakumoss_kernels.weights import int8

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or not int8.can_compute(torch.device("cuda")),
        reason="needs a CUDA GPU of sm80+ (run on the H200 through the device tool)",
    ),
]
DEV = torch.device("cuda")


def _rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("out_f", [3072, 18432])
@pytest.mark.parametrize("group", [0, 256])
@pytest.mark.parametrize("tokens", [8, 4096])
def test_int_mm_backend_tracks_the_dequantized_reference(out_f, group, tokens):
    torch.manual_seed(0)
    w = torch.randn(out_f, 3072, device=DEV) * 3072**-0.5
    if group:  # as a ConvRot file stores it: rotated per 256 columns, then quantized
        w = (w.reshape(out_f, -1, group) @ convrot_hadamard(group, DEV)).reshape(out_f, 3072)
    wq = int8.Int8Weight(*int8.quantize_weight(w), group=group)
    x = torch.randn(tokens, 3072, device=DEV).bfloat16().requires_grad_(True)
    fast = load_backend("stored_linear", "int_mm", "sm90", torch.bfloat16, "int8")
    y = fast(x, wq, None)
    y.float().square().sum().backward()
    gx, x.grad = x.grad, None
    y_ref = eager_op("stored_linear")(x, wq, None)
    y_ref.float().square().sum().backward()
    assert _rel(y, y_ref) < 0.02  # x rounded to 8 bits per row (bf16 reference: ~0.4%)
    assert _rel(gx, x.grad) < 0.03


def test_lora_training_on_an_int8_base_on_the_gpu():
    from kohakumoss.adapters import build_adapter

    from ..adapters.helpers import flow_batch, flow_loss, tiny_model

    def run(mode):
        model = tiny_model().to(DEV, torch.bfloat16).requires_grad_(False)
        model.ops = OpSet("auto", tune="off")
        quantize_frozen_linears(model, mode, DEV)
        net = build_adapter(model, rank=4, alpha=4.0, preset="attn-mlp", bypass=True).to(DEV)
        with torch.no_grad():
            for m in net.loras:
                m.lora_up.weight.normal_(0, 0.1, generator=torch.Generator(DEV).manual_seed(1))
        b = flow_batch()
        b = type(b)(b.img.to(DEV, torch.bfloat16), b.text.to(DEV, torch.bfloat16), b.sigma.to(DEV),
                    b.seq.to(DEV), b.target.to(DEV, torch.bfloat16))  # fmt: skip
        loss = flow_loss(model, b)
        loss.backward()
        return float(loss), [p.grad.float() for p in net.parameters()]

    ref_loss, ref = run("same")
    for mode in ("int8", "int8_weight"):
        loss, grads = run(mode)
        assert abs(loss - ref_loss) < 0.03 * ref_loss
        assert max(_rel(g, r) for g, r in zip(grads, ref, strict=True)) < 0.1

"""MXFP8 on the GPU: on a card without block-scaled fp8 GEMMs (the H200 is sm90) BASE_PRECISION mxfp8 is
refused by name and the registry leaves the GEMM out; on sm100+ the block-scaled GEMM against the
dequantized reference at the 5B block's shapes."""

from __future__ import annotations

import pytest
import torch

from kohakumoss.precision import quantize_frozen_linears
from kohakumoss_common.errors import ConfigError
from kohakumoss_kernels import OpSet
from kohakumoss_kernels.registry import eager_op, load_backend
from kohakumoss_kernels.weights import mxfp8

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the H200 through the device tool)"
    ),
]
DEV = torch.device("cuda")
blackwell = pytest.mark.skipif(
    not torch.cuda.is_available() or not mxfp8.can_compute(DEV), reason="needs sm100+ (Blackwell)"
)


@pytest.mark.skipif(torch.cuda.is_available() and mxfp8.can_compute(DEV), reason="this card has MXFP8 GEMMs")
def test_refused_by_name_and_not_bound_without_block_scaled_gemms():
    from ..adapters.helpers import tiny_model

    model = tiny_model().to(DEV).requires_grad_(False)
    with pytest.raises(
        ConfigError, match="'mxfp8'.*only Blackwell cards have \\(sm100\\+\\); this card is sm"
    ):
        quantize_frozen_linears(model, "mxfp8", DEV)
    ops = OpSet("auto", tune="off")
    w = mxfp8.quantize_weight(torch.randn(64, 64, device=DEV))
    x = torch.randn(32, 64, device=DEV, dtype=torch.bfloat16)
    ops.stored_linear(x, w, None)
    assert ops.bind("stored_linear", x.device, x.dtype, "mxfp8").names == ["addmm", "eager"]


@blackwell
@pytest.mark.parametrize("out_f", [3072, 18432])
def test_block_scaled_gemm_tracks_the_dequantized_reference(out_f):
    torch.manual_seed(0)
    w = mxfp8.quantize_weight(torch.randn(out_f, 3072, device=DEV) * 3072**-0.5)
    x = torch.randn(4096, 3072, device=DEV).bfloat16().requires_grad_(True)
    cap = torch.cuda.get_device_capability(DEV)
    y = load_backend("stored_linear", "block_scaled_mm", f"sm{cap[0]}{cap[1]}", torch.bfloat16, "mxfp8")(
        x, w, None
    )
    y_ref = eager_op("stored_linear")(x, w, None)
    err = float((y.float() - y_ref.float()).norm() / y_ref.float().norm())
    assert err < 0.06, err  # x rounded to e4m3 per 32-block
    y.float().square().sum().backward()
    assert torch.isfinite(x.grad).all()

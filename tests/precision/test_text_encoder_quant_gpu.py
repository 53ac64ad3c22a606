"""The text encoder's linears in fp8 / int8 on the GPU (the registry's int8 GEMM, the fp8 GEMMs): the tiny
Qwen3.5's last_hidden_state against its bf16 run."""

from __future__ import annotations

import pytest
import torch

from kohakumoss.encoders import TextEncoder, TextEncoderConfig
from kohakumoss.precision import Fp8Linear, Int8Linear
from kohakumoss_kernels.weights import fp8

from ..encoders import conftest as enc

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the H200 through the device tool)"
    ),
]
CAPTIONS = ["a red cat sits on the mat", "", "the quick brown fox jumps over the lazy dog"]
BOUNDS = {"fp8": 0.1, "fp8_weight": 0.1, "int8": 0.03, "int8_weight": 0.03}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("te_quant_gpu")
    return enc.write_hf_folder(root / "hf", enc.random_text_model()), enc.make_tokenizer(root / "tok")


@pytest.mark.parametrize("mode", ["fp8", "fp8_weight", "int8", "int8_weight"])
def test_quantized_text_encoder_on_the_gpu(folders, mode):
    if mode == "fp8" and not fp8.can_compute(torch.device("cuda")):
        pytest.skip("fp8 GEMMs need sm89+")
    folder, tok = folders

    def load(quant):
        cfg = TextEncoderConfig(
            path=str(folder), tokenizer_path=str(tok), dtype="bfloat16", device="cuda", quant=quant
        )
        return TextEncoder.load(cfg)

    ref = load("none").encode(CAPTIONS)[0]
    encoder = load(mode)
    assert any(isinstance(m, (Fp8Linear, Int8Linear)) for m in encoder.model.modules())
    got = encoder.encode(CAPTIONS)[0]
    err = float((got.float() - ref.float()).norm() / ref.float().norm())
    print(f"{mode} on {torch.cuda.get_device_name()}: last_hidden_state vs bf16 {err:.2e}")
    assert got.is_cuda and torch.isfinite(got).all() and 1e-4 < err < BOUNDS[mode]

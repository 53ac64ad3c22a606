"""The text encoder's block linears in fp8 / int8 (`TextEncoderConfig.quant`, encoders/text_quant.py):
the error of last_hidden_state against the unquantized encoder on the tiny Qwen3.5 (CPU), ConvRot
int8 files kept int8, the cache identity, bad values named."""

from __future__ import annotations

import json

import pytest
import torch

from kohakumoss.encoders import TextEncoder, TextEncoderConfig
from kohakumoss.encoders.text_layouts import model_to_comfy
from kohakumoss.precision import Fp8Linear, Int8Linear
from kohakumoss_common.errors import ConfigError
from kohakumoss_common.io import save_safetensors
from kohakumoss_kernels import OpSet
from kohakumoss_kernels.weights import int8

from ..encoders import conftest as enc

CAPTIONS = ["a red cat sits on the mat", "", "the quick brown fox jumps over the lazy dog"]


def _cpu_scaled_mm_runs() -> bool:
    try:
        a = torch.zeros(16, 16, dtype=torch.float8_e4m3fn)
        torch._scaled_mm(a, a.t(), torch.ones(16, 1), torch.ones(1, 16), out_dtype=torch.float32)
        return True
    except (RuntimeError, NotImplementedError):
        return False


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("te_quant")
    model = enc.random_text_model()
    return model, enc.write_hf_folder(root / "hf", model), enc.make_tokenizer(root / "tok")


def _load(folders, **kw) -> TextEncoder:
    _, folder, tok = folders
    return TextEncoder.load(TextEncoderConfig(path=str(folder), tokenizer_path=str(tok), **kw))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


# bound on ||quantized - bf16|| / ||bf16|| of last_hidden_state (docs/concepts/numerics.md's rows)
BOUNDS = {"fp8": 0.1, "fp8_weight": 0.1, "int8": 0.03, "int8_weight": 0.03}


@pytest.mark.parametrize("mode", ["fp8", "fp8_weight", "int8", "int8_weight"])
def test_last_hidden_state_error_against_bf16(folders, mode):
    """`pytest -s -k last_hidden_state tests/precision`: the error each mode adds to the DiT's conditioning."""
    if mode == "fp8" and not _cpu_scaled_mm_runs():
        pytest.skip("no row-wise fp8 GEMM on this CPU build")
    ref32 = _load(folders, dtype="float32").encode(CAPTIONS)[0]
    ref = _load(folders, dtype="bfloat16").encode(CAPTIONS)[0]
    encoder = _load(folders, dtype="bfloat16", quant=mode)
    linears = [m for m in encoder.model.modules() if isinstance(m, (Fp8Linear, Int8Linear))]
    assert len(linears) == 31  # 3 Gated DeltaNet blocks x (in_proj_qkv, _z, _b, _a, out_proj, MLP x3) + 1 x 7
    assert all(m.weight.element_size() == 1 for m in linears)
    gemm = {"int8": "int_mm", "fp8": "scaled_mm"}.get(mode)
    if gemm:  # the CPU registry runs the dequantized reference unless a backend is named
        for m in linears:
            m.__dict__["ops"] = OpSet(gemm, tune="off")
    got = encoder.encode(CAPTIONS)[0]
    err, err32, base = _rel(got, ref), _rel(got, ref32), _rel(ref, ref32)
    print(f"{mode}: last_hidden_state vs bf16 {err:.2e}, vs fp32 {err32:.2e} (bf16 vs fp32 {base:.2e})")
    assert got.dtype == torch.bfloat16 and torch.isfinite(got).all()
    assert 1e-4 < err < BOUNDS[mode]


def test_quant_is_part_of_the_cache_identity(folders):
    plain, quant = _load(folders), _load(folders, quant="int8_weight")
    assert plain.identity != quant.identity
    assert plain.identity == _load(folders, quant="none").identity


def test_bad_quant_is_named(folders):
    with pytest.raises(ConfigError, match="text_encoder.quant.*'int4'"):
        _load(folders, quant="int4")
    with pytest.raises(ConfigError, match="TEXT_ENCODER_QUANT.*'int8' needs a CUDA card of sm80\\+"):
        _load(folders, quant="int8", device="meta")


def _convrot_file(tmp_path, model, group: int):
    h = enc_hadamard(group)
    tensors, stored = {}, {}
    marker = json.dumps({"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": group})
    for key, value in model.state_dict().items():
        name = model_to_comfy(key)
        if value.dim() == 2 and key.startswith("layers."):  # every block linear
            o, i = value.shape
            q, s = int8.quantize_weight((value.reshape(o, i // group, group) @ h).reshape(o, i))
            tensors[name], tensors[name.replace(".weight", ".weight_scale")] = q, s[:, None]
            tensors[name.replace(".weight", ".comfy_quant")] = torch.tensor(
                list(marker.encode()), dtype=torch.uint8
            )
            stored[key] = q
        else:
            tensors[name] = value
    path = tmp_path / "te_convrot.safetensors"
    save_safetensors(tensors, path)
    return path, stored


def enc_hadamard(group: int) -> torch.Tensor:
    from kohakumoss_common.quant import convrot_hadamard

    return convrot_hadamard(group)


def test_convrot_file_kept_int8_equals_its_dequantized_load(tmp_path, folders):
    model, _, tok = folders
    path, stored = _convrot_file(tmp_path, model, group=16)
    tiny = model.config
    rope = {"rope_parameters": tiny.rope_parameters, "max_position_embeddings": tiny.max_position_embeddings}

    def load(quant):
        return TextEncoder.load(
            TextEncoderConfig(
                path=str(path), tokenizer_path=str(tok), dtype="float32", quant=quant, model_overrides=rope
            )  # fmt: skip
        )

    kept, dequantized = load("int8_weight"), load("none")
    lin = kept.model.layers[0].mlp.up_proj
    linears = [m for m in kept.model.modules() if isinstance(m, Int8Linear)]
    assert len(linears) == 31 and all(m.convrot_group == 16 for m in linears)  # none re-quantized
    assert torch.equal(lin.weight, stored["layers.0.mlp.up_proj.weight"])  # the file's bytes, not re-rounded
    got, want = kept.encode(CAPTIONS)[0], dequantized.encode(CAPTIONS)[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)

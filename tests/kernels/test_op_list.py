"""The op list against the tree, the generic eager / compile backends, variants as registered parameters,
and the LoRA ops' dispatch on the frozen weight's kind (tensor, fp8, int8, MXFP8)."""

from __future__ import annotations

import importlib
import inspect
from functools import partial
from pathlib import Path

import pytest
import torch

from kohakumoss_common.errors import ConfigError
from kohakumoss_kernels import OpSet, available_ops, registry
from kohakumoss_kernels.op_list import OPS, SPECS, shape_key
from kohakumoss_kernels.registry import _exact_key, backend_fn, eager_op, resolve
from kohakumoss_kernels.tuning.shape_keys import bucket
from kohakumoss_kernels.weights import fp8, int8, mxfp8
from kohakumoss_kernels.weights.stored_weight import WEIGHT_KINDS, weight_kind

from .cases import make_inputs

OPS_DIR = Path(registry.__file__).parent / "ops"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "internals" / "kernels.md"


def test_every_op_folder_is_listed_and_every_listed_op_has_its_reference():
    folders = {p.name for p in OPS_DIR.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == {spec.folder for spec in OPS}
    assert set(available_ops()) >= set(SPECS) and len(SPECS) == len(OPS)
    for spec in OPS:
        module, name = spec.reference.split(":")
        assert eager_op(spec.name) is getattr(importlib.import_module(module), name), spec.name
        assert spec.signature and spec.summary, spec.name


def test_no_op_carries_its_own_compile_module():
    """torch.compile of the reference is the registry's, one per reference and process."""
    assert not list(OPS_DIR.glob("*/compile.py"))
    fn = backend_fn("rms_norm", "compile")
    assert fn.__wrapped__ is eager_op("rms_norm") and backend_fn("rms_norm", "compile") is fn
    assert backend_fn("gated_residual", "compile").__wrapped__ is eager_op("gated_residual")
    assert resolve("situ_glu", "cpu", torch.float32, backend="compile").names == ["compile", "eager"]


def test_ops_without_a_compile_form_offer_none():
    op = "stored_linear"
    assert not SPECS[op].compile and not registry.has_backend(op, "compile")
    for kind in WEIGHT_KINDS:
        assert "compile" not in resolve(op, "cpu", torch.float32, backend="compile", kind=kind).names


def test_a_registered_op_gets_compile_unless_it_says_no():
    registry.register_op("op_list_test_op", torch.sin)
    assert backend_fn("op_list_test_op", "compile").__wrapped__ is torch.sin
    registry.register_op("op_list_test_op", torch.sin, compile=False)
    assert not registry.has_backend("op_list_test_op", "compile")


def test_variants_are_their_base_backend_with_fixed_arguments():
    for spec in OPS:
        for name, variant in spec.variants.items():
            assert name in registry.BACKENDS and set(variant.weights) <= set(WEIGHT_KINDS)
            base = importlib.import_module(f"kohakumoss_kernels.ops.{spec.folder}.{variant.base}")
            fn = backend_fn(spec.name, name)
            assert isinstance(fn, partial) and fn.func is getattr(base, spec.name)
            assert dict(fn.keywords) == dict(variant.kwargs)
            params = inspect.signature(fn.func).parameters
            assert set(variant.kwargs) <= set(params), (spec.name, name)
            assert not (OPS_DIR / spec.folder / f"{name}.py").exists()  # no one-line module beside it


def test_backend_modules_name_only_known_weight_kinds():
    for spec in OPS:
        for path in (OPS_DIR / spec.folder).glob("*.py"):
            if path.stem in ("__init__", "eager"):
                continue
            try:
                module = importlib.import_module(f"kohakumoss_kernels.ops.{spec.folder}.{path.stem}")
            except ImportError:  # TileLang (or Triton) not installed here
                continue
            assert set(getattr(module, "WEIGHTS", ("dense",))) <= set(WEIGHT_KINDS), path


def _weights(o: int = 24, i: int = 32):
    w = torch.randn(o, i, generator=torch.Generator().manual_seed(0)) * i**-0.5
    return {
        "dense": w,
        "fp8": fp8.Fp8Weight(*fp8.quantize_weight(w), compute=False),
        "int8": int8.Int8Weight(*int8.quantize_weight(w), compute=False),
        "mxfp8": mxfp8.quantize_weight(w, compute=False),
    }


def test_each_weight_kind_binds_the_backends_that_take_it():
    """The matrix before the per-kind op folders went: a stored weight's addmm writes first (no
    addmm_lora_first), no lycoris / compile over a stored weight, no low-rank kernels over MXFP8."""
    named = "triton,addmm,addmm_lora_first,compile"
    expect = {
        "dense": ["addmm", "addmm_lora_first", "compile", "eager"],
        "fp8": ["addmm", "eager"],
        "int8": ["addmm", "eager"],
        "mxfp8": ["addmm", "eager"],
    }
    for op in ("lora_linear", "lora_group"):
        for kind, names in expect.items():
            got = resolve(op, "sm90", torch.bfloat16, backend=named, kind=kind).names
            assert [n for n in got if n != "triton"] == names, (op, kind)
            assert ("triton" in got) <= (kind == "dense" and op == "lora_linear")
        lowrank = registry._backend(op, "addmm_lowrank")[2]
        assert set(lowrank) == {"dense", "fp8", "int8"}
    assert resolve("lora_linear", "cpu", torch.float32).kind == "dense"
    assert resolve("rms_norm", "cpu", torch.float32).kind is None
    with pytest.raises(ConfigError, match="unknown weight kind 'fp4'"):
        resolve("lora_linear", "cpu", torch.float32, kind="fp4")


def test_opset_dispatches_lora_linear_on_the_weight_kind():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 32, generator=g)
    down, up = torch.randn(4, 32, generator=g) * 0.2, torch.randn(24, 4, generator=g)
    ops = OpSet(backend="addmm,addmm_lora_first", tune="off")
    for kind, w in _weights().items():
        assert weight_kind(w) == kind
        y = ops.lora_linear(x, w, None, down, up, 0.5)
        ref = eager_op("lora_linear")(x, w, None, down, up, 0.5)
        dense = w if kind == "dense" else w.dequant(x.dtype)
        torch.testing.assert_close(ref, eager_op("lora_linear")(x, dense, None, down, up, 0.5))
        torch.testing.assert_close(y, ref, atol=1e-5, rtol=1e-5)
    bound = {k[3]: b.names for k, b in ops._bound.items()}
    assert bound == {
        "dense": ["addmm", "addmm_lora_first", "eager"],
        "fp8": ["addmm", "eager"],
        "int8": ["addmm", "eager"],
        "mxfp8": ["addmm", "eager"],
    }
    assert (
        "lora_linear[fp8]@cpu/torch.float32" in ops.chosen()
        and "lora_linear@cpu/torch.float32" in ops.chosen()
    )


def test_opset_dispatches_lora_group_on_its_members_kind():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(6, 32, generator=g)
    downs = [torch.randn(4, 32, generator=g) * 0.2 for _ in range(3)]
    ups = [torch.randn(24, 4, generator=g) for _ in range(3)]
    ops = OpSet(backend="addmm,addmm_lora_first", tune="off")
    for w in _weights().values():
        outs = ops.lora_group(x, [w] * 3, [None] * 3, downs, ups, [0.5] * 3)
        refs = eager_op("lora_group")(x, [w] * 3, [None] * 3, downs, ups, [0.5] * 3)
        for o, r in zip(outs, refs, strict=True):
            torch.testing.assert_close(o, r, atol=1e-5, rtol=1e-5)
    assert {k[3] for k in ops._bound} == set(WEIGHT_KINDS)


def test_shape_keys_and_exact_keys_carry_the_weight_kind():
    x = torch.zeros(300, 32)
    down, up = torch.zeros(4, 32), torch.zeros(24, 4)
    ws = _weights()
    assert shape_key("lora_linear", x, ws["dense"], None, down, up, 1.0) == "lora_linear|fp32|T=512|I=32|O=24"
    assert (
        shape_key("lora_linear", x, ws["fp8"], None, down, up, 1.0)
        == "lora_linear|fp32|W=fp8|T=512|I=32|O=24"
    )
    assert (
        shape_key("lora_group", x, [ws["int8"]] * 2, [None] * 2, [down] * 2, [up] * 2, [1.0] * 2)
        == "lora_group|fp32|W=int8|T=512|I=32|O=24,24"
    )
    assert shape_key("stored_linear", x, ws["int8"], None) == "stored_linear|fp32|W=int8|T=512|I=32|O=24"
    # fp8 and MXFP8 data are both e4m3 of one shape: the exact key still tells them apart
    assert _exact_key((x, ws["fp8"]), {}) != _exact_key((x, ws["mxfp8"]), {})


def test_docs_list_every_op_and_variant():
    text = DOCS.read_text()
    for spec in OPS:
        assert f"| `{spec.name}` |" in text, spec.name
        for name in spec.variants:
            assert f"`{name}`" in text, name


@pytest.mark.parametrize("spec", OPS, ids=[s.name for s in OPS])
def test_every_op_keys_its_tuning_rows_from_its_spec(spec):
    """`OpSpec.dims` reads a real call's arguments (tests/kernels/cases.py): the key names the op and its
    dtype, buckets the tokens, and ends in the spec's revision past the first."""
    if spec.name == "lora_group":  # two lora_linear members reading one x
        (x, *member), kwargs = make_inputs("lora_linear", [70, 30], torch.float32, "cpu")
        args = (x, *([a, a] for a in member))
    elif spec.name == "stored_linear":  # a frozen int8 weight, no LoRA
        args, kwargs = (torch.zeros(100, 32), _weights()["int8"], None), {}
    else:
        args, kwargs = make_inputs(spec.name, [70, 30], torch.float32, "cpu")
    key = spec.shape_key(*args, **kwargs)
    assert key == shape_key(spec.name, *args, **kwargs)
    assert key.startswith(f"{spec.name}|fp32|") and f"|T={bucket(len(args[0]))}|" in f"{key}|"
    assert key.endswith(f"|r{spec.revision}") == (spec.revision > 1)

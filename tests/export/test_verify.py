"""Verified exports: every algorithm's files read back as ComfyUI, lycoris and the project's loader read
them ("N/N keys matched, 0 unused" and a merged-weight comparison); a wrong file is an ExportMismatch that
deletes nothing. On an fp8 base every export format is compared with a float64 reference merge."""

from __future__ import annotations

import logging

import pytest
import torch
from safetensors.torch import load_file, save_file

from kohakumoss.adapters import adapter_state_dict, build_adapter, load_adapter
from kohakumoss.adapters.algos import ALGOS as RECORDS
from kohakumoss.adapters.merge import _merged, dense_state_dict, merged_weights
from kohakumoss.export import export_all, fuse_qkv
from kohakumoss.export.comfy_apply import apply_comfy_adapter
from kohakumoss.export.verify import (
    ExportMismatch,
    comfy_key_check,
    comfy_shapes,
    verify_comfy,
    verify_lycoris,
    verify_merged,
)
from kohakumoss.model.io import load_backbone
from kohakumoss.precision import quantize_frozen_linears

from ..adapters.helpers import TINY_ARGS, algo_names, tiny_model

ALGOS = [(a, TINY_ARGS.get(a, {})) for a in algo_names()]
FP8_CASES = [(a, args) for a, args in ALGOS if RECORDS[a].runs_on_quantized_base(args)] + [
    ("lokr-dora", {"factor": 4, "dora_wd": True})
]
BASES = ["fp8_weight", "int8_weight"]  # the quantized bases adapters train beside


def _perturb(net, seed=0, std=0.02):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn(p.shape, generator=g) * std)


def _adapted(algo, args, base="same", preset="full"):
    model = tiny_model()
    if base != "same":
        model.requires_grad_(False)
        quantize_frozen_linears(model, base)
    net = build_adapter(model, algo.split("-")[0], rank=8, alpha=4, preset=preset, **args)
    _perturb(net)
    return model, net


@pytest.mark.parametrize("algo,args", ALGOS, ids=[a for a, _ in ALGOS])
def test_every_export_of_every_algorithm_verifies(monkeypatch, tmp_path, caplog, algo, args):
    monkeypatch.setattr("lycoris.modules.tlora.gc.collect", lambda *a: 0)
    model, net = _adapted(algo, args)
    with caplog.at_level(logging.INFO, logger="kohakumoss.export.verify"):
        written = export_all(model, net, tmp_path, "run", save_merged_model=True, save_diffusers=True)
    assert set(written) == {"lycoris", "comfy", "merged", "diffusers"}
    lines = [r.getMessage() for r in caplog.records if "keys matched" in r.getMessage()]
    assert len(lines) == 4, lines
    for line in lines:
        matched = line.split(": ")[2].split(" keys")[0]
        n, total = matched.split("/")
        assert n == total and int(n) > 0 and "0 unused" in line and "merged weights of" in line, line


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("algo,args", FP8_CASES, ids=[a for a, _ in FP8_CASES])
def test_quantized_base_exports_match_a_float64_reference(tmp_path, algo, args, base):
    """Train-time fp8 / int8 base: each written format, read as its consumer reads it, equals the float64
    merge of the adapter onto the dequantized base (LoKr's fused qkv included: it once wrote a wrong diff)."""
    model, net = _adapted(algo, args, base, preset="attn-mlp")
    written = export_all(model, net, tmp_path, "run", save_merged_model=True, save_diffusers=True)
    base = dense_state_dict(model)
    ref_model = tiny_model().double()
    ref_model.load_state_dict(base)
    ref_net = load_adapter(
        ref_model, {k: v.double() for k, v in adapter_state_dict(net).items()}, apply=False
    )
    for lora in ref_net.loras:  # not registered as submodules of the network
        lora.double()
    names = {id(m): n for n, m in ref_model.named_modules()}
    ref = {f"{names[id(lora.org_module[0])]}.weight": _merged(lora, 1.0)[0] for lora in ref_net.loras}
    assert len(ref) == 6 * 4

    def rel(got, key):  # against the size of the adapter's change
        change = ref[key] - base[key].double()
        return float((got.double() - ref[key]).norm() / change.norm())

    lyco = merged_weights(model, written["lycoris"])  # lycoris's loader on the fp8 model
    assert max(rel(lyco[k], k) for k in ref) < 1e-4
    comfy = apply_comfy_adapter(fuse_qkv(base), load_file(str(written["comfy"])))
    want, fused_base = fuse_qkv({**base, **ref}), fuse_qkv(base)
    changed = [k for k in want if not torch.equal(want[k].double(), fused_base[k].double())]
    assert len(changed) == 4 * 4  # qkv, o, ffn_up_gate, ffn_down of each block
    for key in changed:
        change = (want[key].double() - fused_base[key].double()).norm()
        assert float((comfy[key].double() - want[key].double()).norm() / change) < 1e-4, key
    for folder in ("merged", "diffusers"):  # bf16 files: relative to the weight
        merged = load_backbone(written[folder], dtype=torch.float32).state_dict()
        for key in ref:
            err = float((merged[key].double() - ref[key]).norm() / ref[key].norm())
            assert err < 1e-2, (folder, key, err)
        assert not any(k.endswith("weight_scale") for k in merged)


def test_separate_qkv_keys_are_unused_by_comfyui():
    """The Comfy-Org layout has no layers.N.proj.q weight: ComfyUI's generic key map leaves such keys
    unloaded ("lora key not loaded"), and the check says so."""
    model = tiny_model()
    d = model.config.dim
    tensors = {
        "diffusion_model.layers.0.proj.q.lora_up.weight": torch.zeros(d, 4),
        "diffusion_model.layers.0.proj.q.lora_down.weight": torch.zeros(4, d),
        "diffusion_model.layers.0.proj.o.lora_up.weight": torch.zeros(d, 4),
        "diffusion_model.layers.0.proj.o.lora_down.weight": torch.zeros(4, d),
        "diffusion_model.layers.0.proj.o.alpha": torch.tensor(4.0),
        "diffusion_model.layers.0.proj.qkv.diff": torch.zeros(d, d),  # wrong shape: qkv is [3d, d]
    }
    consumed, unused, problems = comfy_key_check(tensors, comfy_shapes(model))
    assert consumed == 4
    assert unused == sorted(k for k in tensors if ".proj.q." in k)
    assert len(problems) == 1 and "qkv" in problems[0] and "shape" in problems[0]


def test_a_wrong_comfy_file_fails_its_merge_comparison(tmp_path):
    model, net = _adapted("lora", {}, preset="attn")
    export_all(model, net, tmp_path, "run")
    path = tmp_path / "run-comfy.safetensors"
    tensors = load_file(str(path))
    source = adapter_state_dict(net)
    assert verify_comfy(model, source, path).ok
    for key in [k for k in tensors if k.endswith(".alpha")]:  # every module scaled twice over
        tensors[key] = tensors[key] * 2
    save_file(tensors, str(path))
    result = verify_comfy(model, source, path)
    assert not result.ok and result.unused == [] and result.error > 0.5
    assert "keys matched, 0 unused" in result.line()


def test_lycoris_check_names_keys_lycoris_does_not_load(tmp_path):
    model, net = _adapted("lora", {}, preset="attn")
    export_all(model, net, tmp_path, "run")
    path = tmp_path / "lycoris" / "run.safetensors"
    tensors = load_file(str(path))
    tensors["lycoris_layers_0_proj_o.lora_mid_typo.weight"] = torch.zeros(2)
    save_file(tensors, str(path))
    result = verify_lycoris(model, adapter_state_dict(net), path)
    assert not result.ok and result.unused == ["lycoris_layers_0_proj_o.lora_mid_typo.weight"]


def test_a_mismatch_raises_after_writing_and_deletes_nothing(monkeypatch, tmp_path):
    """A wrong ComfyUI export is an error naming the file; the correct LyCORIS file stays on disk."""
    import kohakumoss.export.bundle as bundle

    real = bundle.to_comfy_adapter

    def broken(*a, **k):
        out = real(*a, **k)
        key = next(k for k in out.tensors if k.endswith("lora_up.weight"))
        out.tensors[key] = out.tensors[key] * 3
        return out

    monkeypatch.setattr(bundle, "to_comfy_adapter", broken)
    model, net = _adapted("lora", {}, preset="attn")
    with pytest.raises(ExportMismatch, match=r"run-comfy\.safetensors: ComfyUI: \d+/\d+ keys matched"):
        export_all(model, net, tmp_path, "run")
    assert (tmp_path / "lycoris" / "run.safetensors").is_file() and (
        tmp_path / "run-comfy.safetensors"
    ).is_file()
    assert verify_lycoris(model, adapter_state_dict(net), tmp_path / "lycoris" / "run.safetensors").ok


def test_checkpoint_exports_defer_full_differences(tmp_path):
    """full_diffs=False (a checkpoint): no ComfyUI file for an adapter that needs a full weight difference
    (the LyCORIS file stays even with SAVE_FORMAT='comfy'); compact algorithms are written as always."""
    model, net = _adapted("dora", {}, preset="attn")
    written = export_all(model, net, tmp_path / "a", "run", save_format="comfy", full_diffs=False)
    assert set(written) == {"lycoris"} and written["lycoris"].is_file()
    assert not (tmp_path / "a" / "run-comfy.safetensors").exists()
    written = export_all(model, net, tmp_path / "b", "run", save_format="comfy")
    assert set(written) == {"comfy"} and not (tmp_path / "b" / "lycoris").exists()
    model, net = _adapted("loha", {}, preset="attn")
    written = export_all(model, net, tmp_path / "c", "run", save_format="both", full_diffs=False)
    assert set(written) == {"lycoris", "comfy"}
    assert set(export_all(model, net, tmp_path / "d", "run", save_format="hf")) == {"lycoris"}
    assert not (tmp_path / "d" / "run-comfy.safetensors").exists()


@pytest.mark.parametrize("algo", ["dora", "oft"])
def test_a_bf16_base_diff_carries_no_rounding_of_the_weight(tmp_path, algo):
    """A diff taken from the merged weight rounded to bf16 is the change plus the weight's rounding: the
    diff comes from the float32 merge, and verifies against it."""
    model = tiny_model().to(torch.bfloat16)
    net = build_adapter(model, algo, rank=8, alpha=4, preset="attn")
    net.to(torch.float32)
    _perturb(net, std=0.002)  # a small change: the weight's bf16 rounding would be a large part of it
    written = export_all(model, net, tmp_path, "run")
    assert verify_comfy(model, adapter_state_dict(net), written["comfy"]).error < 1e-4


def test_a_file_lycoris_cannot_load_is_a_mismatch(tmp_path):
    model, net = _adapted("lora", {}, preset="attn")
    export_all(model, net, tmp_path, "run")
    path = tmp_path / "lycoris" / "run.safetensors"
    tensors = load_file(str(path))
    key = next(k for k in tensors if k.endswith("lora_down.weight"))
    tensors[key] = torch.zeros(tensors[key].shape[0], 3)  # no longer the module's width
    save_file(tensors, str(path))
    result = verify_lycoris(model, adapter_state_dict(net), path)
    assert not result.ok and "lycoris's loader fails on it" in result.line()


def test_a_diffusers_folder_needs_its_config(tmp_path):
    model, net = _adapted("lora", {}, preset="attn")
    written = export_all(model, net, tmp_path, "run", save_diffusers=True)
    source = adapter_state_dict(net)
    assert verify_merged(model, source, written["diffusers"], "hf").ok
    (written["diffusers"] / "config.json").write_text('{"_class_name": "SomethingElse"}')
    result = verify_merged(model, source, written["diffusers"], "hf")
    assert not result.ok and "config.json" in result.line()


def test_an_out_file_holds_the_comfy_adapter_and_the_rest_sits_beside_it(tmp_path):
    """`out` a .safetensors path: the ComfyUI file is that file, the others `<stem>-<kind>` beside it; the
    same files as a folder export, each verified."""
    model, net = _adapted("lora", {}, preset="attn")
    folder = export_all(model, net, tmp_path / "folder", "run", save_merged_model=True, save_diffusers=True)
    out = tmp_path / "named" / "my-lora.safetensors"
    written = export_all(model, net, out, "ignored", save_merged_model=True, save_diffusers=True)
    assert written == {
        "comfy": out,
        "lycoris": tmp_path / "named" / "my-lora-lycoris" / "my-lora.safetensors",
        "merged": tmp_path / "named" / "my-lora-merged",
        "diffusers": tmp_path / "named" / "my-lora-transformer",
    }
    assert sorted(p.name for p in (tmp_path / "named").iterdir()) == sorted(
        p.relative_to(tmp_path / "named").parts[0] for p in written.values()
    )
    for kind in ("comfy", "lycoris"):
        mine, theirs = load_file(str(written[kind])), load_file(str(folder[kind]))
        assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine), kind
    assert set(export_all(model, net, tmp_path / "one.safetensors", "x", save_format="comfy")) == {"comfy"}
    assert not (tmp_path / "one-lycoris").exists() and (tmp_path / "one.safetensors").is_file()
    assert export_all(model, net, tmp_path / "two.safetensors", "x", save_format="hf") == {
        "lycoris": tmp_path / "two-lycoris" / "two.safetensors"
    }
    assert not (tmp_path / "two.safetensors").exists()


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_an_adapter_with_non_finite_weights_never_verifies(tmp_path, caplog, value):
    """A NaN adapter once logged 'merged weights within 0.0e+00' (max(0.0, nan) is 0.0) and was called
    verified: every file holding inf or NaN now fails, its tensors named."""
    model, net = _adapted("lora", {}, preset="attn")
    with torch.no_grad():
        next(p for n, p in net.named_parameters() if "lora_up" in n).fill_(value)
    with caplog.at_level(logging.INFO, logger="kohakumoss.export.verify"), pytest.raises(ExportMismatch) as e:
        export_all(model, net, tmp_path, "run", save_merged_model=True)
    message = str(e.value)
    for consumer in ("ComfyUI", "LyCORIS", "transformer"):
        assert consumer in message, (consumer, message)
    assert message.count("hold inf or NaN") == 3
    assert not [r for r in caplog.records if r.levelno == logging.INFO and "keys matched" in r.getMessage()]


def test_the_only_adapter_file_at_the_top_is_the_one_comfyui_loads(tmp_path, caplog):
    """ComfyUI maps none of the LyCORIS file's keys (`lycoris_layers_0_proj_q`: unfused q / k / v, no key
    map of its own): it sits in `lycoris/`, never beside the ComfyUI file, and the export says which is which."""
    model, net = _adapted("lora", {}, preset="attn")
    with caplog.at_level("INFO", logger="kohakumoss.export.bundle"):
        written = export_all(model, net, tmp_path, "run")
    assert [p.name for p in tmp_path.glob("*.safetensors")] == ["run-comfy.safetensors"]
    assert written["lycoris"] == tmp_path / "lycoris" / "run.safetensors"
    assert all(k.startswith("lycoris_") for k in load_file(str(written["lycoris"])))
    assert "lycoris/run.safetensors: LyCORIS format" in caplog.text
    assert "ComfyUI loads none of its keys (ComfyUI's is run-comfy.safetensors)" in caplog.text

"""GPU (H200): an adapter trained a step on a bf16 model on CUDA, on a plain, an fp8-compute and an
int8-compute base, then exported with every file verified (ComfyUI rules, lycoris's loader, the merged
transformer), and its ComfyUI file checked against a float64 merge onto the dequantized base."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from safetensors.torch import load_file

from kohakumoss.adapters import adapter_state_dict, build_adapter, load_adapter
from kohakumoss.adapters.algos import ALGOS as RECORDS
from kohakumoss.adapters.merge import _merged, dense_state_dict, dense_tensor
from kohakumoss.export import export_all, fuse_qkv
from kohakumoss.export.comfy_apply import apply_comfy_adapter
from kohakumoss.optim.build import build_adamw
from kohakumoss.precision import quantize_frozen_linears

from ..adapters.helpers import CFG, TINY_ARGS, algo_names, flow_batch, flow_loss, tiny_model
from ..model.helpers import random_model

pytestmark = pytest.mark.gpu
# every algorithm that trains beside a quantized base (Algo.quantized_base), and LoKr's DoRA
ALGOS = [(a, TINY_ARGS.get(a, {})) for a in algo_names() if RECORDS[a].runs_on_quantized_base({})] + [
    ("lokr-dora", {"factor": 4, "dora_wd": True})
]
BASES = ["same", "fp8", "int8"]
CASES = [(a, args, base) for a, args in ALGOS for base in BASES]


def _to(batch, device):
    batch.img, batch.text, batch.sigma = batch.img.to(device), batch.text.to(device), batch.sigma.to(device)
    batch.target, batch.seq = batch.target.to(device), batch.seq.to(device)
    return batch


@pytest.fixture(autouse=True)
def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (run on the H200 through the device tool)")


@pytest.mark.parametrize("algo,args,base", CASES, ids=[f"{a}-{b}" for a, _, b in CASES])
def test_trained_step_exports_verify_on_cuda(tmp_path, algo, args, base):
    device = torch.device("cuda")
    model = tiny_model().to(device, torch.bfloat16)
    model.requires_grad_(False)
    if base != "same":
        quantize_frozen_linears(model, base, device)
    net = build_adapter(model, algo.split("-")[0], rank=8, alpha=4, preset="attn-mlp", **args)
    net.to(torch.float32)
    opt = build_adamw([{"params": list(net.parameters())}], 1e-2)
    batch = _to(flow_batch(), device)
    with torch.autocast("cuda", torch.bfloat16):
        loss = flow_loss(model, batch)
    loss.backward()
    opt.step()
    assert torch.isfinite(loss)
    written = export_all(model, net, tmp_path, "run", save_merged_model=True)  # raises on a mismatch
    assert set(written) == {"lycoris", "comfy", "merged"}
    dense = {k: dense_tensor(model, k).cpu() for k in dense_state_dict(model)}  # float32, not rounded to bf16
    ref_model = tiny_model().double()
    ref_model.load_state_dict({k: v.double() for k, v in dense.items()})
    ref_net = load_adapter(
        ref_model, {k: v.double() for k, v in adapter_state_dict(net).items()}, apply=False
    )
    names = {id(m): n for n, m in ref_model.named_modules()}
    ref = {}
    for lora in ref_net.loras:
        lora.double()
        ref[f"{names[id(lora.org_module[0])]}.weight"] = _merged(lora, 1.0)[0]
    fused_base = fuse_qkv({k: v.double() for k, v in dense.items()})
    want = fuse_qkv({**{k: v.double() for k, v in dense.items()}, **ref})
    got = apply_comfy_adapter(fused_base, load_file(str(written["comfy"])))
    for key in want:
        change = (want[key] - fused_base[key]).norm()
        if change > 0:
            assert float((got[key].double() - want[key]).norm() / change) < 1e-4, key


def _export_growth(directory, algo: str, depth: int) -> tuple[int, int]:
    """(the card's growth during export_all, the model's bf16 bytes) for a fresh model of `depth` blocks:
    float32 for a full fine-tune, a bf16 base under an adapter otherwise."""
    device = torch.device("cuda")
    model = random_model(dataclasses.replace(CFG, depth=depth)).to(device)
    net = None
    if algo != "full":
        model.to(torch.bfloat16).requires_grad_(False)
        args = {"factor": 4} if algo == "lokr" else {}
        net = build_adapter(model, algo, rank=8, alpha=4, preset="attn-mlp", **args).to(torch.float32)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    assert "merged" in export_all(model, net, directory, "run", save_merged_model=True)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before, sum(p.numel() * 2 for p in model.parameters())


@pytest.mark.parametrize("algo", ["full", "lora", "lokr"])
def test_exports_add_no_copy_of_the_model_on_the_card(tmp_path, algo):
    """The merged transformer (and LoKr's ComfyUI file of full differences) is made a linear at a time and
    cast on the host, so what an export adds on the card does not grow with the model: a copy there ran a
    full fine-tune out of its 80 GiB cap at the final save. Two depths, after a warm-up export that takes
    the one-time costs (kernel autotuning's scratch buffers, library workspaces)."""
    _export_growth(tmp_path / "warm", algo, 4)
    small, small_copy = _export_growth(tmp_path / "small", algo, 12)
    big, big_copy = _export_growth(tmp_path / "big", algo, 36)
    assert big - small < (big_copy - small_copy) / 4, (small, big, small_copy, big_copy)

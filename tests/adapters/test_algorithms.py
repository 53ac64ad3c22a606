"""Every LyCORIS algorithm trains on the tiny model, round-trips through its file, and merges exactly.

For each algorithm: a few AdamW steps on one fixed flow-matching batch lower the loss; the file written
by `save_adapter` (lycoris `save_weights`) is read back by lycoris's loader onto a fresh base model and
gives the trained network's forward; the merged weights give it too.
"""

from __future__ import annotations

import pytest
import torch

from kohakumoss.adapters import (
    adapter_param_groups,
    adapter_state_dict,
    build_adapter,
    load_adapter,
    merge_into,
    merged_state_dict,
    read_spec,
    save_adapter,
)

from .helpers import algo_names, flow_batch, flow_loss, forward, tiny_model

# (algo, extra lycoris args, lr, lycoris module class that reads the file back)
CASES = [
    ("lora", {}, 1e-2, "LoConModule"),
    ("locon", {}, 1e-2, "LoConModule"),
    ("loha", {}, 1e-2, "LohaModule"),
    ("lokr", {"factor": 8}, 5e-2, "LokrModule"),
    ("dora", {}, 1e-2, "LoConModule"),
    ("oft", {}, 1e-2, "DiagOFTModule"),
    ("boft", {}, 1e-2, "ButterflyOFTModule"),
    ("glora", {}, 1e-2, "GLoRAModule"),
    ("ia3", {}, 1e-1, "IA3Module"),
    ("dylora", {"block_size": 4}, 1e-2, "LoConModule"),
    ("tlora", {}, 1e-2, "TLoraModule"),
]
STEPS = 4


def test_every_algorithm_of_the_registry_has_a_case():
    assert sorted(c[0] for c in CASES) == sorted(algo_names())


def _dylora_full_rank(model, net, batch):
    """DyLoRA's forward is random-rank by design; its full-rank forward (scale alpha / blocks) by hand."""
    ref = tiny_model()
    names = {id(m): n for n, m in model.named_modules()}
    state = ref.state_dict()
    with torch.no_grad():
        for lora in net.loras:
            down, up, scale = lora.get_weight((lora.block_count - 1) * lora.block_size)
            key = names[id(lora.org_module[0])] + ".weight"
            state[key] = state[key] + (up @ down) * scale
        ref.load_state_dict(state)
        return forward(ref, batch)


@pytest.mark.parametrize("algo,args,lr,loader_class", CASES, ids=[c[0] for c in CASES])
def test_algorithm_trains_roundtrips_and_merges(tmp_path, monkeypatch, algo, args, lr, loader_class):
    # lycoris's T-LoRA runs gc.collect() per module it builds: seconds in a big test process
    monkeypatch.setattr("lycoris.modules.tlora.gc.collect", lambda *a: 0)
    batch = flow_batch()
    model = tiny_model()
    net = build_adapter(model, algo, rank=8, alpha=4, preset="attn", **args)
    opt = torch.optim.AdamW(adapter_param_groups(net, lr))
    losses = []
    for _ in range(STEPS):
        loss = flow_loss(model, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] * 0.995, losses

    net.eval()
    with torch.no_grad():
        trained = forward(model, batch) if algo != "dylora" else _dylora_full_rank(model, net, batch)
        base = forward(tiny_model(), batch)
    assert (trained - base).abs().max() > 1e-3  # the adapter does something

    path = save_adapter(net, tmp_path / f"{algo}.safetensors")
    assert read_spec(path).algo == algo

    fresh = tiny_model()
    loaded = load_adapter(fresh, path)
    assert {type(m).__name__ for m in loaded.loras} == {loader_class} and len(loaded.loras) == len(net.loras)
    with torch.no_grad():
        torch.testing.assert_close(forward(fresh, batch), trained, rtol=1e-5, atol=1e-5)

    merged = tiny_model()
    merged.load_state_dict(merged_state_dict(merged, path))
    in_place = merge_into(tiny_model(), path)
    with torch.no_grad():
        torch.testing.assert_close(forward(merged, batch), trained, rtol=1e-5, atol=2e-5)
        torch.testing.assert_close(forward(in_place, batch), trained, rtol=1e-5, atol=2e-5)


def test_a_loaded_network_goes_where_it_is_asked():
    """The model's device by default; an export's checks ask for the host, so a network they rebuild from
    the file does not sit on the card beside the trained one (merged one module at a time instead)."""
    model = tiny_model()
    net = build_adapter(model, "lora", rank=4, alpha=2, preset="attn-mlp")
    state = adapter_state_dict(net)
    fresh = tiny_model()
    default = load_adapter(fresh, state, apply=False)
    assert {p.device.type for m in default.loras for p in m.parameters()} == {"cpu"}
    meta = load_adapter(fresh, state, apply=False, device="meta")
    assert {p.device.type for m in meta.loras for p in m.parameters()} == {"meta"}

"""DDP and FSDP2 on 2 CPU processes (gloo) against one process on the same global micro-step, and
sharded checkpoints written at one world size and read at another. One launch serves every test."""

from __future__ import annotations

import pytest
import torch

from kohakumoss.adapters import build_adapter
from kohakumoss.distributed import current
from kohakumoss.distributed.checkpoint import load_sharded, save_sharded
from kohakumoss.distributed.shard import step_shares
from kohakumoss.distributed.wrap import all_reduce_grads, wrap_ddp, wrap_fsdp

from . import helpers as h
from .knob_run import run_knobs

ALL = list(range(len(h.GRIDS)))


def adapter(model) -> torch.nn.Module:
    net = build_adapter(model, algo="lora", rank=4, alpha=4.0, preset="attn-mlp")
    net.to(torch.float32)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():  # nonzero up weights, else the down weights' gradients are all zero
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return net


def two_micro_steps(forward, picks, world, ddp=None) -> None:
    """Two accumulated micro-steps (DDP: the first without a gradient sync)."""
    ctx = (
        ddp.no_sync()
        if ddp is not None
        else torch.autograd.graph.saved_tensors_hooks(lambda x: x, lambda x: x)
    )
    with ctx:
        h.share_loss(forward, picks, world, micro_step=0).backward()
    h.share_loss(forward, picks, world, micro_step=1).backward()


def stepped(model, picks, world) -> torch.optim.AdamW:
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    h.share_loss(model, picks, world).backward()
    opt.step()
    return opt


def full_params(model) -> dict[str, torch.Tensor]:
    return {
        n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().cpu().clone()
        for n, p in model.named_parameters()
    }


def on_each_rank(k: dict) -> dict:
    world = current()
    dev = k["DEVICE"]
    picks = step_shares(h.items(), world.size)[world.rank]
    out = {"rank": world.rank, "size": world.size, "backend": world.backend, "device": k["DEVICE"]}

    model = h.model(device=dev)
    net = adapter(model)
    ddp = wrap_ddp(model, net)
    two_micro_steps(ddp, picks, world.size, ddp)
    out["ddp_lora"] = h.grads(net)

    model = h.model(device=dev).requires_grad_(True)
    ddp = wrap_ddp(model)
    two_micro_steps(ddp, picks, world.size, ddp)
    out["ddp_full"] = h.grads(model)

    model = wrap_fsdp(h.model(device=dev).requires_grad_(True))
    two_micro_steps(model, picks, world.size)  # FSDP2 reduce-scatters each micro-step's gradients
    out["fsdp_full"] = h.grads(model)

    model = h.model(device=dev).requires_grad_(False)
    net = adapter(model)
    wrap_fsdp(model)  # the frozen base sharded, the adapter whole on each rank
    two_micro_steps(model, picks, world.size)
    all_reduce_grads(net.parameters())
    out["fsdp_lora"] = h.grads(net)

    # a sharded checkpoint written here (world 2), read by the test at world 1
    model = wrap_fsdp(h.model(device=dev).requires_grad_(True))
    opt = stepped(model, picks, world.size)
    save_sharded(k["ROOT"] + "/from2", model, [opt], world)
    out["from2_params"] = full_params(model)
    # a world-1 checkpoint (written by the test) read into this FSDP2-sharded model
    model = wrap_fsdp(h.model(device=dev).requires_grad_(True))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    load_sharded(k["ROOT"] + "/from1", model, [opt])
    out["from1_params"] = full_params(model)
    out["from1_exp_avg"] = {
        n: opt.state[p]["exp_avg"].full_tensor().cpu().clone() for n, p in model.named_parameters()
    }
    return out


def launch_ranks(root, device: str = "cpu") -> tuple:
    """A world-1 checkpoint for the ranks to read, then 2 ranks on `device` ('cpu': gloo, 'cuda': NCCL)."""
    single = h.model(device=device).requires_grad_(True)
    opt = stepped(single, ALL, 1)
    save_sharded(root / "from1", single, [opt], current())
    expected1 = (
        full_params(single),
        {n: opt.state[p]["exp_avg"].cpu().clone() for n, p in single.named_parameters()},
    )
    k = {"DISTRIBUTED": "ddp", "DEVICES": 2, "DEVICE": device, "DIST_TIMEOUT": 60.0, "ROOT": str(root)}
    return run_knobs(k, on_each_rank), root, expected1


def close(a: dict, b: dict, rtol=1e-4, atol=1e-6) -> None:
    assert a.keys() == b.keys() and a
    for n in a:
        assert torch.allclose(a[n], b[n], rtol=rtol, atol=atol), (n, (a[n] - b[n]).abs().max())


def check_ddp(out: dict, device: str = "cpu") -> None:
    model = h.model(device=device)
    net = adapter(model)
    two_micro_steps(model, ALL, 1)
    close(out["ddp_lora"], h.grads(net))
    model = h.model(device=device).requires_grad_(True)
    two_micro_steps(model, ALL, 1)
    expect = h.grads(model)
    close(out["ddp_full"], expect)
    # the check can fail: one rank's share alone is not the step's gradient
    alone = h.model(device=device).requires_grad_(True)
    two_micro_steps(alone, step_shares(h.items(), 2)[0], 1)
    with pytest.raises(AssertionError):
        close(h.grads(alone), expect)


def check_fsdp(out: dict) -> None:
    close(out["fsdp_full"], out["ddp_full"])
    close(out["fsdp_lora"], out["ddp_lora"])


def check_dcp(out: dict, root, expected1: tuple, device: str = "cpu") -> None:
    params1, exp_avg1 = expected1
    assert not (root / "from2.dcp-tmp").exists()
    model = h.model(device=device).requires_grad_(True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    load_sharded(root / "from2", model, [opt])  # written by 2 ranks, read by 1
    close(full_params(model), out["from2_params"], rtol=0, atol=0)
    assert all(len(opt.state[p]) for p in model.parameters())
    close(out["from1_params"], params1, rtol=0, atol=0)  # written by 1, read by 2 (sharded)
    close(out["from1_exp_avg"], exp_avg1, rtol=0, atol=0)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return launch_ranks(tmp_path_factory.mktemp("dcp"))


def test_workers_ran_as_two_gloo_ranks(ranks):
    out, _, _ = ranks
    assert (out["rank"], out["size"], out["backend"], out["device"]) == (0, 2, "gloo", "cpu")


def test_ddp_gradients_equal_one_process_on_the_same_global_batch(ranks):
    check_ddp(ranks[0])


def test_fsdp2_equals_ddp(ranks):
    check_fsdp(ranks[0])


def test_sharded_checkpoint_loads_at_another_world_size(ranks):
    check_dcp(*ranks)

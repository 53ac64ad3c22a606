"""A synthetic micro-step on the tiny model, and how one rank computes its share of it."""

from __future__ import annotations

import dataclasses

import torch

from kohakumoss.diffusion import TimestepConfig
from kohakumoss.distributed.shard import rank_weight, step_noise
from kohakumoss.model import MossBackbone, PackedSeq, get_preset
from kohakumoss.train.step import DeviceBatch, draw_step_noise, flow_loss
from kohakumoss_data.plan import PlannedItem
from kohakumoss_kernels import OpSet

# the tiny preset's structure, narrower and shallower: the CI machine has 2 cores for several processes
CFG = dataclasses.replace(get_preset("tiny"), dim=64, depth=2, num_heads=2, mlp_hidden=128, refiner_depth=1)
TCFG = TimestepConfig()  # logit-normal, resolution shift: sigmas depend on each image's size
GRIDS = [(4, 4), (3, 5), (2, 6), (5, 3), (4, 2)]
TEXT = [5, 7, 3, 6, 4]


def items() -> list[PlannedItem]:
    return [
        PlannedItem(f"k{i}", f"h{i}", "c", (h * 16, w * 16), (h * 16, w * 16), (0, 0), False, h * w, t, 0)
        for i, ((h, w), t) in enumerate(zip(GRIDS, TEXT))
    ]


def model(seed: int = 0, device: str | torch.device = "cpu") -> MossBackbone:
    torch.manual_seed(seed)
    m = MossBackbone(CFG, OpSet("eager", tune="off"))
    return m.init_weights(std=0.05, generator=torch.Generator().manual_seed(seed)).to(device)


def clean(seed: int = 1) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Each item's clean latent tokens [h*w, 128] and text [t, text_dim]."""
    g = torch.Generator().manual_seed(seed)
    x0 = [torch.randn(h * w, CFG.in_channels, generator=g) for h, w in GRIDS]
    text = [torch.randn(t, CFG.text_dim, generator=g) for t in TEXT]
    return x0, text


def local_batch(picks: list[int], device: str | torch.device = "cpu") -> DeviceBatch:
    x0, text = clean()
    seq = PackedSeq.build([TEXT[i] for i in picks], [GRIDS[i] for i in picks], torch.device(device))
    x0 = torch.cat([x0[i] for i in picks]).to(device)
    return DeviceBatch(x0, torch.cat([text[i] for i in picks]).to(device), seq)


def share_loss(forward, picks: list[int], world: int, reduction: str = "token", micro_step: int = 0):
    """This rank's weighted loss: summed over ranks / world, it is the whole step's loss."""
    step = items()
    device = next(forward.parameters()).device
    batch = local_batch(picks, device)
    sigma, noise = step_noise(draw_step_noise, 7, micro_step, step, picks, TCFG, device, torch.float32)
    loss = flow_loss(forward, batch, sigma, noise, torch.float32, "none", reduction)
    return loss * rank_weight(step, picks, world, reduction)


def grads(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    out = {}
    for n, p in module.named_parameters():
        if p.grad is not None:
            g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            out[n.replace("module.", "").replace("backbone.", "")] = g.detach().cpu().clone()
    return out

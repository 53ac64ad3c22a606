"""A job for an external `torchrun`: each rank joins through launch.run and reports what it saw."""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

from kohakumoss.distributed import current, run
from kohakumoss.distributed.config import DistributedConfig


def job(device: str) -> dict:
    world = current()
    total = torch.tensor([float(world.rank + 1)])
    dist.all_reduce(total)
    return {"rank": world.rank, "size": world.size, "device": device, "sum": float(total)}


if __name__ == "__main__":
    out = run(DistributedConfig(distributed="ddp", devices=2, dist_timeout=60.0), "cpu", job)
    with open(f"{sys.argv[1]}.{out['rank']}.json", "w") as f:
        json.dump(out, f)

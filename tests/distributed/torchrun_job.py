"""A job for an external `torchrun`: each rank joins through launch.run and reports what it saw."""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

from kohakumoss.distributed import current, run


def job(k: dict) -> dict:
    world = current()
    total = torch.tensor([float(world.rank + 1)])
    dist.all_reduce(total)
    return {"rank": world.rank, "size": world.size, "device": k["DEVICE"], "sum": float(total)}


if __name__ == "__main__":
    out = run({"DISTRIBUTED": "ddp", "DEVICES": 2, "DEVICE": "cpu", "DIST_TIMEOUT": 60.0}, job)
    with open(f"{sys.argv[1]}.{out['rank']}.json", "w") as f:
        json.dump(out, f)

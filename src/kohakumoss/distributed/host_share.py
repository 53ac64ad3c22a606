"""DDP with host optimizer states (OPTIMIZER_PLACEMENT 'host' / 'stream'): one copy of the fp32 masters per
node, shared by its ranks, and each optimizer state held by one rank of the node.

Every rank holds the same averaged gradients, so every rank would step the same masters to the same
values. Instead the node's ranks split the masters into contiguous runs of about equal bytes (by local
rank); each steps only its run (so it creates and holds only that run's optimizer states) into masters
that live once per node in shared memory (a file under /dev/shm, mapped by every local rank and unlinked
once mapped), then waits for the others (`PlacedOptimizer.share`'s barrier) and writes every stepped master
back to its device weights as before. Each node holds its own copy (all nodes step the same values).
Only members whose update reads one parameter at a time are split (`PER_PARAM`); Prodigy's estimate
looks across a group's parameters, so its ranks keep their own copies.

Checkpoints stay the one-process format: while rank 0 saves, its node's other ranks send it their runs'
states (`pipeline.main_holds_states`); the masters it reads are the node's shared ones.
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from kohakumoss.memory.engines.optimizer import PlacedOptimizer
from kohakumoss_common.log import get_logger

from .pipeline import main_holds_states
from .world import World

log = get_logger(__name__)

# members whose update of a parameter reads only that parameter's grad and states
PER_PARAM = (torch.optim.Adam, torch.optim.AdamW, torch.optim.Muon, torch.optim.Adafactor)
GIB = 1 << 30


def runs(sizes: list[int], parts: int) -> list[list[int]]:
    """Consecutive index runs, one per part, of about equal total size (an index goes to the part its
    middle falls in)."""
    total = sum(sizes)
    out: list[list[int]] = [[] for _ in range(parts)]
    before = 0
    for i, n in enumerate(sizes):
        part = min(parts - 1, int((before + n / 2) * parts // total)) if total else i * parts // len(sizes)
        out[part].append(i)
        before += n
    return out


def why_not_shared(optimizer, world: World) -> str | None:
    """Why this rank's node does not share `optimizer`'s masters, or None when it does."""
    if not isinstance(optimizer, PlacedOptimizer) or optimizer.placement == "gpu":
        return "the optimizer states are on the device"
    if world.local_size < 2:
        return "one rank on this node"
    other = [type(o).__name__ for o in optimizer.optimizers.values() if not isinstance(o, PER_PARAM)]
    if other:
        return f"{', '.join(other)} updates look across parameters: every rank keeps its own masters"
    if not optimizer.master_params():
        return "nothing trains"
    return None


def _shm_dir() -> Path:
    return Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())


def free_bytes(folder: Path) -> int:
    """Free bytes where the shared masters would go (a container's /dev/shm is often 64 MiB)."""
    return shutil.disk_usage(folder).free


@dataclass
class NodeShare:
    """This rank's part of its node's shared masters."""

    world: World
    group: dist.ProcessGroup | None
    mine: list[int]  # indices (into the optimizer's params) this rank steps
    flat: torch.Tensor  # the node's masters, one fp32 buffer in shared memory

    @contextmanager
    def main_holds_states(self, optimizer: PlacedOptimizer) -> Iterator[None]:
        """A collective: inside, rank 0's optimizer holds every state of its node (its state_dict is the
        one-process run's); ranks of other nodes send nothing (their states are the same values)."""
        masters = optimizer.master_params()
        same_node = self.world.rank - self.world.local_rank == 0
        owned = {id(masters[i]) for i in self.mine} if same_node else set()
        with main_holds_states(optimizer, owned, self.world):
            yield


def share_on_node(
    optimizer, world: World, group_for: Callable[[], dist.ProcessGroup | None], broadcast: bool
) -> NodeShare | None:
    """Put `optimizer`'s masters in memory shared by this node's ranks and split their steps between them
    (every rank calls this, in the same order). `group_for()` gives the group for host tensors (called
    only when the node shares); `broadcast`: first give every rank rank 0's masters (what DDP's constructor
    does for the device weights)."""
    if why := why_not_shared(optimizer, world):
        log.info(f"host masters: one copy per rank ({why})")
        return None
    group = group_for()
    masters = optimizer.master_params()
    sizes = [m.numel() for m in masters]
    total, folder = sum(sizes), _shm_dir()
    # every rank takes the same branch (the steps' barriers are collective): any node short of room, none shares
    room = torch.tensor([1.0 if world.local_rank != 0 or free_bytes(folder) >= 4 * total else 0.0])
    dist.all_reduce(room, op=dist.ReduceOp.MIN, group=group)
    if not room.item():
        log.info(
            f"host masters: one copy per rank ({4 * total / GIB:.3f} GiB do not fit in {folder} on some "
            "node: give it more room, e.g. docker --shm-size)"
        )
        return None
    if broadcast:
        for m in masters:
            dist.broadcast(m, src=0, group=group)
    token = [secrets.token_hex(8) if world.rank == 0 else None]
    dist.broadcast_object_list(token, src=0, group=group)
    path = folder / f"kohakumoss-masters-{token[0]}-{world.rank - world.local_rank}"
    if world.local_rank == 0:  # the node's first rank creates the file and fills it with its masters
        with open(path, "wb") as f:
            f.truncate(4 * total)
    try:
        if world.local_rank == 0:
            flat = torch.from_file(str(path), shared=True, size=total, dtype=torch.float32)
            offset = 0
            for m, n in zip(masters, sizes, strict=True):
                flat[offset : offset + n].copy_(m.reshape(-1))
                offset += n
        dist.barrier(group=group)
        if world.local_rank != 0:
            flat = torch.from_file(str(path), shared=True, size=total, dtype=torch.float32)
        dist.barrier(group=group)  # every rank has mapped it: the name can go
    finally:
        if world.local_rank == 0:
            path.unlink(missing_ok=True)
    storage, offset = flat.untyped_storage(), 0
    with torch.no_grad():
        for m, n in zip(masters, sizes, strict=True):
            m.set_(storage, offset, m.shape, torch.empty(m.shape, device="meta").stride())
            offset += n
    mine = runs(sizes, world.local_size)[world.local_rank]
    optimizer.share(mine, lambda: dist.barrier(group=group))
    own = sum(sizes[i] for i in mine)
    log.info(
        f"host masters: 1 copy per node ({4 * total / GIB:.3f} GiB shared by {world.local_size} ranks, "
        f"{4 * total * world.local_size / GIB:.3f} GiB before); rank {world.rank} steps {len(mine)} of "
        f"{len(masters)} parameters ({4 * own / GIB:.3f} GiB of masters) and holds only their optimizer states"
    )
    return NodeShare(world, group, mine, flat)

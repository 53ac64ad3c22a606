"""Where attention reads the batch's sequence lengths: on the host while they repeat, on the device once
they vary.

The fastest attention on the H200 (SDPA per run of equal-length samples) reads the lengths on the host: a
CUDA graph captured with it holds one batch's lengths, and an eager step builds cuDNN plans and Triton
specializations for each new length. Backends that read the lengths on the device (the Triton varlen
kernel) serve every length with one graph and one set of kernels, at some cost per call. So a run starts
on the host and switches (`OpSet.set_lengths("device")`, once) when LENGTH_MISSES batches arrived whose
shapes were seen before with other lengths: captions of one length keep the faster attention, varied
ones stop paying per length. Used by the graphed step (`graphs.StepGraphs`) and by a padded eager step
(`runner.StepRunner`).
"""

from __future__ import annotations

from collections.abc import Hashable

from kohakumoss_common.log import get_logger

log = get_logger("kohakumoss.train.lengths")

LENGTH_MISSES = 3  # batches of seen shapes with new lengths before the ops read lengths on the device


class LengthSwitch:
    """`observe(shape_key, exact_key)` per micro-step; True on the one that switched the ops."""

    def __init__(self, ops, gain: str, misses: int = LENGTH_MISSES):
        self.ops = ops  # the model's OpSet (anything with set_lengths)
        self.gain = gain  # what the switch buys, for the log line
        self.limit = misses
        self.shapes: set[Hashable] = set()
        self.exact: set[Hashable] = set()
        self.misses = 0
        self.switched = False

    def observe(self, shape_key: Hashable, exact_key: Hashable) -> bool:
        if self.switched:
            return False
        self.misses += int(shape_key in self.shapes and exact_key not in self.exact)
        self.shapes.add(shape_key)
        self.exact.add(exact_key)
        if self.misses < self.limit:
            return False
        self.switched = True
        self.ops.set_lengths("device")
        log.info(
            f"batches differ in sequence lengths alone ({self.misses} so far): attention now reads the "
            f"lengths on the device, so {self.gain}"
        )
        return True

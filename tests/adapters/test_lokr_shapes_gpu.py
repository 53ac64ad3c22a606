"""GPU (H200): LyCORIS's fused kernels for LoKr, tuned from an empty kernel table as in a user's first run,
probed (forward and backward in a child process) at every linear shape of moss-image-5b with the rows each
sees in a 1 MP step of two images. Where a kernel faults (lycoris-lora 4.1.3 on the H200: an illegal memory
access in its LoKr backward at in=out=3072 with 2 rows), the probe must survive it, name the shape, and
leave this process on lycoris's torch backend, which must then run that shape."""

from __future__ import annotations

import os

import pytest
import torch

from kohakumoss.adapters import AdapterSpec, kernel_probe
from kohakumoss.model import get_preset, linear_rows
from kohakumoss.model.backbone import MossBackbone

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_lokr_probe_at_the_5b_shapes_leaves_a_backend_that_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("LYCORIS_KERNEL_CACHE_DIR", str(tmp_path / "lycoris"))  # nothing tuned yet
    monkeypatch.setenv(kernel_probe.BACKEND_ENV, "auto")  # recorded, so the probe's setting is undone after
    monkeypatch.delenv(kernel_probe.BACKEND_ENV)
    spec = AdapterSpec(algo="lokr", rank=32, alpha=32.0, preset="full", bypass=True)  # user_runs' adapter
    with torch.device("meta"):
        model = MossBackbone(get_preset("moss-image-5b"))
    shapes = kernel_probe.probe_shapes(model, spec, lambda name: linear_rows(name, 2 * 4096, 2 * 256, 2))
    cuda = torch.device("cuda")
    got = kernel_probe.probe_lycoris_kernels(spec, shapes, torch.bfloat16, cuda, tmp_path / "first")
    print(f"probe: ok={got.ok} failed={got.failed} in {got.seconds:.0f} s: {got.message}")
    if got.ok:
        assert kernel_probe.BACKEND_ENV not in os.environ
        return
    assert got.failed in shapes, f"the probe named no shape it was running: {got}"
    assert os.environ[kernel_probe.BACKEND_ENV] == "torch"
    # the child inherits the torch backend: the shape that faulted now runs
    again = kernel_probe.probe_lycoris_kernels(spec, [got.failed], torch.bfloat16, cuda, tmp_path / "again")
    assert again.ok, f"lycoris's torch backend failed at {got.failed} too: {again.message}"

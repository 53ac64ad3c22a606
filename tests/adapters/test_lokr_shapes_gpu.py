"""GPU (H200): LyCORIS's fused kernels for LoKr, tuned from an empty kernel table as in a user's first run,
pass the kernel probe (forward and backward in a child process) at every linear shape of moss-image-5b
with the rows each sees in a 1 MP step of two images. A kernel that faults fails this test with the
shape the child was running."""

from __future__ import annotations

import pytest
import torch

from kohakumoss.adapters import AdapterSpec, kernel_probe
from kohakumoss.model import get_preset, linear_rows
from kohakumoss.model.backbone import MossBackbone

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_lokr_kernels_pass_the_probe_at_the_5b_models_shapes(tmp_path, monkeypatch):
    monkeypatch.setenv("LYCORIS_KERNEL_CACHE_DIR", str(tmp_path / "lycoris"))  # nothing tuned yet
    monkeypatch.delenv(kernel_probe.BACKEND_ENV, raising=False)
    spec = AdapterSpec(algo="lokr", rank=32, alpha=32.0, preset="full", bypass=True)  # user_runs' adapter
    with torch.device("meta"):
        model = MossBackbone(get_preset("moss-image-5b"))
    shapes = kernel_probe.probe_shapes(model, spec, lambda name: linear_rows(name, 2 * 4096, 2 * 256, 2))
    got = kernel_probe.probe_lycoris_kernels(spec, shapes, torch.bfloat16, torch.device("cuda"), tmp_path)
    assert got.ok, f"LoKr failed at (in, out, rows) {got.failed}: {got.message}"

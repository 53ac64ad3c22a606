"""`python -m kohakumoss.model.forward`: one forward of a checkpoint on [B, C, h, w] latents equals the
model called directly on the packed tokens; masks drop text tokens; bad inputs are named."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from kohakumoss.model import PackedSeq, get_preset
from kohakumoss.model.forward import main
from kohakumoss.model.io import save_backbone
from kohakumoss_kernels import OpSet

from .helpers import random_model

CFG = get_preset("tiny")
ROWS, COLS, S = 3, 5, 7


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("forward")
    model = random_model(CFG, seed=3)
    model.ops = OpSet("eager")
    path = save_backbone(model, folder / "dit", layout="comfy", prefix="moss_image_tiny")[0]
    g = torch.Generator().manual_seed(1)
    inputs = {
        "latents": torch.randn(2, CFG.in_channels, ROWS, COLS, generator=g),
        "sigma": torch.tensor([0.9, 0.25]),
        "text": torch.randn(2, S, CFG.text_dim, generator=g),
        "text_mask": torch.tensor([[1, 1, 0, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1]], dtype=torch.bool),
    }
    save_file(inputs, str(folder / "in.safetensors"))
    return model, path, inputs, folder


def direct(model, latents, sigma, texts):
    """The model on hand-packed tokens: sample b's (row, col) token is latents[b, :, row, col]."""
    B = latents.shape[0]
    img = torch.cat([latents[b].permute(1, 2, 0).reshape(ROWS * COLS, -1) for b in range(B)])
    seq = PackedSeq.build([t.shape[0] for t in texts], [(ROWS, COLS)] * B)
    with torch.no_grad():
        v = model(img, torch.cat(texts), sigma, seq)
    return torch.stack(
        [v[b * ROWS * COLS : (b + 1) * ROWS * COLS].T.reshape(-1, ROWS, COLS) for b in range(B)]
    )


def test_forward_cli_matches_the_model(checkpoint):
    model, path, inputs, folder = checkpoint
    assert (
        main(
            [
                "--weights",
                str(path),
                "--inputs",
                str(folder / "in.safetensors"),
                "--out",
                str(folder / "v.st"),
            ]
        )
        == 0
    )
    v = load_file(str(folder / "v.st"))["velocity"]
    assert v.dtype == torch.float32 and v.shape == inputs["latents"].shape
    mask = inputs["text_mask"]
    texts = [inputs["text"][0, mask[0]], inputs["text"][1]]
    assert texts[0].shape[0] == 4  # the masked tokens (one in the middle) are dropped
    want = direct(model, inputs["latents"], inputs["sigma"], texts)
    assert torch.equal(v, want)
    # each sample alone gives its own velocity: the batch does not mix samples
    alone = direct(model, inputs["latents"][:1], inputs["sigma"][:1], texts[:1])
    torch.testing.assert_close(v[:1], alone, rtol=1e-5, atol=1e-6)
    unmasked = direct(model, inputs["latents"][:1], inputs["sigma"][:1], [inputs["text"][0]])
    assert not torch.allclose(v[:1], unmasked, atol=1e-3)  # the mask mattered


def test_forward_cli_as_a_module_in_bf16_and_skip_layers(checkpoint):
    model, path, inputs, folder = checkpoint
    out = folder / "v_bf16.safetensors"
    cmd = [sys.executable, "-m", "kohakumoss.model.forward", "--weights", str(path.parent), "--inputs"]
    cmd += [str(folder / "in.safetensors"), "--out", str(out), "--dtype", "bf16", "--skip-layers", "1"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    v = load_file(str(out))["velocity"]
    mask = inputs["text_mask"]
    texts = [inputs["text"][0, mask[0]], inputs["text"][1]]
    img = torch.cat([inputs["latents"][b].permute(1, 2, 0).reshape(ROWS * COLS, -1) for b in range(2)])
    seq = PackedSeq.build([4, S], [(ROWS, COLS)] * 2)
    with torch.no_grad():
        want = model(img, torch.cat(texts), inputs["sigma"], seq, skip_layers=(1,))
    want = torch.stack([want[b * 15 : (b + 1) * 15].T.reshape(-1, ROWS, COLS) for b in range(2)])
    assert v.dtype == torch.float32
    assert ((v - want).norm() / want.norm()).item() < 0.05  # bf16 weights and activations


@pytest.mark.parametrize(
    "change, match",
    [
        ({"sigma": None}, r"in.safetensors: inputs need tensors \['sigma'\]"),
        (
            {"latents": torch.zeros(2, 16, ROWS, COLS)},
            r"latents \(2, 16, 3, 5\) is not \[B, 128, H/16, W/16\]",
        ),
        ({"text": torch.zeros(2, S, 8)}, r"text \(2, 7, 8\) is not \[2, S, 32\]"),
        ({"text_mask": torch.zeros(2, S)}, r"at least one text token per sample"),
    ],
)
def test_forward_cli_names_bad_inputs(checkpoint, tmp_path, capsys, change, match):
    _, path, inputs, _ = checkpoint
    bad = {k: v for k, v in {**inputs, **change}.items() if v is not None}
    save_file(bad, str(tmp_path / "in.safetensors"))
    assert (
        main(
            [
                "--weights",
                str(path),
                "--inputs",
                str(tmp_path / "in.safetensors"),
                "--out",
                str(tmp_path / "v"),
            ]
        )
        == 2
    )
    assert re.search(match, capsys.readouterr().err)
    assert not (tmp_path / "v").exists()


def test_forward_cli_refuses_skip_layers_outside_the_model(checkpoint, tmp_path, capsys):
    _, path, _, folder = checkpoint
    argv = ["--weights", str(path), "--inputs", str(folder / "in.safetensors"), "--out", str(tmp_path / "v")]
    assert main([*argv, "--skip-layers", str(CFG.depth)]) == 2
    assert "--skip-layers: [4] are not block indices of a 4-block model" in capsys.readouterr().err


@pytest.mark.gpu
def test_forward_cli_on_cuda_with_a_convrot_file(checkpoint, tmp_path):
    """`--device cuda` (the auto OpSet, the ConvRot weights un-rotated on the GPU) against the eager CPU run."""
    from .test_convrot import KITCHEN_MARKER, convrot_file

    _, _, _, folder = checkpoint
    path, _, _ = convrot_file(tmp_path, KITCHEN_MARKER)
    argv = ["--weights", str(path), "--inputs", str(folder / "in.safetensors")]
    assert main([*argv, "--out", str(tmp_path / "cpu.st")]) == 0
    assert main([*argv, "--out", str(tmp_path / "gpu.st"), "--device", "cuda"]) == 0
    assert main([*argv, "--out", str(tmp_path / "bf16.st"), "--device", "cuda", "--dtype", "bf16"]) == 0
    cpu, gpu, bf16 = (load_file(str(tmp_path / f))["velocity"] for f in ("cpu.st", "gpu.st", "bf16.st"))
    assert ((gpu - cpu).norm() / cpu.norm()).item() < 1e-3  # TF32 / kernel order at most
    assert ((bf16 - cpu).norm() / cpu.norm()).item() < 0.05

"""Parity against an independent implementation of the released model: the MLX port `moss-image-mlx`.

The port (moss_image_mlx 0.2.0, "exact port" of the official pipeline) is a test-only oracle from the dev
extra; src/ never imports it. A tiny random MossBackbone is written in the released `transformer/` layout
(config.json with the released field names, one safetensors file of the native state dict, `rope.bands`
included), loaded by the port's own `load_transformer`, and both run in float32 on the CPU. Each quantity
has its own test, so a drift names itself: modulations, rotary tables, text refiner, packed forward, skip
layers, the padded reference, the sampling schedule (bitwise), a seed's starting noise, and a sampler run.
Errors measured (2026-12, mlx 0.32.4 CPU): forwards ~1.5e-6, refiner ~1.2e-6, 4-step runs ~3e-6.
"""

from __future__ import annotations

import ast
import json
import platform
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from kohakumoss.model import MossBackbone, MossConfig, PackedSeq
from kohakumoss.model.reference import reference_forward
from kohakumoss.model.rope import rope_cos_sin
from kohakumoss_kernels import OpSet

try:
    import mlx.core as mx
    from moss_image_mlx import dit as port_dit
    from moss_image_mlx import pipeline as port_pipeline
    from moss_image_mlx import scheduler as port_scheduler
    from moss_image_mlx import torch_randn as port_randn

    PORT_ERROR = None
except ImportError as e:  # mlx has no wheel for this platform, or the dev extra is not installed
    PORT_ERROR = f"{type(e).__name__}: {e}"

# where pyproject's dev extra installs the port (its environment markers); elsewhere the tests skip
# (mlx's wheels need glibc >= 2.35)
_LIBC, _LIBC_VERSION = platform.libc_ver()
PORT_PLATFORM = (
    sys.platform == "linux"
    and platform.machine() == "x86_64"
    and sys.version_info >= (3, 11)
    and _LIBC == "glibc"
    and tuple(int(v) for v in _LIBC_VERSION.split(".")[:2]) >= (2, 35)
)
if PORT_ERROR is not None and not PORT_PLATFORM:
    pytest.skip(
        f"the MLX port oracle is not installed here ({PORT_ERROR}); the dev extra installs it on "
        "Linux x86_64 with Python >= 3.11 and glibc >= 2.35",
        allow_module_level=True,
    )

# the port hardcodes 2 refiner blocks and head_dim / 8 rotary bands; head_dim 64 here
CFG = MossConfig(
    dim=256, depth=3, num_heads=4, mlp_hidden=512, text_dim=64, time_freq_dim=256, in_channels=128
)
ROWS, COLS, N_TEXT, N_NEG = 6, 5, 7, 4  # a non-square latent grid
SIGMA = 0.73
FORWARD_TOL = 1e-5
TRAJECTORY_TOL = 1e-4


def rel_err(ours, port) -> float:
    a, b = np.asarray(ours, dtype=np.float64), np.asarray(port, dtype=np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Tiny matmuls: torch's threads only contend with mlx's on a shared 2-core machine (3x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def port_ready():
    if PORT_ERROR is not None:
        pytest.fail(
            f"the MLX port oracle cannot be imported ({PORT_ERROR}) on Linux x86_64 / Python >= 3.11 / "
            "glibc >= 2.35, where pyproject's dev extra installs it: pip install -e '.[dev]'"
        )
    mx.set_default_device(mx.cpu)


@pytest.fixture(scope="module")
def models(port_ready, tmp_path_factory):
    """(ours, the port's) with the same random weights, read by the port from the released layout."""
    torch.manual_seed(0)
    ours = MossBackbone(CFG, ops=OpSet("eager"))
    ours.init_weights(std=0.08, generator=torch.Generator().manual_seed(0)).eval()
    folder = tmp_path_factory.mktemp("moss") / "transformer"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps({"_class_name": "MOSSImageTransformer", **CFG.hf_config()})
    )
    state = {k: v.detach().contiguous() for k, v in ours.state_dict().items()}
    assert "rope.bands" in state
    save_file(state, str(folder / "diffusion_pytorch_model.safetensors"))
    port = port_dit.load_transformer(folder, dtype=mx.float32)
    return ours, port


@pytest.fixture(scope="module")
def inputs():
    g = torch.Generator().manual_seed(1)
    latents = torch.randn(1, CFG.in_channels, ROWS, COLS, generator=g)
    text = torch.randn(N_TEXT, CFG.text_dim, generator=g)
    return latents, text


def to_mx(t: torch.Tensor):
    return mx.array(t.detach().numpy())


def tokens(latents: torch.Tensor) -> torch.Tensor:
    """[1, C, h, w] -> [h * w, C], row-major tokens (the port's reshape / transpose)."""
    return latents[0].flatten(1).T.contiguous()


def ours_velocity(model, latents, text, sigma: float, skip=()) -> torch.Tensor:
    _, c, h, w = latents.shape
    seq = PackedSeq.build([text.shape[0]], [(h, w)])
    with torch.no_grad():
        v = model(tokens(latents), text, torch.tensor([sigma], dtype=torch.float32), seq, skip_layers=skip)
    return v.T.reshape(1, c, h, w)


def port_velocity(port, latents, text, sigma: float, skip=()) -> np.ndarray:
    t = float(np.float32(sigma) * np.float32(1000))  # the pipeline's timesteps: float32 sigma * 1000
    out = port(to_mx(latents), t, to_mx(text)[None], list(skip))
    return np.array(out)


def test_port_modulations(models):
    """time_embedding -> shared block modulation [6, d] and head modulation [2, d]."""
    ours, port = models
    with torch.no_grad():
        mod, head = ours.modulations(torch.tensor([SIGMA], dtype=torch.float32))
    p_mod, p_head = port.modulation(float(np.float32(SIGMA) * np.float32(1000)))
    errors = rel_err(mod[:, 0].numpy(), np.array(p_mod)[0]), rel_err(head[:, 0].numpy(), np.array(p_head)[0])
    assert max(errors) <= FORWARD_TOL, errors


def test_port_text_refiner(models, inputs):
    """text_embedder: projection and the two unmodulated refiner blocks, with each side's text RoPE."""
    ours, port = models
    _, text = inputs
    seq = PackedSeq.build([N_TEXT], [(ROWS, COLS)])
    cos, sin = rope_cos_sin(seq.positions, CFG.head_dim, CFG.rope_theta)
    with torch.no_grad():
        got = ours.text_embedder(text, seq, (cos[seq.text_index], sin[seq.text_index]), ours.ops)
    p_sin, p_cos = port.rope(ROWS, COLS, N_TEXT, mx.float32)
    n_img = ROWS * COLS
    want = port.text_embedder(to_mx(text)[None], (p_sin[:, n_img:], p_cos[:, n_img:]))
    err = rel_err(got.numpy(), np.array(want)[0])
    assert err <= FORWARD_TOL, err


def test_port_rope_tables(models):
    """The rotary phases of every joint token (image centred, then text), both halves of the head."""
    _, port = models
    seq = PackedSeq.build([N_TEXT], [(ROWS, COLS)])
    cos, sin = rope_cos_sin(seq.positions, CFG.head_dim, CFG.rope_theta)
    p_sin, p_cos = port.rope(ROWS, COLS, N_TEXT, mx.float32)
    np.testing.assert_allclose(torch.cat([cos, cos], -1).numpy(), np.array(p_cos)[0, :, 0], atol=1e-6)
    np.testing.assert_allclose(torch.cat([sin, sin], -1).numpy(), np.array(p_sin)[0, :, 0], atol=1e-6)


def test_port_backbone_forward(models, inputs):
    ours, port = models
    latents, text = inputs
    got = ours_velocity(ours, latents, text, SIGMA)
    want = port_velocity(port, latents, text, SIGMA)
    err = rel_err(got.numpy(), want)
    assert err <= FORWARD_TOL, err


def test_port_backbone_skip_layers(models, inputs):
    """Skip-layer guidance's branch: block 1 left out on both sides (and it changes the output)."""
    ours, port = models
    latents, text = inputs
    got = ours_velocity(ours, latents, text, SIGMA, skip={1})
    want = port_velocity(port, latents, text, SIGMA, skip=[1])
    err = rel_err(got.numpy(), want)
    assert err <= FORWARD_TOL, err
    assert rel_err(port_velocity(port, latents, text, SIGMA), want) > 1e-2  # the skip matters here


def test_port_padded_reference(models, inputs):
    """The padded reference forward (the ground truth of every kernel) against the port."""
    ours, port = models
    latents, text = inputs
    sigma = torch.tensor([SIGMA], dtype=torch.float32)
    for skip in ((), (1,)):
        (got,) = reference_forward(ours, [tokens(latents)], [text], [(ROWS, COLS)], sigma, skip_layers=skip)
        want = port_velocity(port, latents, text, SIGMA, skip=skip)
        err = rel_err(got.T.reshape(1, -1, ROWS, COLS).numpy(), want)
        assert err <= FORWARD_TOL, (skip, err)


SCHEDULE_STEPS = (1, 2, 8, 28, 50)


@pytest.mark.parametrize("shift", [5.0, 3.0])
def test_port_schedule_bitwise(port_ready, shift):
    """The released schedule (snapped to the training grid, duplicates dropped, 0 appended): same bits."""
    from kohakumoss.diffusion import released_sigmas

    for steps in SCHEDULE_STEPS:
        ours = released_sigmas(steps, shift).numpy()
        port = port_scheduler.sigmas_for(steps, shift=shift)
        assert ours.dtype == port.dtype == np.float32, (steps, ours.dtype, port.dtype)
        assert ours.shape == port.shape and np.array_equal(ours.view(np.uint32), port.view(np.uint32)), (
            steps,
            ours.tolist(),
            port.tolist(),
        )


def test_port_initial_noise(port_ready):
    """A seed's starting noise as the released pipeline draws it (the port reproduces torch's CPU randn
    in numpy to ~2e-6), laid out as our row-major latent tokens."""
    from kohakumoss.diffusion import initial_noise

    ours = initial_noise((ROWS, COLS), 42, CFG.in_channels)
    port = port_randn.randn((1, CFG.in_channels, ROWS, COLS), 42)
    np.testing.assert_allclose(ours.numpy(), tokens(torch.from_numpy(port)).numpy(), atol=1e-5, rtol=0)


TRAJECTORY_STEPS, TRAJECTORY_CFG, TRAJECTORY_SEED = 4, 3.0, 7


@pytest.mark.parametrize("slg_stop", [1.0, 0.5], ids=["skip-every-step", "skip-first-half"])
def test_port_sampler_trajectory(models, slg_stop):
    """A 4-step CFG 3 run whose unconditional branch leaves out block 1 (the whole run, or its first
    half), from the same seed's noise (ours draws it from the seed, the port gets torch's draw): final
    latents. The half-window run takes both of our sampler's paths (separate calls while skipping, one
    packed cond + uncond call after)."""
    from kohakumoss.diffusion import SamplerConfig, euler_sample

    ours, port = models
    g = torch.Generator().manual_seed(2)
    positive = torch.randn(N_TEXT, CFG.text_dim, generator=g)
    negative = torch.randn(N_NEG, CFG.text_dim, generator=g)
    config = SamplerConfig(
        steps=TRAJECTORY_STEPS,
        cfg_scale=TRAJECTORY_CFG,
        shift=5.0,
        uncond_skip_layers=(1,),
        slg_start=0.0,
        slg_stop=slg_stop,
    )
    (got,) = euler_sample(
        ours, [positive], [negative], [(ROWS, COLS)], [TRAJECTORY_SEED], config, CFG.in_channels
    )

    noise = torch.randn(
        1, CFG.in_channels, ROWS, COLS, generator=torch.Generator().manual_seed(TRAJECTORY_SEED)
    )
    request = port_pipeline.Request(
        prompt="",
        width=16 * COLS,
        height=16 * ROWS,
        steps=TRAJECTORY_STEPS,
        guidance=TRAJECTORY_CFG,
        shift=5.0,
        seed=TRAJECTORY_SEED,
        uncond_skip_layers=[1],
        slg_start=0.0,
        slg_stop=slg_stop,
    )
    want = port_pipeline._sample(
        port, request, to_mx(positive)[None], to_mx(negative)[None], to_mx(noise), None
    )
    want_tokens = tokens(torch.from_numpy(np.array(want)))
    err = rel_err(got.numpy(), want_tokens.numpy())
    assert err <= TRAJECTORY_TOL, err
    assert rel_err(tokens(noise).numpy(), want_tokens.numpy()) > 0.1  # the run moved the latents


def test_port_is_test_only():
    """The oracle stays in the tests: no module under src/ imports mlx, mlx_lm or moss_image_mlx."""
    src = Path(__file__).resolve().parents[2] / "src"
    oracle = {"mlx", "mlx_lm", "moss_image_mlx"}
    bad = []
    for path in sorted(src.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = {node.module.split(".")[0]}
            else:
                continue
            if names & oracle:
                bad.append(f"{path.relative_to(src)} imports {sorted(names & oracle)}")
    assert list(src.rglob("*.py")) and not bad, bad

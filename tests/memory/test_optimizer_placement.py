"""PlacedOptimizer: 'host' and 'stream' give the plain ('gpu') path's parameters (fp32 on CPU, bf16 on CUDA)."""

from __future__ import annotations

import functools
import io
from collections import Counter

import pytest
import torch
from torch import nn

from kohakumoss.memory.engines.grad_offload import GradOffload
from kohakumoss.memory.engines.optimizer import MASTERS_KEY, PlacedOptimizer, default_chunks
from kohakumoss.optim.build import build_adamw, build_full_ft_optimizer
from kohakumoss.optim.combined import CombinedOptimizer
from kohakumoss_common.errors import ConfigError

STEPS, ACCUM, CLIP = 4, 3, 0.5


class Tiny(nn.Module):
    """Names that build_full_ft_optimizer splits: layers.N.proj.{q,ffn_down}.weight go to Muon."""

    def __init__(self, dim: int = 8, depth: int = 2):
        super().__init__()
        self.embed = nn.Linear(4, dim)
        self.layers = nn.ModuleList()
        for _ in range(depth):
            block = nn.Module()
            block.proj = nn.ModuleDict(
                {"q": nn.Linear(dim, dim, bias=False), "ffn_down": nn.Linear(dim, dim)}
            )
            self.layers.append(block)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 3)
        self.unused = nn.Linear(2, 2)  # never gets a grad: must not be stepped (weight decay would move it)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for b in self.layers:
            x = x + b.proj["ffn_down"](torch.tanh(b.proj["q"](x)))
        return self.head(self.norm(x))


def make_model(seed: int = 0, device: str = "cpu", dtype: torch.dtype = torch.float32) -> Tiny:
    torch.manual_seed(seed)
    return Tiny().to(device=device, dtype=dtype)


def build(kind: str, model: nn.Module) -> CombinedOptimizer:
    if kind == "muon_adamw":
        return build_full_ft_optimizer(model, lr=2e-2, weight_decay=0.05)
    weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
    biases = [p for n, p in model.named_parameters() if not n.endswith("weight")]
    groups = [  # LoRA+ style: a second group at 16x the LR
        {"params": weights, "lr": 1e-2, "weight_decay": 0.1},
        {"params": biases, "lr": 1.6e-1, "weight_decay": 0.0},
    ]
    return build_adamw(groups, lr=1e-2)


def micro_loss(model: nn.Module, step: int, micro: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * step + micro)
    x = torch.randn(5, 4, generator=g)
    y = torch.randn(5, 3, generator=g)
    p = next(model.parameters())
    out = model(x.to(p.device, p.dtype)).float()
    return (out - y.to(p.device)).pow(2).mean()


def place(opt, model, placement, offload=False, write_back=None, chunked=True):
    if placement == "gpu":
        return PlacedOptimizer(opt, "gpu")
    params = opt.params()
    go = GradOffload(params) if offload else None
    chunks = [list(b.parameters()) for b in model.layers] if chunked else None
    return PlacedOptimizer(
        opt, placement, grad_offload=go, write_back=write_back, chunk_params=chunks, chunk_bytes=256
    )


def train(model, po, start: int, stop: int, accum: int = ACCUM, clip: float = CLIP) -> list[float]:
    base = [g.setdefault("base_lr", g["lr"]) for g in po.param_groups]
    norms = []
    for step in range(start, stop):
        for g, lr in zip(po.param_groups, base, strict=True):  # what LRSchedule.apply does
            g["lr"] = lr * (1.0 - 0.1 * step)
        for micro in range(accum):
            (micro_loss(model, step, micro) / accum).backward()
        norms.append(float(po.clip_grad_norm_(clip)))
        po.step()
        po.zero_grad(set_to_none=True)
    return norms


def run(kind: str, placement: str, offload: bool = False, steps: int = STEPS, **kw):
    model = make_model()
    po = place(build(kind, model), model, placement, offload, **kw)
    norms = train(model, po, 0, steps)
    return model, po, norms


@functools.cache
def plain(kind: str, steps: int = STEPS) -> tuple[dict[str, torch.Tensor], list[float]]:
    """The reference: the plain ('gpu' placement) run's final parameters and clip norms."""
    model, _, norms = run(kind, "gpu", steps=steps)
    return {n: p.detach().clone() for n, p in model.named_parameters()}, norms


def assert_same(ref: dict[str, torch.Tensor], model: nn.Module, atol: float = 1e-6) -> None:
    assert set(ref) == {n for n, _ in model.named_parameters()}
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.detach().float().cpu(), ref[n], atol=atol, rtol=0, msg=n)


KINDS = ["adamw_groups", "muon_adamw"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "placement, offload", [("host", False), ("host", True), ("stream", False), ("stream", True)]
)
def test_placement_matches_the_plain_path(kind, placement, offload):
    ref, ref_norms = plain(kind)
    model, po, norms = run(kind, placement, offload)
    assert_same(ref, model)
    assert norms == pytest.approx(ref_norms, rel=1e-6)
    assert ref_norms[0] > CLIP  # the clip was active
    start = make_model()
    assert not torch.equal(start.layers[0].proj["q"].weight, model.layers[0].proj["q"].weight)
    torch.testing.assert_close(model.unused.weight, start.unused.weight, atol=0, rtol=0)  # no grad, no step
    for p, m in zip(po.params(), po.master_params(), strict=True):
        assert m.device.type == "cpu" and m.dtype == torch.float32 and m is not p
        torch.testing.assert_close(m, p.detach(), atol=0, rtol=0)


@pytest.mark.parametrize("placement", ["gpu", "host"])
def test_adamw_steps_with_the_fused_kernel_and_the_same_numbers(placement):
    """'host' and 'gpu' switch AdamW to torch's fused kernel (on the CPU ~9x foreach's speed); the
    result is foreach's; Muon keeps its own."""
    model = make_model()
    foreach = place(build("adamw_groups", model), model, "gpu")
    for g in foreach.param_groups:
        g["fused"], g["foreach"] = False, True
    norms = train(model, foreach, 0, STEPS)
    fused_model, po, fused_norms = run("adamw_groups", placement)
    assert all(g["fused"] and not g["foreach"] for g in po.param_groups)
    assert_same({n: p.detach().clone() for n, p in model.named_parameters()}, fused_model)
    assert fused_norms == pytest.approx(norms, rel=1e-6)
    _, muon, _ = run("muon_adamw", placement)
    assert not muon.optimizers["muon"].param_groups[0].get("fused")
    assert all(g["fused"] for g in muon.optimizers["adamw"].param_groups)


def test_stream_default_chunks_match_too():
    ref, _ = plain("muon_adamw")
    model, po, _ = run("muon_adamw", "stream", chunked=False)
    assert len(po._chunks) > 1
    assert_same(ref, model)


def test_default_chunks_split_by_bytes():
    assert default_chunks([10, 10, 10, 100, 1], chunk_bytes=80) == [[0, 1], [2], [3], [4]]
    assert default_chunks([], chunk_bytes=80) == []


@pytest.mark.parametrize("placement", ["gpu", "host", "stream"])
@pytest.mark.parametrize("max_norm", [0.1, 1e9])
def test_clip_equals_torch_clip(placement, max_norm):
    ref = make_model()
    micro_loss(ref, 0, 0).backward()
    ref_norm = float(torch.nn.utils.clip_grad_norm_(list(ref.parameters()), max_norm))
    model = make_model()
    po = place(build("adamw_groups", model), model, placement)
    micro_loss(model, 0, 0).backward()
    assert float(po.clip_grad_norm_(max_norm)) == pytest.approx(ref_norm, rel=1e-6)
    if placement == "host":
        grads = [m.grad for m in po.master_params()]
    elif placement == "stream":  # the coefficient is applied when the chunk's fp32 grads are made
        grads = [None if p.grad is None else p.grad * po._grad_coef for p in po.params()]
    else:
        grads = [p.grad for p in po.params()]
    names = {id(p): n for n, p in model.named_parameters()}
    ref_grads = {n: p.grad for n, p in ref.named_parameters()}
    assert len(grads) == len(po.params())
    for p, g in zip(po.params(), grads, strict=True):
        want = ref_grads[names[id(p)]]
        if want is None:
            assert g is None
        else:
            torch.testing.assert_close(g, want, atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize("placement", ["host", "stream"])
def test_write_back_is_called_once_per_param_per_step(placement):
    calls: Counter = Counter()

    def write_back(param, master):
        assert master.device.type == "cpu" and master.dtype == torch.float32
        calls[id(param)] += 1
        param.data.copy_(master)

    ref, _ = plain("muon_adamw")
    model = make_model()
    po = place(build("muon_adamw", model), model, placement, write_back=write_back)
    for step in range(STEPS):
        calls.clear()
        train(model, po, step, step + 1)
        stepped = [p for p in po.params() if p is not model.unused.weight and p is not model.unused.bias]
        assert calls == Counter({id(p): 1 for p in stepped})
    assert_same(ref, model)


def roundtrip(state: dict) -> dict:
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "saved_from, loaded_into", [("host", "host"), ("host", "stream"), ("stream", "host"), ("host", "gpu")]
)
def test_state_dict_round_trip_continues_like_uninterrupted(kind, saved_from, loaded_into):
    ref, _ = plain(kind)
    first, po, _ = run(kind, saved_from, steps=2)
    state = roundtrip(po.state_dict())
    weights = {n: p.detach().clone() for n, p in first.named_parameters()}
    assert len(state[MASTERS_KEY]) == len(po.params())

    model = make_model(seed=1)  # other init: the checkpoint must carry everything
    model.load_state_dict(weights)
    resumed = place(build(kind, model), model, loaded_into)
    resumed.load_state_dict(state)
    for g in resumed.param_groups:  # the schedule keeps its base LR in the group (as the loop's does)
        assert "base_lr" in g
    train(model, resumed, 2, STEPS)
    assert_same(ref, model)


def test_state_dict_holds_host_states():
    _, po, _ = run("muon_adamw", "stream", steps=1)
    state = po.state_dict()
    for name, opt in po.optimizers.items():
        assert opt.state, name
        for st in opt.state.values():
            for v in st.values():
                if isinstance(v, torch.Tensor):
                    assert v.device.type == "cpu"
    assert set(state) == {"muon", "adamw", MASTERS_KEY}


def test_bad_setups_are_refused():
    model = make_model()
    opt = build("adamw_groups", model)
    offload = GradOffload(opt.params())
    with pytest.raises(ConfigError, match="GRAD_OFFLOAD"):
        PlacedOptimizer(opt, "gpu", grad_offload=offload)
    offload.remove()  # its hooks would take the grads below
    with pytest.raises(ConfigError, match="OPTIMIZER_PLACEMENT"):
        PlacedOptimizer(opt, "disk")
    micro_loss(model, 0, 0).backward()
    opt.step()
    with pytest.raises(ConfigError, match="before its first step"):
        PlacedOptimizer(opt, "host")


# -- CUDA: bf16 device params, fp32 masters -------------------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
# 'stream' steps with the same device kernels as the reference: fp32 rounding only. 'host' runs AdamW on the
# CPU (fp32 rounding only) and Muon's bf16 Newton-Schulz on the CPU, whose bf16 roundings differ from the
# GPU's; a Muon step moves an entry by ~4e-3 here, so 1e-3 still catches a missed or doubled step.
GPU_ATOL = {("stream", "adamw_groups"): 1e-5, ("stream", "muon_adamw"): 1e-5}
GPU_ATOL |= {("host", "adamw_groups"): 1e-5, ("host", "muon_adamw"): 1e-3}


def injected_loss(model: nn.Module, step: int, micro: int) -> torch.Tensor:
    """A loss whose grad w.r.t. each param is a fixed bf16-representable tensor (the same on both paths)."""
    total = 0.0
    for i, p in enumerate(model.parameters()):
        if p is model.unused.weight or p is model.unused.bias:
            continue
        g = torch.Generator().manual_seed(10_000 * step + 100 * micro + i)
        grad = torch.randn(p.shape, generator=g).bfloat16().float().to(p.device)
        total = total + (p.float() * grad).sum()
    return total


def train_injected(model, po, steps: int, accum: int) -> None:
    for step in range(steps):
        for micro in range(accum):
            injected_loss(model, step, micro).backward()
        po.clip_grad_norm_(1e9 if accum == 1 else 50.0)
        po.step()
        po.zero_grad(set_to_none=True)


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "placement, offload", [("host", False), ("host", True), ("stream", False), ("stream", True)]
)
def test_cuda_bf16_placement_matches_fp32_plain(kind, placement, offload):
    accum = (
        3 if offload else 1
    )  # without offload bf16 grads would accumulate in bf16 (the plain path in fp32)
    ref = make_model(device="cuda")
    with torch.no_grad():  # both start from the same bf16-representable weights (the masters start from bf16)
        for p in ref.parameters():
            p.copy_(p.bfloat16().float())
    train_injected(ref, place(build(kind, ref), ref, "gpu"), 3, accum)
    model = make_model(device="cuda", dtype=torch.bfloat16)
    po = place(build(kind, model), model, placement, offload)
    train_injected(model, po, 3, accum)
    torch.cuda.synchronize()
    masters = dict(zip([id(p) for p in po.params()], po.master_params(), strict=True))
    for (n, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        m = masters[id(p)]
        atol = GPU_ATOL[placement, kind]
        torch.testing.assert_close(m, q.detach().cpu(), atol=atol, rtol=0, msg=lambda e, n=n: f"{n}: {e}")
        torch.testing.assert_close(
            p.detach().cpu(), m.bfloat16(), atol=0, rtol=0, msg=lambda e, n=n: f"{n}: {e}"
        )
    if offload:
        po.grad_offload.remove()

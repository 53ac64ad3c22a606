"""OPTIMIZER choices: each through the checkpoint / resume path (20 steps straight == 10, save, rebuild,
load, 10: bit for bit), the memory engines' placements (run where they can, refused by name where not),
schedule-free's train / eval weights, and `package.Class` names with OPTIMIZER_ARGS."""

from __future__ import annotations

import importlib.util
import random

import numpy as np
import pytest
import torch

from kohakumoss.adapters import adapter_param_groups, build_adapter
from kohakumoss.checkpoint.folders import resolve_checkpoint
from kohakumoss.checkpoint.read import load_checkpoint
from kohakumoss.checkpoint.rng import restore_rng
from kohakumoss.checkpoint.state import load_trainable_state, trainable_state
from kohakumoss.checkpoint.write import save_checkpoint
from kohakumoss.memory.engines.optimizer import PlacedOptimizer
from kohakumoss.optim.build import (
    build_adapter_optimizer,
    build_full_ft_optimizer,
    eval_weights,
    has_modes,
    set_train_mode,
)
from kohakumoss.optim.names import optimizer_problem
from kohakumoss.train import EMA, LRSchedule
from kohakumoss_common.errors import ConfigError

from ..adapters.helpers import tiny_model
from .runner import Run, train_step

STEPS, HALF = 12, 6


def _has(pkg: str) -> bool:
    return importlib.util.find_spec(pkg) is not None


def _needs(pkg: str):
    return pytest.mark.skipif(not _has(pkg), reason=f"{pkg} is not installed (pip install {pkg})")


# (OPTIMIZER, OPTIMIZER_ARGS, LR): LRs in each optimizer's own range (Prodigy and schedule-free rescale)
CPU_CASES = [
    pytest.param("adafactor", {}, 1e-2, id="adafactor"),
    pytest.param("prodigy", {"d_coef": 0.5}, 1.0, id="prodigy", marks=_needs("prodigyopt")),
    pytest.param(
        "schedulefree_adamw", {"warmup_steps": 3}, 2e-3, id="schedulefree", marks=_needs("schedulefree")
    ),
    pytest.param("torch.optim.SGD", {"momentum": 0.9}, 1e-2, id="by-name"),
]


def make_run(kind: str, name: str, args: dict, lr: float, device: str = "cpu") -> Run:
    model = tiny_model().to(device)
    if kind == "lora":
        net = build_adapter(model, "lora", rank=4, alpha=4, preset="attn-mlp", bypass=True, dropout=0.1)
        net.to(device)
        ratio = None if name == "prodigy" else 4.0  # LoRA+ groups: Prodigy takes one LR (refused below)
        opt = build_adapter_optimizer(adapter_param_groups(net, lr, ratio, 0.01), lr, name, args)
        trainable = net
    else:
        model.requires_grad_(True)
        opt = build_full_ft_optimizer(model, lr=lr, weight_decay=0.01, optimizer=name, optimizer_args=args)
        trainable = model
    model.train()
    ema = EMA(trainable, decay=0.9, warmup=4, every=2)
    schedule = LRSchedule("cosine", warmup_steps=3, total_steps=STEPS, min_ratio=0.1)
    return Run(model, trainable, opt, ema, schedule, torch.Generator().manual_seed(1234))


def save(run: Run, folder, step: int) -> None:
    """What the trainer does at a checkpoint: the eval weights (schedule-free's average) with the state."""
    with eval_weights(run.optimizer):
        save_checkpoint(
            folder,
            step,
            trainable_state(run.trainable),
            run.optimizer.state_dict(),
            run.ema.state_dict(),
            generators={"noise": run.noise_gen},
            data_position={"step": step},
            config={},
        )


def resume_matches_straight(tmp_path, kind: str, name: str, args: dict, lr: float) -> list[float]:
    torch.manual_seed(0)
    straight = make_run(kind, name, args, lr)
    expected = [train_step(straight, s) for s in range(HALF)]
    save(straight, tmp_path / "straight", HALF)  # the uninterrupted run saves at the same step
    expected += [train_step(straight, s) for s in range(HALF, STEPS)]

    torch.manual_seed(0)
    first = make_run(kind, name, args, lr)
    got = [train_step(first, s) for s in range(HALF)]
    save(first, tmp_path / "ck", HALF)
    del first
    random.seed(99), np.random.seed(99), torch.manual_seed(99)
    resumed = make_run(kind, name, args, lr)
    ck = load_checkpoint(resolve_checkpoint(tmp_path / "ck", "latest"))
    load_trainable_state(resumed.trainable, ck.trainable)
    resumed.optimizer.load_state_dict(ck.optimizer)
    set_train_mode(resumed.optimizer, True)  # the trainer's resume: back to the training point
    resumed.ema.load_state_dict(ck.ema)
    restore_rng(ck.rng, {"noise": resumed.noise_gen})
    got += [train_step(resumed, s) for s in range(HALF, STEPS)]

    assert [x.item() for x in got] == [x.item() for x in expected]
    for key, p in trainable_state(straight.trainable).items():
        assert torch.equal(p, trainable_state(resumed.trainable)[key]), key
    return [x.item() for x in expected]


@pytest.mark.parametrize("name,args,lr", CPU_CASES)
def test_resume_is_bit_exact_and_the_optimizer_trains(tmp_path, name, args, lr):
    kind = "lora"
    losses = resume_matches_straight(tmp_path, kind, name, args, lr)
    assert all(np.isfinite(losses))
    # the named member is the one stepping (full: it replaces Muon's AdamW partner)
    run = make_run(kind, name, args, lr)
    member = run.optimizer.optimizers[name]
    assert (
        type(member).__name__
        == {
            "adafactor": "Adafactor",
            "prodigy": "Prodigy",
            "schedulefree_adamw": "AdamWScheduleFree",
            "torch.optim.SGD": "SGD",
        }[name]
    )
    if name == "torch.optim.SGD":
        assert member.param_groups[0]["momentum"] == 0.9


@_needs("schedulefree")
def test_full_finetune_member_beside_muon_resumes_bit_exact(tmp_path):
    """A full fine-tune: the chosen optimizer replaces Muon's AdamW partner (schedule-free: the member whose
    train / eval swap the save goes through); a slow case on the CPU, so one optimizer."""
    resume_matches_straight(tmp_path, "full", "schedulefree_adamw", {"warmup_steps": 3}, 2e-3)
    run = make_run("full", "schedulefree_adamw", {}, 2e-3)
    assert set(run.optimizer.optimizers) == {"muon", "schedulefree_adamw"}


def test_optimizer_moves_the_weights_differently_from_adamw():
    """Each choice is really used: after 3 steps its weights differ from AdamW's on the same data."""
    torch.manual_seed(0)
    ref = make_run("lora", "adamw", {}, 1e-2)
    for s in range(3):
        train_step(ref, s)
    for name, args, lr in (("adafactor", {}, 1e-2), ("torch.optim.SGD", {"momentum": 0.9}, 1e-2)):
        torch.manual_seed(0)
        run = make_run("lora", name, args, lr)
        for s in range(3):
            train_step(run, s)
        a, b = trainable_state(ref.trainable), trainable_state(run.trainable)
        assert any(not torch.allclose(a[k], b[k]) for k in a), name


@_needs("schedulefree")
def test_schedulefree_eval_weights_swap_and_restore():
    torch.manual_seed(0)
    run = make_run("lora", "schedulefree_adamw", {}, 1e-2)
    assert has_modes(run.optimizer)
    for s in range(4):
        train_step(run, s)
    y = {k: v.clone() for k, v in trainable_state(run.trainable).items()}
    with eval_weights(run.optimizer):
        x = trainable_state(run.trainable)
        assert any(not torch.equal(x[k], y[k]) for k in y)  # the averaged weights are in the params
        beta1 = run.optimizer.optimizers["schedulefree_adamw"].param_groups[0]["betas"][0]
        p = next(iter(run.optimizer.params()))
        z = run.optimizer.optimizers["schedulefree_adamw"].state[p]["z"]
        # y = (1 - beta1) z + beta1 x: the schedule-free relation between the training point and x
        torch.testing.assert_close(
            torch.lerp(p, z, 1 - beta1), y[next(k for k in y if y[k].shape == p.shape)]
        )
    after = trainable_state(run.trainable)
    for k in y:
        torch.testing.assert_close(after[k], y[k], rtol=1e-6, atol=1e-7)
    assert not has_modes(make_run("lora", "adamw", {}, 1e-2).optimizer)


def _placed(name: str, args: dict, lr: float, placement: str):
    torch.manual_seed(0)
    model = tiny_model()
    model.requires_grad_(True)
    opt = build_full_ft_optimizer(model, lr=lr, optimizer=name, optimizer_args=args, use_muon=False)
    return model, PlacedOptimizer(opt, placement)


def _placed_steps(name, args, lr, placement) -> dict[str, torch.Tensor]:
    model, po = _placed(name, args, lr, placement)
    params = dict(model.named_parameters())
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        for p in params.values():
            p.grad = torch.randn(p.shape, generator=g)
        po.step()
        po.zero_grad()
    return {k: v.detach().clone() for k, v in params.items()}


@pytest.mark.parametrize(
    "name,args,lr,placement",
    [
        ("adafactor", {}, 1e-2, "host"),
        ("adafactor", {}, 1e-2, "stream"),
        pytest.param("prodigy", {}, 1.0, "host", marks=_needs("prodigyopt")),
    ],
)
def test_placed_states_step_like_the_plain_path(name, args, lr, placement):
    ref = _placed_steps(name, args, lr, "gpu")
    got = _placed_steps(name, args, lr, placement)
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], rtol=1e-5, atol=1e-6, msg=k)


@pytest.mark.parametrize(
    "name,args,lr,placement",
    [
        pytest.param("prodigy", {}, 1.0, "stream", marks=_needs("prodigyopt")),
        pytest.param("schedulefree_adamw", {}, 1e-3, "host", marks=_needs("schedulefree")),
        pytest.param("schedulefree_adamw", {}, 1e-3, "stream", marks=_needs("schedulefree")),
        ("torch.optim.SGD", {}, 1e-2, "host"),
    ],
)
def test_placements_that_cannot_work_are_refused_by_name(name, args, lr, placement):
    with pytest.raises(ConfigError, match=f"OPTIMIZER_PLACEMENT.*'{placement}'"):
        _placed(name, args, lr, placement)


def test_bad_optimizer_names_and_args_name_the_knob():
    groups = lambda: [{"params": [torch.nn.Parameter(torch.zeros(2))]}]  # noqa: E731
    with pytest.raises(ConfigError, match="OPTIMIZER.*'lion'"):
        build_adapter_optimizer(groups(), 1e-3, "lion")
    with pytest.raises(ConfigError, match="OPTIMIZER.*no_such_pkg"):
        build_adapter_optimizer(groups(), 1e-3, "no_such_pkg.Opt")
    assert "pip install no_such_pkg" in optimizer_problem("no_such_pkg.Opt")
    with pytest.raises(ConfigError, match="OPTIMIZER.*NoSuch"):
        build_adapter_optimizer(groups(), 1e-3, "torch.optim.NoSuch")
    with pytest.raises(ConfigError, match="not a torch.optim.Optimizer"):
        build_adapter_optimizer(groups(), 1e-3, "torch.nn.Linear")
    if _has("prodigyopt"):
        two = [{"params": [torch.nn.Parameter(torch.zeros(2))], "lr": lr} for lr in (1.0, 4.0)]
        with pytest.raises(ConfigError, match="LORA_PLUS_RATIO"):
            build_adapter_optimizer(two, 1.0, "prodigy")
    with pytest.raises(ConfigError, match="OPTIMIZER_ARGS.*bogus"):
        build_adapter_optimizer(groups(), 1e-3, "adafactor", {"bogus": 1})
    if not _has("bitsandbytes"):
        assert "pip install bitsandbytes" in optimizer_problem("adamw8bit")
    assert optimizer_problem("adamw") is None and optimizer_problem("torch.optim.SGD") is None


_CUDA = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


# (OPTIMIZER, package, the state class): bitsandbytes keeps plain uint8 tensors; torchao keeps tensor
# subclasses, which the checkpoint stores as their component tensors (kohakumoss/optim/portable.py)
@pytest.mark.parametrize(
    "name,state_cls,device",
    [
        pytest.param("adamw8bit", "Tensor", "cpu", marks=_needs("bitsandbytes"), id="bnb-cpu"),
        pytest.param("adamw8bit", "Tensor", "cuda", marks=[_needs("bitsandbytes"), *_CUDA], id="bnb-cuda"),
        pytest.param(
            "torchao.optim.AdamW8bit", "OptimState8bit", "cpu", marks=_needs("torchao"), id="ao8-cpu"
        ),
        pytest.param(
            "torchao.optim.AdamW8bit",
            "OptimState8bit",
            "cuda",
            marks=[_needs("torchao"), *_CUDA],
            id="ao8-cuda",
        ),
        pytest.param(
            "torchao.optim.AdamW4bit",
            "OptimState4bit",
            "cuda",
            marks=[_needs("torchao"), *_CUDA],
            id="ao4-cuda",
        ),
        pytest.param(
            "torchao.optim.AdamWFp8",
            "OptimStateFp8",
            "cuda",
            marks=[_needs("torchao"), *_CUDA],
            id="aofp8-cuda",
        ),
    ],
)
def test_low_bit_adamw_resume_is_bit_exact(tmp_path, name, state_cls, device):
    """8-bit (and torchao's 4-bit / fp8) AdamW states through save / load: the checkpoint reads under
    weights_only with no class registered (as the exporter reads it), the resumed run's weights equal
    the uninterrupted run's, and the loss goes down."""

    def build():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)).to(
            device
        )  # 256x256 weights: above torchao's 4096-element floor for quantized states
        return model, build_adapter_optimizer([{"params": list(model.parameters())}], 1e-3, name)

    def step(model, opt, s):
        g = torch.Generator(device=device).manual_seed(s)
        x = torch.randn(32, 256, device=device, generator=g)
        loss = (model(x) - x[:, :64]).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    model, opt = build()
    losses = [step(model, opt, s) for s in range(STEPS)]
    first, fopt = build()
    for s in range(HALF):
        step(first, fopt, s)
    (member,) = fopt.optimizers.values()
    weight_state = member.state[first[0].weight]
    first_moment = "state1" if name == "adamw8bit" else "exp_avg"  # bitsandbytes' own name for it
    assert type(weight_state[first_moment]).__name__ == state_cls
    save_checkpoint(tmp_path, HALF, trainable_state(first), fopt.state_dict(), None, config={})

    # a reader that never imported the optimizer's package: no tensor subclass is a safe global
    registered = torch.serialization.get_safe_globals()
    torch.serialization.clear_safe_globals()
    try:
        ck = load_checkpoint(resolve_checkpoint(tmp_path, "latest"))
    finally:
        torch.serialization.add_safe_globals(registered)
    resumed, ropt = build()
    load_trainable_state(resumed, {k: v.to(device) for k, v in ck.trainable.items()})
    ropt.load_state_dict(ck.optimizer)
    (rmember,) = ropt.optimizers.values()
    loaded = rmember.state[resumed[0].weight][first_moment]
    assert type(loaded).__name__ == state_cls and loaded.device.type == device
    for s in range(HALF, STEPS):
        step(resumed, ropt, s)
    for (k, a), b in zip(model.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), k
    assert losses[-1] < losses[0]


def test_adapter_metadata_names_the_optimizer_used(tmp_path):
    from kohakumoss.export.metadata import run_metadata

    k = {
        "RUN_NAME": "r",
        "RUNS_DIR": str(tmp_path),
        "RANK": 4,
        "ALPHA": 4.0,
        "STEPS": 10,
        "WEIGHT_DECAY": 0.01,
    }
    assert run_metadata(k, 1)["ss_optimizer"] == "torch.optim.AdamW(weight_decay=0.01)"
    k.update(OPTIMIZER="prodigy", OPTIMIZER_ARGS={"d_coef": 0.5})
    assert run_metadata(k, 1)["ss_optimizer"] == "prodigyopt.Prodigy(weight_decay=0.01,d_coef=0.5)"
    k.update(OPTIMIZER="torch.optim.SGD", OPTIMIZER_ARGS={})
    assert run_metadata(k, 1)["ss_optimizer"] == "torch.optim.SGD(weight_decay=0.01)"


def test_optimizer_names_ignore_case_and_take_kohyas_spellings():
    from kohakumoss.config.train import TRAIN_SCHEMA, TrainConfig
    from kohakumoss.optim.names import canonical_optimizer

    kohya = ["AdamW", "AdamW8bit", "PagedAdamW8bit", "Lion8bit", "Prodigy", "DAdaptAdam", "AdamWScheduleFree"]
    ours = [
        "adamw",
        "adamw8bit",
        "paged_adamw8bit",
        "lion8bit",
        "prodigy",
        "dadapt_adam",
        "schedulefree_adamw",
    ]
    assert [canonical_optimizer(n) for n in kohya] == ours
    assert canonical_optimizer("torch.optim.SGD") == "torch.optim.SGD"  # a class path keeps its case
    # the typed config holds the project's spelling: checkpoints, resume and metadata see one name
    cfg = TrainConfig.from_knobs(TRAIN_SCHEMA.validate({"OPTIMIZER": "AdaFactor"}))
    assert cfg.optim.optimizer == "adafactor" and cfg.knobs()["OPTIMIZER"] == "adafactor"
    opt = build_adapter_optimizer([{"params": [torch.nn.Parameter(torch.zeros(2))]}], 1e-3, "Adafactor")
    assert isinstance(opt.optimizers["Adafactor"], torch.optim.Adafactor)

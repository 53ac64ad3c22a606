"""CUDA graphs of the micro-step: refused by knob where the plan cannot be graphed; on the GPU the
graphed step gives the eager step's losses and gradients, across batch shapes and grad accumulation."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import torch

from kohakumoss.memory.plan import MemoryPlan
from kohakumoss.train.graphs import StepGraphs, graph_refusal, resolve_graphs
from kohakumoss_common.errors import ConfigError

from .conftest import tiny_knobs

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
GPU = torch.device("cuda")


@pytest.mark.parametrize(
    "plan, kwargs, knob",
    [
        (MemoryPlan(stream_blocks=2), {}, "STREAM_BLOCKS"),
        (MemoryPlan(activation_offload="on"), {}, "ACTIVATION_OFFLOAD"),
        (MemoryPlan(optimizer="host"), {}, "OPTIMIZER_PLACEMENT"),
        (MemoryPlan(checkpointing="full"), {"draws_random": True}, "CHECKPOINTING"),
        (MemoryPlan(), {"algo": "tlora"}, "ALGO"),
        (MemoryPlan(), {"module_dropout": 0.1}, "MODULE_DROPOUT"),
        (MemoryPlan(), {"dtype": torch.float16}, "PRECISION"),
    ],
)
def test_refusals_name_the_knob(plan, kwargs, knob):
    why = graph_refusal(plan, GPU, **kwargs)
    assert why is not None and why.startswith(knob)
    assert resolve_graphs("auto", why) is False
    with pytest.raises(ConfigError, match=f"CUDA_GRAPHS.*{knob}"):
        resolve_graphs("on", why)


def test_the_plain_plan_on_cuda_is_graphed_and_the_cpu_is_not():
    assert graph_refusal(MemoryPlan(), GPU) is None
    for mode in ("full", "attn", "mlp"):  # no dropout: the recomputation needs no RNG state
        assert graph_refusal(MemoryPlan(checkpointing=mode), GPU) is None
    assert resolve_graphs("auto", None) and resolve_graphs("on", None)
    assert not resolve_graphs("off", None)
    assert graph_refusal(MemoryPlan(), torch.device("cpu")).startswith("DEVICE")
    with pytest.raises(ConfigError, match="CUDA_GRAPHS"):
        resolve_graphs("sometimes", None)


def _lora_model(seed: int = 0, ops=None):
    from kohakumoss.adapters import build_adapter
    from kohakumoss.model import MossBackbone, get_preset

    torch.manual_seed(seed)
    model = MossBackbone(get_preset("tiny"), ops=ops).to(GPU)
    model.init_weights(std=0.05, generator=torch.Generator(device=GPU).manual_seed(seed))
    model.requires_grad_(False)
    net = build_adapter(model, algo="lora", rank=4, alpha=4.0, preset="full", bypass=True).to(GPU)
    for p in net.parameters():  # LoRA up starts at zero: make the down grads non-zero too
        torch.nn.init.normal_(p, std=0.05)
    return model, net


def _batches(model, shapes, steps):
    from kohakumoss.model import PackedSeq
    from kohakumoss.train.step import DeviceBatch

    cfg, out = model.config, []
    for i in range(steps):
        text_lens, grids = shapes[i % len(shapes)]
        seq = PackedSeq.build(text_lens, grids, GPU)
        g = torch.Generator(device=GPU).manual_seed(100 + i)
        n_img = sum(h * w for h, w in grids)
        x0 = torch.randn(n_img, cfg.in_channels, device=GPU, generator=g)
        text = torch.randn(sum(text_lens), cfg.text_dim, device=GPU, generator=g)
        sigma = torch.rand(len(text_lens), device=GPU, generator=g)
        noise = torch.randn(n_img, cfg.in_channels, device=GPU, generator=g)
        out.append((DeviceBatch(x0, text, seq), sigma, noise))
    return out


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize(
    "accum, set_to_none, ckpt",
    [(1, False, "none"), (2, True, "none"), (1, False, "full"), (2, False, "attn")],
)
def test_graphed_micro_steps_match_eager(accum, set_to_none, ckpt):
    """Also with checkpointed blocks (no dropout: the recomputation reads no RNG state from the host)."""
    from kohakumoss.memory.engines.checkpointing import CheckpointPolicy
    from kohakumoss.memory.engines.runner import install_checkpointing
    from kohakumoss.train.step import flow_loss

    shapes = [([5, 3], [(4, 4), (2, 6)]), ([7], [(6, 6)])]  # two batch shapes, alternating
    results = []
    for graphed in (False, True):
        model, net = _lora_model()
        install_checkpointing(model, CheckpointPolicy(ckpt, preserve_rng=False))
        params = list(net.parameters())
        opt = torch.optim.AdamW(params, lr=1e-2)
        graphs = StepGraphs(
            lambda b, s, n, m=model: flow_loss(m, b, s, n, torch.float32), params, backward_scale=1 / accum
        )
        batches = _batches(model, shapes, 8 * accum)
        losses, grads = [], []
        for chunk in range(0, 8 * accum, accum):
            for batch, sigma, noise in batches[chunk : chunk + accum]:
                losses.append(
                    graphs.run(batch, sigma, noise).item()
                    if graphed
                    else graphs._eager(batch, sigma, noise).item()
                )
            grads.append(torch.cat([p.grad.flatten() for p in params]).clone())
            opt.step()
            opt.zero_grad(set_to_none=set_to_none)
        results.append((losses, grads, graphs))
    (eager_l, eager_g, _), (graph_l, graph_g, graphs) = results
    assert graphs.failed is None and len(graphs.graphs) == 2 and graphs.replays > 0
    torch.testing.assert_close(torch.tensor(graph_l), torch.tensor(eager_l), rtol=1e-5, atol=1e-6)
    for a, b in zip(graph_g, eager_g, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.gpu
@cuda
def test_sunk_weight_gradients_match_eager():
    """The captured backward's addmm ops accumulate the LoRA weight gradients into `.grad` themselves
    (grad_sink); losses and gradients stay the eager step's."""
    from kohakumoss.train.step import flow_loss
    from kohakumoss_kernels import OpSet

    shapes = [([5, 3], [(4, 4), (2, 6)])]
    results = []
    for graphed in (False, True):
        model, net = _lora_model(ops=OpSet("addmm", tune="off"))
        params = list(net.parameters())
        opt = torch.optim.AdamW(params, lr=1e-2)
        graphs = StepGraphs(lambda b, s, n, m=model: flow_loss(m, b, s, n, torch.float32), params)
        losses, grads = [], []
        for batch, sigma, noise in _batches(model, shapes, 5):
            run = graphs.run if graphed else graphs._eager
            losses.append(run(batch, sigma, noise).item())
            grads.append(torch.cat([p.grad.flatten() for p in params]).clone())
            opt.step()
            opt.zero_grad(set_to_none=False)
        results.append((losses, grads, graphs))
    (eager_l, eager_g, _), (graph_l, graph_g, graphs) = results
    assert graphs.failed is None and graphs.replays > 0
    torch.testing.assert_close(torch.tensor(graph_l), torch.tensor(eager_l), rtol=1e-5, atol=1e-6)
    for a, b in zip(graph_g, eager_g, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def _losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.gpu
@cuda
def test_trainer_with_cuda_graphs_logs_the_eager_losses(train_world):
    from kohakumoss.train.loop import train

    knobs = dict(STEPS=6, DEVICE="cuda", OPS_BACKEND="auto", MEMORY_PROFILE="speed")
    eager = train(tiny_knobs(train_world, "graphs-off", CUDA_GRAPHS="off", **knobs))
    graphed = train(tiny_knobs(train_world, "graphs-on", CUDA_GRAPHS="on", **knobs))
    assert "CUDA graph captured" in (graphed / "log.txt").read_text()
    assert _losses(graphed) == pytest.approx(_losses(eager), rel=1e-5)


def test_shapes_that_keep_evicting_each_other_turn_graphs_off(monkeypatch):
    """More batch shapes than max_graphs: after a few evictions the run stays eager instead of
    capturing every step (the capture and replay themselves are faked; the policy is what runs)."""
    from types import SimpleNamespace

    graphs = StepGraphs(lambda *a: None, [], max_graphs=2)
    calls = []

    def fake_capture(key, batch, sigma, noise):
        graphs.graphs[key] = key
        if len(graphs.graphs) > graphs.max_graphs:
            graphs.graphs.popitem(last=False)
        graphs.captures += 1
        calls.append("capture")

    monkeypatch.setattr(graphs, "_eager", lambda *a: calls.append("eager"))
    monkeypatch.setattr(graphs, "_capture", fake_capture)
    monkeypatch.setattr(graphs, "_replay", lambda *a: calls.append("replay"))
    monkeypatch.setattr("kohakumoss.train.graphs.batch_signature", lambda b, s, n, exact=False: b.shape)
    for step in range(60):  # three shapes in turn, two graph slots: every shape keeps being evicted
        graphs.run(SimpleNamespace(shape=step % 3), None, None)
    assert graphs.failed is not None and "max_graphs" in graphs.failed
    assert calls.count("capture") == 2 * graphs.max_graphs
    assert "capture" not in calls[-30:] and "eager" in calls[-30:]  # cached shapes may still replay


def _padded_batch(text_lens, grids, pad_to, device="cpu", seed=0, cfg=None, ref_grids=None):
    """ref_grids: per sample, its references' token grids (an edit batch)."""
    from kohakumoss.model import PackedSeq, get_preset
    from kohakumoss.train.step import DeviceBatch

    cfg = cfg or get_preset("tiny")
    seq = PackedSeq.build(text_lens, grids, device, pad_to=pad_to, ref_sizes=ref_grids)
    g = torch.Generator(device=device).manual_seed(seed)
    n_img = sum(h * w for h, w in grids)
    x0 = torch.randn(n_img, cfg.in_channels, device=device, generator=g)
    text = torch.randn(sum(text_lens), cfg.text_dim, device=device, generator=g)
    text = torch.cat([text, text.new_zeros(seq.text_pad, cfg.text_dim)])
    sigma = torch.rand(len(text_lens), device=device, generator=g)
    noise = torch.randn(n_img, cfg.in_channels, device=device, generator=g)
    refs = torch.randn(seq.ref_tokens, cfg.in_channels, device=device, generator=g) if ref_grids else None
    return DeviceBatch(x0, text, seq, refs=refs), sigma, noise


def test_other_captions_share_a_graph_key_unless_lengths_are_read_on_the_host():
    from kohakumoss.train.graphs import batch_signature

    a = _padded_batch([5, 3], [(4, 4), (2, 6)], pad_to=16)
    b = _padded_batch([2, 9], [(4, 4), (2, 6)], pad_to=16, seed=1)
    other_size = _padded_batch([5, 3], [(4, 4), (3, 6)], pad_to=16)
    assert batch_signature(*a) == batch_signature(*b)
    assert batch_signature(*a, exact=True) != batch_signature(*b, exact=True)
    assert batch_signature(*a) != batch_signature(*other_size)


def test_graphed_timing_keeps_the_backends_that_read_lengths_on_the_device():
    from kohakumoss_kernels.registry import _graph_safe

    def backend(device_lengths):
        def fn():
            pass

        if device_lengths:
            fn.device_lengths = True
        return fn

    live = [("sdpa_groups", backend(False)), ("triton", backend(True)), ("flex", backend(False)),
            ("eager", backend(False))]  # fmt: skip
    assert [n for n, _ in _graph_safe(live, "device", "device")] == ["triton"]  # the reference: last resort
    assert _graph_safe(live, "device") == live  # lengths on the host allowed: every backend
    no_lengths = [("triton", backend(False)), ("eager", backend(False))]  # an op without sequence lengths
    assert _graph_safe(no_lengths, "device", "device") == no_lengths
    with_compile = [("triton", backend(False)), ("compile", backend(False)), ("eager", backend(False))]
    assert [n for n, _ in _graph_safe(with_compile, "device")] == ["triton", "eager"]
    assert _graph_safe(with_compile[1:], "device") == with_compile[1:]  # no Triton: compile stays


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("backend, exact", [("auto", False), ("sdpa_groups", True)])
def test_one_graph_replays_batches_with_other_captions(backend, exact):
    """Padded text: captions of other lengths replay the same graph (sequence tensors copied in) with the
    eager step's losses and gradients; a backend that reads lengths on the host keys graphs exactly."""
    from kohakumoss.train.step import flow_loss
    from kohakumoss_kernels import OpSet

    captions = [[5, 3], [2, 9], [7, 1], [5, 3], [4, 4], [1, 10]]  # 8..11 text tokens: one padded shape
    results = []
    for graphed in (False, True):
        ops = OpSet(backend, tune="off")
        ops.set_timing("device")
        ops.set_lengths("device")
        model, net = _lora_model(ops=ops)
        params = list(net.parameters())
        # bf16: the device-length attention backends take half precision only (fp32 runs key exactly)
        graphs = StepGraphs(lambda b, s, n, m=model: flow_loss(m, b, s, n, torch.bfloat16), params)
        losses, grads = [], []
        for i, lens in enumerate(captions):
            batch = _padded_batch(lens, [(4, 4), (2, 6)], pad_to=16, device=GPU, seed=i, cfg=model.config)
            run = graphs.run if graphed else graphs._eager
            losses.append(run(*batch).item())
            grads.append(torch.cat([p.grad.flatten() for p in params]).clone())
            for p in params:
                p.grad.zero_()
        results.append((losses, grads, graphs))
    (eager_l, eager_g, _), (graph_l, graph_g, graphs) = results
    assert graphs.failed is None and graphs.exact_lengths is exact
    assert graphs.replays == (0 if exact else len(captions) - 2)  # exact: [5, 3] is seen twice, never thrice
    # the same kernels either way; the graph's LoRA gradients add atomically (grad_sink): bf16-close
    torch.testing.assert_close(torch.tensor(graph_l), torch.tensor(eager_l), rtol=1e-3, atol=1e-5)
    for a, b in zip(graph_g, eager_g, strict=True):
        assert ((a - b).norm() / b.norm()).item() < 1e-2


@pytest.mark.gpu
@cuda
def test_edit_batches_replay_one_graph_with_their_references():
    """Reference images: the references are static inputs copied in per replay, the segment attention
    reads its lengths on the device; other captions replay one graph with the eager step's losses."""
    from kohakumoss.train.step import flow_loss
    from kohakumoss_kernels import OpSet

    captions = [[5, 3], [2, 9], [7, 1], [4, 4]]
    refs = [[(4, 4), (2, 3)], [(2, 6)]]
    results = []
    for graphed in (False, True):
        ops = OpSet("auto", tune="off")
        ops.set_timing("device")
        ops.set_lengths("device")
        model, net = _lora_model(ops=ops)
        params = list(net.parameters())
        graphs = StepGraphs(lambda b, s, n, m=model: flow_loss(m, b, s, n, torch.bfloat16), params)
        losses, grads = [], []
        for i, lens in enumerate(captions):
            batch = _padded_batch(
                lens, [(4, 4), (2, 6)], pad_to=16, device=GPU, seed=i, cfg=model.config, ref_grids=refs
            )
            run = graphs.run if graphed else graphs._eager
            losses.append(run(*batch).item())
            grads.append(torch.cat([p.grad.flatten() for p in params]).clone())
            for p in params:
                p.grad.zero_()
        results.append((losses, grads, graphs))
    (eager_l, eager_g, _), (graph_l, graph_g, graphs) = results
    assert graphs.failed is None and not graphs.exact_lengths and graphs.replays == len(captions) - 2
    torch.testing.assert_close(torch.tensor(graph_l), torch.tensor(eager_l), rtol=1e-3, atol=1e-5)
    for a, b in zip(graph_g, eager_g, strict=True):
        assert ((a - b).norm() / b.norm()).item() < 1e-2


class _FakeOps:
    """The OpSet calls the length policy makes: which lengths mode, how many tuning windows opened."""

    lengths, windows = "host", 0

    def set_lengths(self, lengths):
        self.lengths = lengths

    def tuning(self, device_time=False):
        self.windows += 1
        return contextlib.nullcontext()


def test_graphs_serve_every_length_once_batches_differ_in_lengths_alone(monkeypatch):
    """Keyed by exact lengths at first; after LENGTH_MISSES batches of seen shapes with new lengths the
    model's ops switch to device-length backends, graphs are keyed by shapes alone and the next eager
    micro-step times the switched ops (capture and replay faked: the policy is what runs)."""
    from kohakumoss.train.lengths import LENGTH_MISSES

    ops = _FakeOps()
    graphs = StepGraphs(lambda *a: torch.zeros((), requires_grad=True), [], ops=ops)
    calls = []
    monkeypatch.setattr(
        graphs, "_capture", lambda key, *a: (graphs.graphs.__setitem__(key, key), calls.append("capture"))
    )
    monkeypatch.setattr(graphs, "_replay", lambda *a: calls.append("replay"))
    fixed = _padded_batch([5, 3], [(4, 4), (2, 6)], pad_to=16)
    for _ in range(4):  # the same captions: exact keys replay, nothing switches
        graphs.run(*fixed)
    assert graphs.exact_lengths and ops.lengths == "host" and calls == ["capture", "replay", "replay"]
    for i in range(LENGTH_MISSES):
        graphs.run(*_padded_batch([5 - i - 1, 3 + i + 1], [(4, 4), (2, 6)], pad_to=16, seed=i))
    assert not graphs.exact_lengths and ops.lengths == "device" and graphs.lengths.switched
    assert ops.windows == 1 and not graphs.graphs  # the switching micro-step ran eagerly, timing
    graphs.run(*_padded_batch([1, 9], [(4, 4), (2, 6)], pad_to=16, seed=9))  # seen shapes: captured
    graphs.run(*_padded_batch([6, 2], [(4, 4), (2, 6)], pad_to=16, seed=8))  # other lengths: replayed
    assert calls[-2:] == ["capture", "replay"]


@pytest.mark.parametrize("dropout, preserve", [(0.0, False), (0.1, True)])
def test_checkpointed_blocks_keep_rng_state_only_for_adapter_dropout(train_world, dropout, preserve):
    """Without dropout the recomputation reads no generator state, so a checkpointed step can be graphed."""
    from kohakumoss.config.train import TrainConfig
    from kohakumoss.train.components import build_components
    from kohakumoss.train.trainer import adapter_draws_random, build_trainable

    cfg = TrainConfig.from_knobs(tiny_knobs(train_world, "ckpt-rng", CHECKPOINTING="full", DROPOUT=dropout))
    comps = build_components(cfg)
    build_trainable(cfg, comps)
    assert comps.backbone.block_runner.policy.preserve_rng is preserve
    assert adapter_draws_random(cfg.adapter) is preserve
    draws = adapter_draws_random(cfg.adapter)
    assert (graph_refusal(comps.plan, GPU, draws_random=draws) is None) is not preserve


def test_an_eager_padded_step_reads_lengths_on_the_host_until_they_vary():
    """The eager runner over padded batches keeps host-length attention (SDPA) while captions repeat their
    lengths, switches once they vary, and times the switched ops in that micro-step."""
    from kohakumoss.train.lengths import LENGTH_MISSES, LengthSwitch
    from kohakumoss.train.runner import StepInputs, StepResult, StepRunner

    ops, weight = _FakeOps(), torch.zeros(1, requires_grad=True)
    runner = StepRunner(
        torch.optim.SGD([weight], lr=0.1),
        lambda batch, sigma, noise: (weight * sigma.sum()).sum(),
        lambda: None,
        device=torch.device("cpu"),
        seed=0,
        tuning=ops.tuning,
        lengths=LengthSwitch(ops, "no kernel is rebuilt per caption length"),
    )

    def micro(i, lens):
        batch, sigma, noise = _padded_batch(lens, [(4, 4), (2, 6)], pad_to=16, seed=i)
        assert runner.micro(StepInputs(i, batch, sigma, noise), StepResult())

    for i in range(2 * LENGTH_MISSES):  # captions of one length: never switched
        micro(i, [5, 3])
    assert ops.lengths == "host" and ops.windows == 1  # the run's first micro-step
    for i in range(LENGTH_MISSES):
        micro(10 + i, [4 - i, 4 + i])
    assert ops.lengths == "device" and ops.windows == 2  # the switching micro-step timed the new backends
    micro(20, [1, 9])
    assert ops.windows == 2 and runner.lengths.switched
    graphed = StepRunner(
        runner.optimizer, runner.loss_fn, runner.next_batch, device=torch.device("cpu"), seed=0,
        graphs=object(), lengths=LengthSwitch(ops, "x"),
    )  # fmt: skip
    assert graphed.lengths is None  # a graphed step's length policy is the graphs' own

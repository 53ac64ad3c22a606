"""The training loop end to end on the tiny model and real images: files, exact resume, samples, guards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kohakumoss.train.loop import train
from kohakumoss_common.errors import ConfigError

from .conftest import tiny_knobs


def losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_lora_run_writes_its_folder(train_world):
    k = tiny_knobs(
        train_world,
        "files",
        SAVE_EVERY=3,
        VAL_ITEMS=1,
        VAL_EVERY=3,
        SAMPLE_EVERY=3,
        SAMPLE_PROMPTS=["blue glass hexagons", "golden square grid"],
        SAVE_FORMAT="both",
    )
    run = train(k)
    assert (run / "log.txt").read_text().count("checkpoint") >= 2
    # pytest's stderr is no terminal: no bars, progress lines with percentage in the log (first and last step)
    text = (run / "log.txt").read_text()
    assert "step 1/6 (17%)  loss" in text and "step 6/6 (100%)  loss" in text
    assert "base model samples: 2/2 step (100%)" in text and "samples at step 3: 2/2 step (100%)" in text
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    for key in ("loss", "lr", "grad_norm", "tokens", "samples_per_s", "tokens_per_s", "peak_mem_gib"):
        assert all(key in r for r in records), key
    assert "val_loss" in records[2] and "val_loss" in records[5]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_00000003", "step_00000006"]
    for ckpt in (run / "checkpoints").iterdir():
        assert (ckpt / "trainable.safetensors").exists() and (
            ckpt / "export" / "files-comfy.safetensors"
        ).exists()
    assert (run / "export" / "files-comfy.safetensors").exists() and (
        run / "export" / "lycoris" / "files.safetensors"
    ).exists()
    assert (run / "samples" / "grid_step_00000003.png").exists() and (
        run / "samples" / "grid_step_00000006.png"
    ).exists()
    assert (run / "loss.png").exists()


def test_resume_is_exact(train_world):
    """20 steps straight vs 10, a fresh start from the checkpoint, then 10 more: the same loss at every step."""
    knobs = dict(STEPS=20, DROPOUT=0.1, RANK_DROPOUT=0.1, LR_SCHEDULE="cosine", LR_WARMUP_STEPS=3, EMA=True)
    straight = train(tiny_knobs(train_world, "straight", **knobs))
    train(tiny_knobs(train_world, "halves", **knobs, STOP_AT=10))
    resumed = train(tiny_knobs(train_world, "halves", **knobs, RESUME="latest"))
    assert len(losses(straight)) == 20
    assert losses(straight) == losses(resumed)  # bit for bit at every step


def test_ctrl_c_saves_a_checkpoint_that_resumes(train_world, monkeypatch):
    from kohakumoss.train import trainer

    real, calls = trainer.flow_loss, []

    def interrupt_at_third(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer, "flow_loss", interrupt_at_third)
    with pytest.raises(KeyboardInterrupt):
        train(tiny_knobs(train_world, "ctrlc"))
    monkeypatch.setattr(trainer, "flow_loss", real)
    run = Path(tiny_knobs(train_world, "ctrlc")["RUNS_DIR"]) / "ctrlc"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_00000002"]
    train(tiny_knobs(train_world, "ctrlc", RESUME="latest"))
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [
        1,
        2,
        3,
        4,
        5,
        6,
    ]


def test_ctrl_c_inside_a_destructor_still_stops_the_run(train_world, monkeypatch):
    """SIGINT landing in a destructor the garbage collector runs used to be printed and dropped (the run
    trained on); now it stops the run after the step in flight, with a checkpoint."""
    import signal

    from kohakumoss.train import trainer

    real, calls = trainer.flow_loss, []

    class PressesCtrlC:
        def __del__(self):
            signal.raise_signal(signal.SIGINT)

    def press_during_third(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            PressesCtrlC()  # dropped at once: the signal arrives inside __del__
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer, "flow_loss", press_during_third)
    before = signal.getsignal(signal.SIGINT)  # Python's, or one an earlier test left (torch's elastic agent)
    with pytest.raises(KeyboardInterrupt):
        train(tiny_knobs(train_world, "ctrlc-del"))
    assert signal.getsignal(signal.SIGINT) is before  # the loop's handler is gone
    run = Path(tiny_knobs(train_world, "ctrlc-del")["RUNS_DIR"]) / "ctrlc-del"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_00000003"]


def test_resume_from_a_missing_path_is_named(train_world, tmp_path):
    with pytest.raises(ConfigError, match="RESUME"):
        train(tiny_knobs(train_world, "nothing", RESUME=str(tmp_path / "nope")))


def test_non_finite_losses_stop_the_run_with_a_message(train_world, monkeypatch):
    from kohakumoss.train import trainer

    monkeypatch.setattr(trainer, "flow_loss", lambda *a, **kw: torch.tensor(float("nan"), requires_grad=True))
    with pytest.raises(trainer.NonFiniteLoss, match="MAX_BAD_STEPS"):
        train(tiny_knobs(train_world, "nan", MAX_BAD_STEPS=2))


def test_checkpointing_knob_gives_the_same_losses(train_world):
    plain = train(tiny_knobs(train_world, "plain", STEPS=3))
    ckpt = train(tiny_knobs(train_world, "ckpt", STEPS=3, CHECKPOINTING="full"))
    assert losses(plain) == losses(ckpt)


@pytest.mark.parametrize(
    "algo, profile, extra",
    [
        ("lora", "minimal", {"VAE_PLACEMENT": "streamed", "TEXT_ENCODER_PLACEMENT": "streamed"}),
        ("lora", "low_vram", {"STREAM_BLOCKS": 3, "OPTIMIZER_PLACEMENT": "stream"}),
        ("full", "low_vram", {"STREAM_BLOCKS": -1, "GRAD_OFFLOAD": True, "USE_MUON": False}),
        # catalog c0261's engines: some blocks streamed (their masters written back through the host
        # copies), the rest resident (updated from the chunk's device master), optimizer streamed
        ("full", "low_vram", {"STREAM_BLOCKS": 2, "OPTIMIZER_PLACEMENT": "stream", "USE_MUON": False}),
    ],
    ids=["lora-minimal", "lora-stream-opt", "full-host-masters", "full-part-streamed-opt-stream"],
)
def test_memory_profiles_train_the_same_model(train_world, algo, profile, extra, request):
    """The plan moves bytes, not math: a run under a small profile logs the losses of the plain one
    (fp32 on the CPU, where the engines run their host paths synchronously) and resumes exactly."""
    base = dict(
        STEPS=4,
        ALGO=algo,
        LR=1e-4 if algo == "full" else 1e-3,
        **({"USE_MUON": False} if algo == "full" else {}),
    )
    name = request.node.callspec.id  # run folders of one world: one per case
    plain = train(tiny_knobs(train_world, f"{name}-plain", MEMORY_PROFILE="speed", **base))
    small = train(tiny_knobs(train_world, name, MEMORY_PROFILE=profile, **{**base, **extra}))
    log = (small / "log.txt").read_text()
    assert f"memory plan: profile '{profile}'" in log and "weight streaming:" in log  # the engines ran
    for a, b in zip(losses(plain), losses(small), strict=True):
        assert a == pytest.approx(b, rel=1e-5)
    train(tiny_knobs(train_world, f"{name}-halves", MEMORY_PROFILE=profile, STOP_AT=2, **{**base, **extra}))
    resumed = train(
        tiny_knobs(
            train_world,
            f"{name}-halves",
            MEMORY_PROFILE=profile,
            RESUME="latest",
            **{**base, **extra},
        )
    )
    assert losses(resumed) == pytest.approx(losses(small), rel=1e-6)


def test_a_non_finite_step_is_skipped_on_the_device_and_the_run_goes_on(train_world, monkeypatch):
    """LoRA with fused AdamW: the loss is read after the update is queued; the NaN step's update is
    skipped by the fused kernel (found_inf), counted by the host, and the next steps train."""
    from kohakumoss.train import runner, trainer

    real, calls, armed = trainer.flow_loss, [0], []

    def flaky(*a, **kw):
        calls[0] += 1
        loss = real(*a, **kw)
        return loss * float("nan") if calls[0] == 2 else loss

    arm = runner.arm_skip
    monkeypatch.setattr(trainer, "flow_loss", flaky)
    monkeypatch.setattr(runner, "arm_skip", lambda opt, ok: armed.append(bool(ok)) or arm(opt, ok))
    run = train(tiny_knobs(train_world, "flaky", STEPS=4, MAX_BAD_STEPS=2))
    assert armed == [True, False, True, True]  # every step went through the device-side guard
    assert "non-finite loss or gradients, step skipped (1 in a row)" in (run / "log.txt").read_text()
    assert all(torch.isfinite(torch.tensor(v)) for v in losses(run))


def test_next_step_is_prepared_before_this_one_is_read(train_world, monkeypatch):
    """With the device-side skip the next step's batch and noise are drawn while the GPU finishes the
    current one (before its loss is read); every micro-step is still drawn once, in order."""
    from kohakumoss.train import runner, trainer

    events = []
    draw, skip = runner.draw_step_noise, runner.arm_skip

    def recording_draw(seed, micro_step, *a, **kw):
        events.append(("draw", micro_step))
        return draw(seed, micro_step, *a, **kw)

    monkeypatch.setattr(runner, "draw_step_noise", recording_draw)
    monkeypatch.setattr(runner, "arm_skip", lambda opt, ok: events.append(("update", None)) or skip(opt, ok))
    apply = trainer.LRSchedule.apply
    monkeypatch.setattr(
        trainer.LRSchedule,
        "apply",
        lambda self, opt, step: events.append(("step", step)) or apply(self, opt, step),
    )
    train(tiny_knobs(train_world, "prefetch", STEPS=4, GRAD_ACCUM=2))
    draws = [m for kind, m in events if kind == "draw"]
    assert draws == list(range(8))
    # step s's update queued, step s + 1's first micro-step drawn, then (its loss read) step s + 1 begins
    starts = [events[i - 2 : i] for i, e in enumerate(events) if e[0] == "step" and e[1] > 0]
    assert starts == [[("update", None), ("draw", 2 * s)] for s in (1, 2, 3)], events


@pytest.mark.parametrize("base", ["fp8", "fp8_weight"])
def test_lora_run_on_an_fp8_base_trains_resumes_and_is_refused_for_full(train_world, base):
    """BASE_PRECISION through the trainer: the base's linears stored in fp8, the LoRA learns (losses
    close to the full-precision run's, not equal), resume is exact; a full fine-tune is refused by name."""
    plain = losses(train(tiny_knobs(train_world, f"{base}-ref", STEPS=4)))
    run = train(tiny_knobs(train_world, base, STEPS=4, BASE_PRECISION=base))
    assert f"BASE_PRECISION {base}:" in (run / "log.txt").read_text()
    fp8_losses = losses(run)
    assert fp8_losses != plain and fp8_losses == pytest.approx(plain, rel=0.05)
    train(tiny_knobs(train_world, f"{base}-halves", STEPS=4, BASE_PRECISION=base, STOP_AT=2))
    resumed = train(tiny_knobs(train_world, f"{base}-halves", STEPS=4, BASE_PRECISION=base, RESUME="latest"))
    assert losses(resumed) == fp8_losses
    with pytest.raises(ConfigError, match="BASE_PRECISION: '.*' stores a frozen base"):
        train(tiny_knobs(train_world, f"{base}-full", STEPS=1, ALGO="full", BASE_PRECISION=base))


def test_caches_are_filled_before_the_first_step(train_world, tmp_path):
    """VAE_ENCODE / TEXT_ENCODE 'auto': what the plan needs is encoded before step 1, with the encoders
    resident ('speed') or kept off the device while training ('minimal': both caches must hit), and the
    two train the same model; a second run over the filled cache encodes nothing."""
    base = dict(STEPS=3, CACHE_DIR=str(tmp_path / "cache"))
    plain = train(tiny_knobs(train_world, "off-plain", MEMORY_PROFILE="speed", **base))
    log = (plain / "log.txt").read_text()
    assert (
        "VAE_ENCODE='auto': cache filled before the first step: vae: 4 planned, 0 already cached, 4 encoded"
        in log
    )
    assert "TEXT_ENCODE='auto': cache filled before the first step" in log
    again = train(tiny_knobs(train_world, "off-again", MEMORY_PROFILE="speed", **base))
    assert "vae: 4 planned, 4 already cached, 0 encoded" in (again / "log.txt").read_text()
    base["CACHE_DIR"] = str(tmp_path / "fresh-cache")
    small = train(tiny_knobs(train_world, "off-minimal", MEMORY_PROFILE="minimal", **base))
    log = (small / "log.txt").read_text()
    assert (
        "VAE_ENCODE='auto': cache filled before the first step: vae: 4 planned, 0 already cached, 4 encoded"
        in log
    ), log
    assert losses(small) == pytest.approx(losses(plain), rel=1e-5)
    assert losses(again) == pytest.approx(losses(plain), rel=1e-5)


def test_the_first_step_reports_its_triton_compiles(train_world, monkeypatch):
    """A fresh machine's first step compiles every Triton kernel it meets: the log says how many and how
    long (counted through Triton's JIT hooks, faked here: the CPU compiles none), once."""
    import contextlib

    from kohakumoss.train import runner
    from kohakumoss_kernels.backends.triton_utils import Compiles

    entered = []

    @contextlib.contextmanager
    def fake_counter():
        entered.append(1)
        yield Compiles(available=True, kernels=37, seconds=41.2)

    monkeypatch.setattr(runner, "counting_compiles", fake_counter)
    run = train(tiny_knobs(train_world, "compiles", STEPS=2))
    log = (run / "log.txt").read_text()
    assert len(entered) == 1 and log.count("first micro-step: Triton compiled 37 kernels in 41 s") == 1


def test_a_padded_eager_run_trains_the_unpadded_runs_losses(train_world, monkeypatch):
    """CUDA eager runs pad each batch's text (`trainer.text_pad`) and keep host-length attention until the
    lengths vary (`train/lengths.py`; the switch itself: test_graphs.py). Forced here on the CPU: the
    run gets a length switch, its batches (this world's captions repeat their lengths) never flip it, and
    it trains the unpadded run's losses (pad tokens attend only among themselves)."""
    import kohakumoss.train.trainer as trainer_module
    from kohakumoss.train.lengths import LengthSwitch

    plain = losses(train(tiny_knobs(train_world, "unpadded", STEPS=6)))
    switches = []

    class Recorded(LengthSwitch):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            switches.append(self)

    monkeypatch.setattr(trainer_module, "text_pad", lambda device, graphed, pipeline: 16)
    monkeypatch.setattr(trainer_module, "LengthSwitch", Recorded)
    run = train(tiny_knobs(train_world, "padded", STEPS=6))
    assert len(switches) == 1 and switches[0].shapes and not switches[0].switched
    torch.testing.assert_close(torch.tensor(losses(run)), torch.tensor(plain), rtol=1e-4, atol=1e-5)

"""TEXT_ENCODER / VAE 'random' in the trainer: a tiny run encoding online, the sizes the memory plan is given,
and a text model narrower or wider than the DiT's text_dim refused by its knob."""

from __future__ import annotations

import json
import math

import pytest
import torch

from kohakumoss.config.sample import SampleScriptConfig
from kohakumoss.config.train import EncoderConfig, TrainConfig
from kohakumoss.encoders.random_weights import RandomTextEncoder, parameter_bytes
from kohakumoss.memory.estimate import encoder_file_bytes as knob_encoder_bytes
from kohakumoss.train.components import build_text_encoder, build_vae, check_random_text, encoder_file_bytes
from kohakumoss.train.loop import train
from kohakumoss_common.errors import ConfigError

from .conftest import tiny_knobs

CPU = torch.device("cpu")
RANDOM = EncoderConfig(text_encoder="random", vae="random")


def test_a_tiny_run_encodes_online_with_the_random_encoders(train_world, monkeypatch):
    from kohakumoss.encoders.vae import ImageVAE

    calls = {"text": 0, "vae": 0}
    for kind, cls in (("text", RandomTextEncoder), ("vae", ImageVAE)):
        real = cls.encode

        def counted(self, *args, _real=real, _kind=kind, **kwargs):
            calls[_kind] += 1
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(cls, "encode", counted)
    k = tiny_knobs(
        train_world,
        "random-online",
        TEXT_ENCODER="random",
        VAE="random",
        TOKENIZER="",
        TEXT_TEMPLATE="",
        TEXT_ENCODE="online",
        VAE_ENCODE="online",
        STEPS=3,
    )
    run = train(k)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(math.isfinite(r["loss"]) and r["loss"] > 0 for r in records)
    log = (run / "log.txt").read_text()
    assert "TEXT_ENCODER='random'" in log and "VAE='random'" in log  # the benchmark-only warnings
    assert calls["text"] >= 3 and calls["vae"] >= 3  # every step's batch encoded by them


def test_the_plan_is_given_the_built_encoders_parameter_bytes():
    built_te = build_text_encoder(RANDOM, CPU, 32, precision="fp32", preset="tiny")
    built_vae = build_vae(RANDOM, CPU, precision="fp32", preset="tiny")
    assert isinstance(built_te, RandomTextEncoder)
    want = (parameter_bytes(built_te.model), parameter_bytes(built_vae.model))
    assert encoder_file_bytes(RANDOM, "tiny", torch.float32) == want
    knobs = {"TEXT_ENCODER": "random", "VAE": "random", "MODEL_PRESET": "tiny", "DEVICE": "cpu"}
    assert knob_encoder_bytes(TrainConfig.from_knobs(knobs)) == want  # the config tool's estimate
    assert knob_encoder_bytes(SampleScriptConfig.from_knobs(knobs)) == want  # the sampler's
    half = encoder_file_bytes(RANDOM, "tiny", torch.bfloat16)
    assert half == (want[0] // 2, want[1] // 2)
    assert encoder_file_bytes(EncoderConfig(text_encoder="synthetic", vae="synthetic"), "tiny") == (0, 0)
    full = encoder_file_bytes(RANDOM, "moss-image-5b", torch.bfloat16)
    assert full[0] > 14 * 2**30 and full[1] > 100 * 2**20  # Qwen3.5-9B and FLUX.2, not built


def test_a_text_model_of_another_width_than_text_dim_is_refused():
    with pytest.raises(ConfigError, match="TEXT_ENCODER") as err:
        build_text_encoder(RANDOM, CPU, 64, precision="fp32", preset="tiny")
    assert "width 32" in str(err.value) and "text_dim is 64" in str(err.value)
    with pytest.raises(ConfigError, match="TEXT_ENCODER.*WEIGHTS.*width 4096"):
        check_random_text(RANDOM, "", 32)  # a tiny DiT from WEIGHTS gets the full text model
    check_random_text(RANDOM, "moss-image-5b", 4096)
    check_random_text(EncoderConfig(text_encoder="synthetic"), "tiny", 64)  # synthetic takes any width

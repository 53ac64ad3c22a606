"""EMA: decay warmup, update interval, state round trip, swap-in."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kohakumoss.train import EMA
from kohakumoss_common.errors import ConfigError


def test_ema_math_interval_and_state():
    p = nn.Parameter(torch.zeros(3))
    ema = EMA({"p": p}, decay=0.9, warmup=0, every=2)
    with torch.no_grad():
        p.fill_(1.0)
    assert not ema.update(0)  # steps 0, 2, 4... skip; 1, 3, 5... update
    assert ema.update(1)
    torch.testing.assert_close(ema.shadow["p"], torch.full((3,), 1 - 0.9**2))
    state = ema.state_dict()
    other = EMA({"p": nn.Parameter(torch.zeros(3))}, decay=0.9, warmup=0, every=2)
    other.load_state_dict(state)
    assert torch.equal(other.shadow["p"], ema.shadow["p"]) and other.num_updates == 1
    with ema.swapped():
        torch.testing.assert_close(p.detach(), ema.shadow["p"])
    assert torch.equal(p.detach(), torch.ones(3))


def test_warmup_ramps_decay():
    ema = EMA({"p": nn.Parameter(torch.zeros(1))}, decay=0.999, warmup=10)
    first = ema.current_decay()
    assert first == pytest.approx(1 / 10)
    ema.num_updates = 10_000
    assert ema.current_decay() == pytest.approx(0.999)
    with pytest.raises(ConfigError, match="EMA_DECAY"):
        EMA({"p": nn.Parameter(torch.zeros(1))}, decay=1.0)

"""per_token.one_hot: F.one_hot's result without its host-side index check (capturable)."""

import torch
import torch.nn.functional as F

from kohakumoss_kernels.backends.per_token import one_hot, per_token


def test_one_hot_equals_torchs_and_spreads_each_samples_row():
    token_sample = torch.tensor([0, 2, 1, 1, 0, 2, 2])
    hot = one_hot(token_sample, 3)
    assert hot.dtype == torch.float32 and torch.equal(hot, F.one_hot(token_sample, 3).float())
    param = torch.randn(3, 5)
    torch.testing.assert_close(per_token(param, hot), param[token_sample])

"""One intra-op thread for these tiny-model tests: on a shared 2-core box it is several times faster."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

"""Host copies of cu_seqlens: attention reads them instead of waiting on the device."""

import gc

import pytest
import torch

from kohakumoss.model import PackedSeq
from kohakumoss_kernels.ops.varlen_attention import sdpa_groups
from kohakumoss_kernels.runtime.host_values import _VALUES, host_values, register_host_values


def test_registered_values_are_used_instead_of_the_tensor():
    cu = torch.tensor([0, 4, 8], dtype=torch.int32)
    register_host_values(cu, [0, 3, 8])  # deliberately different: proves the tensor is not read
    assert sdpa_groups.runs(cu) == [(0, 1, 3), (3, 1, 5)]


def test_unregistered_tensors_fall_back_to_their_values():
    cu = torch.tensor([0, 4, 8], dtype=torch.int32)
    assert host_values(cu) == (0, 4, 8)
    assert sdpa_groups.runs(cu) == [(0, 2, 4)]


def test_a_wrong_length_is_refused():
    with pytest.raises(ValueError, match="3 host values for a tensor of 2"):
        register_host_values(torch.zeros(2), [0, 1, 2])


def test_packed_seq_registers_its_bounds_and_keeps_them_when_moved():
    seq = PackedSeq.build([3, 4], [(2, 2), (1, 3)])
    assert host_values(seq.cu_seqlens) == tuple(seq.cu_seqlens.tolist()) == (0, 7, 14)
    moved = seq.to(torch.device("meta"))  # a device whose values cannot be read back
    assert host_values(moved.cu_seqlens) == (0, 7, 14)


def test_entries_die_with_their_tensor():
    before = len(_VALUES)
    cu = register_host_values(torch.tensor([0, 2]), [0, 2])
    assert len(_VALUES) == before + 1
    del cu
    gc.collect()
    assert len(_VALUES) == before

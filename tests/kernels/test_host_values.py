"""Host copies of cu_seqlens: attention reads them instead of waiting on the device."""

import gc

import pytest
import torch
from torch._dynamo.utils import counters

from kohakumoss.model import PackedSeq
from kohakumoss_kernels.backends.compile_utils import compiled
from kohakumoss_kernels.ops.segment_attention import eager as segment_eager
from kohakumoss_kernels.ops.varlen_attention import sdpa_groups
from kohakumoss_kernels.runtime.host_values import _VALUES, host_values, reads, register_host_values


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


def test_a_compiled_op_reads_host_values_without_a_recompile_per_call():
    """Traced by torch.compile, host_values' read count became a guard of its frame: each call of an op's
    `compile` backend (the edit path's segment_attention) recompiled until dynamo's limit (64), then ran eagerly."""
    torch._dynamo.reset()
    attention = compiled(segment_eager.segment_attention)
    frames_before, reads_before = counters["frames"]["total"], reads()
    calls = 70
    for i in range(calls):
        live, refs = 3 + i % 5, 2 + i % 3  # a sample's live and reference lengths change from call to call
        q_cu = [0, live, live + refs, live + refs + 2, live + refs + 4]
        kv_cu = [0, live + refs, live + 2 * refs, live + 2 * refs + 3, live + 2 * refs + 5]
        q, k = torch.randn(q_cu[-1], 2, 4), torch.randn(kv_cu[-1], 2, 4)
        cu_q = register_host_values(torch.tensor(q_cu, dtype=torch.int32), q_cu)
        cu_kv = register_host_values(torch.tensor(kv_cu, dtype=torch.int32), kv_cu)
        out = attention(q, k, k, cu_q, cu_kv, 8, 8)
    torch.testing.assert_close(out, segment_eager.segment_attention(q, k, k, cu_q, cu_kv, 8, 8))
    assert (
        reads() - reads_before == 2 * calls + 2
    )  # still counted: train/graphs.py compares it around a capture
    assert (
        counters["frames"]["total"] - frames_before <= 8
    )  # a few compiles (static, then dynamic), not one per call

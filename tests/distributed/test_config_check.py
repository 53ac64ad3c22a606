"""kohakumoss-config check names the distributed knobs' problems before a run starts."""

from __future__ import annotations

import pytest

from kohakumoss.cli.config_check import check_config


def problems(tmp_path, body: str) -> list[tuple[str, str]]:
    path = tmp_path / "c.py"
    path.write_text("MODEL_PRESET = 'tiny'\n" + body)
    return [
        p
        for p in check_config(path, kind="train").problems
        if p[0]
        in (
            "DISTRIBUTED",
            "DEVICES",
            "CUDA_GRAPHS",
            "GRAD_OFFLOAD",
            "PRECISION",
            "STREAM_BLOCKS",
            "CHECKPOINTING",
        )
    ]


@pytest.mark.parametrize(
    ("body", "knob", "needle"),
    [
        ("DISTRIBUTED = 'fsdp'\nDEVICES = 2\nPRECISION = 'fp16'\n", "PRECISION", "with DISTRIBUTED='fsdp'"),
        ("DISTRIBUTED = 'fsdp'\nDEVICES = 2\nSTREAM_BLOCKS = 4\n", "STREAM_BLOCKS", "FSDP2 shards"),
        ("DISTRIBUTED = 'fsdp'\nDEVICES = 2\nCHECKPOINTING = 'attn'\n", "CHECKPOINTING", "half-block"),
        ("DISTRIBUTED = 'dpp'\n", "DISTRIBUTED", "is not one of"),
        ("DEVICES = 2\n", "DEVICES", "2 workers asked for with DISTRIBUTED='none'"),
        ("DISTRIBUTED = 'ddp'\nDEVICES = ['gpu0']\n", "DEVICES", "'gpu0' is not a device"),
        (
            "DISTRIBUTED = 'fsdp'\nDEVICES = 2\nCUDA_GRAPHS = 'on'\n",
            "CUDA_GRAPHS",
            "'on' with DISTRIBUTED='fsdp'",
        ),
        (
            "DISTRIBUTED = 'fsdp'\nDEVICES = 2\nGRAD_OFFLOAD = True\n",
            "GRAD_OFFLOAD",
            "with DISTRIBUTED='fsdp'",
        ),
        (
            "DISTRIBUTED = 'pipeline'\nDEVICES = 2\nGRAD_OFFLOAD = True\n",
            "GRAD_OFFLOAD",
            "with DISTRIBUTED='pipeline'",
        ),
    ],
)
def test_each_problem_is_named(tmp_path, body, knob, needle):
    found = problems(tmp_path, body)
    assert any(k == knob and needle in why for k, why in found), found


def test_a_good_ddp_config_passes(tmp_path):
    assert problems(tmp_path, "DISTRIBUTED = 'ddp'\nDEVICES = [0, 1]\nDIST_TIMEOUT = 600.0\n") == []
    assert problems(tmp_path, "DISTRIBUTED = 'ddp'\nDEVICES = 2\n") == []
    # graphed DDP steps: gradients averaged after the backward (distributed/rank_run.py RankRun.graphed)
    assert problems(tmp_path, "DISTRIBUTED = 'ddp'\nDEVICES = 2\nCUDA_GRAPHS = 'on'\n") == []
    assert problems(tmp_path, "DISTRIBUTED = 'fsdp'\nDEVICES = 2\nCHECKPOINTING = 'full'\n") == []
    # host-summed gradients run under DDP (averaged over the ranks: distributed/host_grads.py)
    grads = "DISTRIBUTED = 'ddp'\nDEVICES = 2\nOPTIMIZER_PLACEMENT = 'host'\nGRAD_OFFLOAD = True\n"
    assert problems(tmp_path, grads) == []
    assert problems(tmp_path, "DISTRIBUTED = 'ddp'\nDEVICES = 2\nMEMORY_PROFILE = 'minimal'\n") == []

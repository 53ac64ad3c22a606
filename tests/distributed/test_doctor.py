"""kohakumoss-doctor's multi-GPU rows on faked machines: NCCL, P2P access and the topology."""

from __future__ import annotations

from kohakumoss.cli.doctor import DISTRIBUTIONS, Environment, report, run_checks
from kohakumoss.distributed.doctor import DistInfo, checks, parse_topology

TOPO = (
    "\tGPU0\tGPU1\tGPU2\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    "GPU0\t X \tNV18\tSYS\tPIX\t0-47\t0\t\tN/A\n"
    "GPU1\tNV18\t X \tSYS\tSYS\t0-47\t0\t\tN/A\n"
    "GPU2\tSYS\tSYS\t X \tSYS\t48-95\t1\t\tN/A\n"
    "NIC0\tPIX\tSYS\tSYS\t X \n"
    "\nLegend:\n  X    = Self\n  SYS  = Connection traversing PCIe\n"
)


def test_topology_is_parsed_per_gpu_pair():
    assert parse_topology(TOPO) == {(0, 1): "NV18", (0, 2): "SYS", (1, 2): "SYS"}
    assert parse_topology("") == {}


def _rows(info: DistInfo, gpus: int) -> dict[str, tuple]:
    return {name: (ok, detail, fix) for name, ok, detail, fix in checks(info, gpus)}


def test_a_good_node():
    info = DistInfo(gloo=True, nccl="2.27.7", p2p=[[True] * 2] * 2, links={(0, 1): "NV18"})
    rows = _rows(info, 2)
    assert rows["distributed backends"] == (True, "gloo, nccl 2.27.7", "")
    assert rows["gpu p2p"] == (True, "every GPU pair", "")
    assert rows["gpu topology"][:2] == (True, "NV18 x1 over 1 GPU pairs")


def test_missing_nccl_p2p_and_slow_links_are_named():
    p2p = [[True, True, False], [True, True, False], [False, False, True]]
    rows = _rows(DistInfo(gloo=True, nccl=None, p2p=p2p, links=parse_topology(TOPO)), 3)
    ok, detail, fix = rows["distributed backends"]
    assert not ok and detail == "gloo" and "needs NCCL" in fix
    ok, detail, fix = rows["gpu p2p"]
    assert not ok and detail == "no peer access between GPUs 0-2, 1-2" and "host memory" in fix
    ok, detail, fix = rows["gpu topology"]
    assert not ok and detail == "NV18 x1, SYS x2 over 3 GPU pairs" and "SYS links cross the CPU" in fix


def test_the_rows_reach_the_doctor_report_without_blocking():
    env = Environment(
        python=(3, 12, 1),
        packages={d: "1.0" for d in DISTRIBUTIONS} | {"torch": "2.14.1+cu130"},
        torch_cuda="13.0",
        gpus=[{"name": "NVIDIA H200", "capability": (9, 0), "memory": 141 << 30}] * 2,
        driver="580.1",
        driver_cuda="13.0",
        nvidia_smi=True,
        host_ram=64 << 30,
        free_disk=500 << 30,
        qwen3_5=True,
        flux2_vae=True,
        dist=DistInfo(gloo=True, nccl=None, p2p=[[True, False], [False, True]]),
    )
    text, code = report(run_checks(env))
    assert "[warn] distributed backends" in text and "[warn] gpu p2p" in text and code == 0
    assert "no peer access between GPUs 0-1" in text
    cpu = report(run_checks(Environment(python=(3, 12, 1), packages={}, dist=DistInfo(gloo=True))))[0]
    assert "[ok  ] distributed backends           gloo (no GPU: DISTRIBUTED runs CPU workers on gloo)" in cpu

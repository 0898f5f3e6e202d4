"""lab6/bench_peer.py (every GPU pair's link, copy bandwidth and round trip) where no GPU is needed:
the rated speeds, the topology it reads, the table from made-up figures, the README block, and a
machine with fewer than 2 GPUs told so. peer_latency.cu compiles in tests/test_compile_all.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from grader.toolchain import link_rated_gb_s, parse_topology

ROOT = Path(__file__).resolve().parents[1]
LAB6 = ROOT / "lab6"
if str(LAB6) not in sys.path:
    sys.path.insert(0, str(LAB6))

import bench_peer as bench  # noqa: E402

# `nvidia-smi topo -m` on two H200s (driver 580.159.04), and an eight-GPU PCIe machine's shape with a NIC
TWO_H200 = (
    "\t\x1b[4mGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \tNV18\t0-31\t0\t\tN/A\n"
    "GPU1\tNV18\t X \t0-31\t0\t\tN/A\n"
    "\nLegend:\n\n  X    = Self\n  SYS  = Connection traversing PCIe as well as the SMP interconnect\n"
)
PCIE_WITH_NIC = (
    "\tGPU0\tGPU1\tGPU2\tNIC0\tCPU Affinity\tNUMA Affinity\n"
    "GPU0\t X \tPIX\tSYS\tNODE\t0-15\t0\n"
    "GPU1\tPIX\t X \tSYS\tNODE\t0-15\t0\n"
    "GPU2\tSYS\tSYS\t X \tSYS\t16-31\t1\n"
    "NIC0\tNODE\tNODE\tSYS\t X \t\t\n"
)


def test_topology_is_read_from_nvidia_smi() -> None:
    assert parse_topology(TWO_H200) == {(0, 1): "NV18", (1, 0): "NV18"}
    links = parse_topology(PCIE_WITH_NIC)
    assert links[(0, 1)] == "PIX" and links[(2, 0)] == "SYS" and len(links) == 6  # the NIC left out
    assert parse_topology("No devices were found") == {}


def test_rated_speeds() -> None:
    assert link_rated_gb_s("NV18", 9, []) == 450.0  # H100, H200: 18 links x 25 GB/s each way
    assert link_rated_gb_s("NV12", 8, []) == 300.0  # A100
    assert link_rated_gb_s("NV18", 10, []) == 900.0  # B200: NVLink 5, 50 GB/s a link
    assert link_rated_gb_s("PIX", 9, [(5, 16), (5, 16)]) == pytest.approx(63.0, rel=0.01)
    assert link_rated_gb_s("SYS", 8, [(4, 16), (3, 16)]) == pytest.approx(15.76, rel=0.01)  # the slower
    assert link_rated_gb_s("PHB", 9, [(5, 16), None]) is None  # one GPU's link unknown
    assert link_rated_gb_s(None, 9, []) is None
    assert link_rated_gb_s("NV4", 6, []) is None  # a generation not in the table: no guess


def results() -> dict[str, Any]:
    pair = {"link": "NV18", "rated_gb_s": 450.0, "peer_access": True}
    return {
        "device": "NVIDIA H200",
        "driver": "580.159.04",
        "nvcc": "13.0",
        "torch": "2.11.0+cu130",
        "date": "2026-01-02",
        "gpus_visible": 2,
        "copy_bytes": bench.COPY_BYTES,
        "reps": bench.REPS,
        "rounds": bench.ROUNDS,
        "pairs": [
            {**pair, "reader": 0, "source": 1, "copy_gb_s": 371.4, "round_trip_us": 2.5},
            {**pair, "reader": 1, "source": 0, "copy_gb_s": 368.0, "round_trip_us": None, "peer_access": False},
        ],
    }


def test_table() -> None:
    text = bench.table(results())
    assert text.startswith("NVIDIA H200 x 2 (driver 580.159.04, CUDA toolkit 13.0, torch 2.11.0, 2026-01-02)")
    assert "| GPU 0 <- GPU 1 | NV18 | 450 GB/s | 371 GB/s | 83% | 2.50 µs | 1.25 µs |" in text
    assert "| GPU 1 <- GPU 0 | NV18 | 450 GB/s | 368 GB/s | 82% | no peer access | – |" in text


def test_a_copy_past_the_link_is_refused() -> None:
    assert bench.beyond_the_link(results()) == []
    fast = results()
    fast["pairs"][0]["copy_gb_s"] = 480.0  # 7% past NV18's rated 450 GB/s: a timing gone wrong
    assert bench.beyond_the_link(fast) == ["GPU 0 <- GPU 1: 480 GB/s past the NV18 link's rated 450 GB/s"]


def test_readme_block_is_a_placeholder_until_measured() -> None:
    text = bench.README.read_text()
    assert text.count(bench.BEGIN) == 1 and text.count(bench.END) == 1
    block = text.split(bench.BEGIN)[1].split(bench.END)[0]
    assert "Not yet measured" in block or block.lstrip().startswith("Measured by `python lab6/bench_peer.py`")


def test_fewer_than_two_gpus_is_said() -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run(
        [sys.executable, str(LAB6 / "bench_peer.py")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert "needs 2 GPUs to measure a pair; this machine shows 0" in out.stdout


def test_smi_index_follows_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert bench.smi_index(1) == 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert (bench.smi_index(0), bench.smi_index(1)) == (3, 1)

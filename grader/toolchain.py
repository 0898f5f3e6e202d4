"""Finding nvcc, the GPU and the architecture to build for — without importing torch."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

DEFAULT_ARCH = "sm_90"  # what a CPU-only machine compiles for: the course's reference card


class ToolchainError(RuntimeError):
    """Something the grader needs is missing; the message names the fix."""


@dataclass(frozen=True)
class Gpu:
    name: str
    compute_capability: str  # "9.0"
    driver: str
    memory_mib: int
    sm_clock_mhz: str
    mem_clock_mhz: str
    max_sm_clock_mhz: str

    @property
    def arch(self) -> str:
        return "sm_" + self.compute_capability.replace(".", "")


@functools.cache
def find_nvcc() -> Path:
    candidates = [os.environ.get("NVCC"), shutil.which("nvcc")]
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            candidates.append(str(Path(home) / "bin" / "nvcc"))
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return Path(c)
    raise ToolchainError(
        "nvcc not found: install the CUDA toolkit (12.x or 13.x) and put its bin folder on PATH "
        "(e.g. export PATH=/usr/local/cuda/bin:$PATH), or set CUDA_HOME or NVCC"
    )


@functools.cache
def nvcc_version() -> str:
    out = subprocess.run([str(find_nvcc()), "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release (\d+\.\d+)", out)
    return m.group(1) if m else "unknown"


@functools.cache
def nvcc_arches() -> frozenset[str]:
    out = subprocess.run([str(find_nvcc()), "--list-gpu-code"], capture_output=True, text=True)
    return frozenset(re.findall(r"sm_\d+[af]?", out.stdout))


@functools.cache
def gpus() -> tuple[Gpu, ...]:
    """The GPUs nvidia-smi reports; none when GRADER_NO_GPU=1 or there is no driver."""
    if os.environ.get("GRADER_NO_GPU") == "1" or not shutil.which("nvidia-smi"):
        return ()
    fields = "name,compute_cap,driver_version,memory.total,clocks.sm,clocks.mem,clocks.max.sm"
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ()
    if out.returncode != 0:
        return ()
    found = []
    for line in out.stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 7:
            mem = int(parts[3]) if parts[3].isdigit() else 0
            found.append(Gpu(parts[0], parts[1], parts[2], mem, parts[4], parts[5], parts[6]))
    return tuple(found)


def has_gpu() -> bool:
    return bool(gpus())


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def parse_topology(text: str) -> dict[tuple[int, int], str]:
    """{(i, j): link} from `nvidia-smi topo -m`'s matrix: "NV18" (18 bonded NVLinks), "PIX",
    "PXB", "PHB", "NODE" or "SYS" (PCIe paths), for every pair of GPUs i != j, by nvidia-smi's
    indices; the NIC columns and rows, the affinities and the legend are left out."""
    lines = [_ANSI.sub("", ln) for ln in text.splitlines()]
    header = next((ln.split("\t") for ln in lines if re.search(r"\tGPU0\b", ln)), None)
    if header is None:
        return {}
    columns = {k: int(m[1]) for k, cell in enumerate(header) if (m := re.fullmatch(r"\s*GPU(\d+)\s*", cell))}
    links: dict[tuple[int, int], str] = {}
    for ln in lines:
        cells = ln.split("\t")
        row = re.fullmatch(r"GPU(\d+)", cells[0].strip()) if cells else None
        if row is None:
            continue
        for k, j in columns.items():
            if k < len(cells) and cells[k].strip() not in ("X", "") and int(row[1]) != j:
                links[int(row[1]), j] = cells[k].strip()
    return links


# one link's rate in one direction, GB/s, by the card's compute capability (major): NVLink 2 (V100),
# 3 (A100) and 4 (H100, H200) move 25 GB/s a link each way; NVLink 5 (B200) 50 GB/s
NVLINK_GB_S = {7: 25.0, 8: 25.0, 9: 25.0, 10: 50.0}
# PCIe's rate per lane in one direction, GB/s, after the line code (128b/130b from gen 3 on)
PCIE_LANE_GB_S = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


def link_rated_gb_s(link: str | None, compute_major: int, pcie: Sequence[tuple[int, int] | None]) -> float | None:
    """One direction's rated speed of `link` between two GPUs: NV<k> is k NVLinks of the card's
    generation; a PCIe path runs at the slower of the two GPUs' links (`pcie`: (generation, width)
    of each, None where nvidia-smi did not say), None where a figure is unknown."""
    if link is None:
        return None
    m = re.fullmatch(r"NV(\d+)", link)
    if m:
        rate = NVLINK_GB_S.get(compute_major)
        return int(m[1]) * rate if rate else None
    speeds = [PCIE_LANE_GB_S[g[0]] * g[1] for g in pcie if g is not None and g[0] in PCIE_LANE_GB_S and g[1] > 0]
    return min(speeds) if speeds and len(speeds) == len(pcie) else None


def pcie_links() -> dict[int, tuple[int, int]]:
    """{nvidia-smi index: (PCIe generation, width)}, the maximum each GPU and its slot support."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,pcie.link.gen.max,pcie.link.width.max", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    found = {}
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and all(p.isdigit() for p in parts):
            found[int(parts[0])] = (int(parts[1]), int(parts[2]))
    return found


def gpu_topology() -> dict[tuple[int, int], str]:
    """parse_topology of this machine's `nvidia-smi topo -m` ({} without nvidia-smi, or where it fails)."""
    if not shutil.which("nvidia-smi"):
        return {}
    try:
        out = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return parse_topology(out.stdout) if out.returncode == 0 else {}


def visible_gpu_count() -> int:
    """How many GPUs a process started from here can use: those nvidia-smi lists (it ignores
    CUDA_VISIBLE_DEVICES), narrowed by CUDA_VISIBLE_DEVICES where it is set. CUDA reads that
    variable up to its first entry that names no device (an index out of range, "-1", an unknown
    word), so the count stops there too; a UUID (GPU-..., MIG-...) counts as one device."""
    found = len(gpus())
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or not found:
        return found
    count, seen = 0, set()
    for item in (x.strip() for x in visible.split(",")):
        if item.isdigit() and int(item) < found:
            key = str(int(item))
        elif item.startswith(("GPU-", "MIG-")):
            key = item
        else:
            break
        if key in seen:  # CUDA refuses a list that names a device twice: none is visible then
            return 0
        seen.add(key)
        count += 1
    return min(count, found)


def gpus_seen() -> str:
    """The visible count in words, for a message: "1", or "1 (CUDA_VISIBLE_DEVICES=0)"."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    n = visible_gpu_count()
    return f"{n} (CUDA_VISIBLE_DEVICES={visible})" if visible is not None and gpus() else str(n)


def _ancestors(pid: int) -> set[int]:
    """pid and its parents, as far as /proc shows them."""
    seen = set()
    while pid > 1 and pid not in seen:
        seen.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return seen


def other_gpu_processes() -> list[str]:
    """The compute processes nvidia-smi sees on the GPUs this process may use, other than this
    process and its descendants, as 'pid name (MiB)': a leftover job there slows what is timed."""
    if not gpus():
        return []
    try:
        query = "--query-compute-apps=pid,process_name,used_memory,gpu_uuid"
        apps = subprocess.run(
            ["nvidia-smi", query, "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20
        )
        ids = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    uuids = dict(line.split(", ", 1) for line in ids.stdout.strip().splitlines() if ", " in line)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    # CUDA_VISIBLE_DEVICES holds indices or UUIDs
    mine = {uuids.get(i.strip(), i.strip()) for i in visible.split(",")} if visible else set(uuids.values())
    me = os.getpid()
    out = []
    for line in apps.stdout.strip().splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) != 4 or not parts[0].isdigit() or (mine and parts[3] not in mine):
            continue
        if me in _ancestors(int(parts[0])):
            continue
        out.append(f"{parts[0]} {Path(parts[1]).name} ({parts[2]} MiB)")
    return out


def cpu_share(ways: int) -> dict[str, str]:
    """The CPU-thread settings for one of `ways` processes that share this machine's cores (of
    OMP_NUM_THREADS where it is set): torch's thread pool otherwise takes every core in each."""
    budget = int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1)
    threads = str(max(1, budget // max(1, ways)))
    return {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}


def normalize_arch(text: str) -> str:
    """'sm_80', '80', '8.0' and 'compute_80' all mean sm_80."""
    t = text.strip().lower().replace("compute_", "").replace("sm_", "")
    if re.fullmatch(r"\d\.\d", t):
        t = t.replace(".", "")
    if not re.fullmatch(r"\d{2,3}[af]?", t):
        raise ToolchainError(f"GRADER_ARCH={text!r} is not an architecture: use e.g. sm_80 or sm_90")
    return "sm_" + t


def compute_capability(arch: str) -> tuple[int, int]:
    """(major, minor) of an architecture: sm_90 and sm_90a are (9, 0), sm_120 is (12, 0)."""
    digits = normalize_arch(arch).removeprefix("sm_").rstrip("af")
    return int(digits[:-1]), int(digits[-1])


def specific_arch(arch: str) -> str:
    """The architecture-specific target of `arch`: sm_90a for sm_90, sm_100a for sm_100. Code built
    for it may use the instructions of that architecture alone (sm_90a's wgmma and setmaxnreg,
    sm_100a's tcgen05) and runs on that compute capability only. Before 9.0 there is none, and a
    target that is already specific (sm_90a, sm_100f) stays as it is."""
    arch = normalize_arch(arch)
    if arch.endswith(("a", "f")) or compute_capability(arch) < (9, 0):
        return arch
    return arch + "a"


def target_arch() -> str:
    """GRADER_ARCH if set, else the first GPU's, else the course's reference card's."""
    if os.environ.get("GRADER_ARCH"):
        return normalize_arch(os.environ["GRADER_ARCH"])
    found = gpus()
    return found[0].arch if found else DEFAULT_ARCH


def gencode_flags(arch: str, sass: bool = True) -> list[str]:
    """SASS for the card plus PTX, so a newer card can still JIT the kernel; `sass=False`: the PTX
    alone (ptxas never runs: a build that only asks whether the code compiles). An
    architecture-specific target (sm_90a) gives PTX that only its own compute capability runs."""
    supported = nvcc_arches()
    if supported and arch.rstrip("af") not in supported:
        raise ToolchainError(
            f"nvcc {nvcc_version()} cannot build for {arch} (it knows {', '.join(sorted(supported))}): "
            f"install a CUDA toolkit that supports your GPU, or set GRADER_ARCH to one of those"
        )
    num = arch.removeprefix("sm_")
    return [
        f"-gencode=arch=compute_{num},code=[sm_{num},compute_{num}]"
        if sass
        else f"-gencode=arch=compute_{num},code=compute_{num}"
    ]

"""`python -m grader profile lab1/03 [--solutions]` (make profile-labN TASK=NN): why is it slow?

Builds the task as the grader does, then runs its task process in profile mode (each entry point
once on the timing case, after a warm-up: grader/child/profiling.py) under Nsight Compute with
the sections that answer the question, and prints per kernel the few numbers that matter: DRAM
throughput as a share of peak, achieved occupancy, the top warp-stall reasons, shared-memory
bank conflicts and the L2 hit rate. The full report stays in .build/profile/ for `ncu-ui`.
Where Nsight Systems is installed, a timeline of the same calls is recorded next to it.

The commands are built by small functions (ncu_command, import_command, nsys_command) and the
CSV is read by `parse_raw_csv`/`summarize`, all tested without a GPU.
"""

from __future__ import annotations

import contextlib
import csv
import glob
import io
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from grader import paths, toolchain
from grader.build.nvcc import BuildResult, BuildUnit, build_all
from grader.records import ChildJob, ChildReport, TimingMode, Verdict
from grader.tasks.spec import CudaTask

# The sections that answer "why is it slow": throughput against the roofs, occupancy and what
# limits it, the launch, what the warps wait on, and the memory hierarchy (with its tables:
# shared-memory bank conflicts, L2 hits).
SECTIONS = (
    "SpeedOfLight",
    "Occupancy",
    "LaunchStats",
    "WarpStateStats",
    "MemoryWorkloadAnalysis",
    "MemoryWorkloadAnalysis_Tables",
)
# Asked for by name as well, so the summary has them whichever way a version's sections spell theirs.
EXTRA_METRICS = (
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
    "lts__t_sector_hit_rate.pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
)
LAUNCH_LIMIT = 20  # a task that launches kernels in a loop is profiled on its first launches only
SHOWN_KERNELS = 8

NCU_MISSING = (
    "Nsight Compute (ncu) not found: it ships with the CUDA toolkit (…/bin/ncu or the nsight-compute package); "
    "install it or put it on PATH"
)
NSYS_MISSING = (
    "no timeline: Nsight Systems (nsys) is not installed; for one, install it (developer.nvidia.com/nsight-systems, "
    "or the nsight-systems package of NVIDIA's CUDA repository) and put nsys on PATH"
)
PERMISSION = (
    "Nsight Compute may not read this GPU's performance counters (ERR_NVGPUCTRPERM): the driver lets only "
    'root profile. Fix: run it as root (sudo -E env PATH="$PATH" make profile-lab1 TASK=03), or let every '
    "user profile: echo 'options nvidia NVreg_RestrictProfilingToAdminUsers=0' | sudo tee "
    "/etc/modprobe.d/nvidia-profiling.conf, then reboot (in a container, the host must allow it); "
    "see https://developer.nvidia.com/ERR_NVGPUCTRPERM"
)


# --------------------------------------------------------------------------- finding the tools


def _version_key(path: Path) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", str(path)))


def _toolkit_bins() -> list[Path]:
    bins = []
    try:
        bins.append(toolchain.find_nvcc().parent)
    except toolchain.ToolchainError:
        pass
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            bins.append(Path(home) / "bin")
    return bins


def _find(env: str, name: str, globs: Sequence[str]) -> str | None:
    candidates: list[Path] = []
    if os.environ.get(env):
        candidates.append(Path(os.environ[env]))
    if shutil.which(name):
        candidates.append(Path(shutil.which(name) or ""))
    candidates += [b / name for b in _toolkit_bins()]
    for pattern in globs:  # standalone installs, newest version first
        candidates += sorted(map(Path, glob.glob(pattern)), key=_version_key, reverse=True)
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    return None


def find_ncu() -> str | None:
    """ncu: $NCU, PATH, the toolkit's bin, or a standalone Nsight Compute install."""
    standalone = [
        "/opt/nvidia/nsight-compute/*/ncu",
        "/usr/local/cuda/nsight-compute*/ncu",
        "/usr/local/cuda-*/bin/ncu",
    ]
    return _find("NCU", "ncu", standalone)


def find_nsys() -> str | None:
    """nsys: $NSYS, PATH, the toolkit's bin, or a standalone Nsight Systems install."""
    standalone = [
        "/opt/nvidia/nsight-systems/*/bin/nsys",
        "/usr/local/cuda/nsight-systems*/bin/nsys",
        "/usr/local/cuda-*/bin/nsys",
    ]
    return _find("NSYS", "nsys", standalone)


# --------------------------------------------------------------------------- the commands


def report_base(task_id: str, solutions: bool) -> Path:
    """.build/profile/lab1-03 (and lab1-03-solution): the profilers add .ncu-rep / .nsys-rep."""
    return paths.BUILD / "profile" / (task_id.replace("/", "-") + ("-solution" if solutions else ""))


def child_command(result: Path, job_file: Path) -> list[str]:
    return [sys.executable, "-m", "grader.child", "--result", str(result), "--job", str(job_file)]


def ncu_command(ncu: str, report: Path, target: Sequence[str]) -> list[str]:
    """Only the profiler range (the student's calls) is profiled, with the sections above."""
    cmd = [ncu, "--profile-from-start", "off", "--target-processes", "all"]
    for section in SECTIONS:
        cmd += ["--section", section]
    cmd += ["--metrics", ",".join(EXTRA_METRICS)]
    cmd += ["--launch-count", str(LAUNCH_LIMIT), "--export", str(report), "--force-overwrite", *target]
    return cmd


def import_command(ncu: str, report_file: Path) -> list[str]:
    """One CSV row per profiled kernel, every metric a column, in base units (ns, %, bytes)."""
    return [ncu, "--import", str(report_file), "--csv", "--page", "raw", "--print-units", "base"]


def nsys_command(nsys: str, report: Path, target: Sequence[str]) -> list[str]:
    return [
        nsys,
        "profile",
        "--trace",
        "cuda,nvtx",
        "--capture-range",
        "cudaProfilerApi",
        "--output",
        str(report),
        "--force-overwrite",
        "true",
        *target,
    ]


# --------------------------------------------------------------------------- reading the report


def _number(text: str) -> float | None:
    t = text.strip().replace(",", "")
    try:
        return float(t)
    except ValueError:
        return None  # "n/a", "" and the like


def parse_raw_csv(text: str) -> tuple[dict[str, str], list[dict[str, str]]]:
    """ncu's `--page raw --csv`: a header row, a units row, then one row per profiled kernel.
    Returns the units by column and the kernel rows; anything before the header is skipped."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return {}, []
    table = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    header = table[0]
    units: dict[str, str] = {}
    kernels = []
    for row in table[1:]:
        if len(row) != len(header):
            continue
        record = dict(zip(header, row, strict=True))
        if not record["ID"].strip():  # the units row has no ID
            units = record
        else:
            kernels.append(record)
    return units, kernels


# stall reason -> what it usually means, for the student reading the summary
STALL_HINTS = {
    "long_scoreboard": "waiting for global/local memory",
    "short_scoreboard": "waiting for shared memory or special math",
    "barrier": "waiting at __syncthreads()",
    "membar": "waiting at a memory fence",
    "mio_throttle": "shared-memory/special-function queue full",
    "lg_throttle": "global-memory queue full: fewer, wider accesses help",
    "tex_throttle": "texture queue full",
    "math_pipe_throttle": "math units busy: compute bound",
    "wait": "fixed-latency dependencies between instructions",
    "not_selected": "ready, another warp issued: the scheduler is busy",
    "dispatch_stall": "dispatch held back",
    "drain": "stores draining at exit",
    "imc_miss": "constant-cache miss",
    "no_instruction": "instruction-cache miss or branch target",
    "branch_resolving": "resolving a branch",
    "sleeping": "warp asleep (nanosleep)",
    "misc": "miscellaneous",
}
# Families of per-reason stall metrics, most useful first; the first one the report holds is used.
STALL_FAMILIES = (
    re.compile(r"^smsp__average_warps_issue_stalled_(?P<r>\w+?)_per_issue_active\.ratio$"),
    re.compile(r"^smsp__average_warp_latency_issue_stalled_(?P<r>\w+?)\.ratio$"),
    re.compile(r"^smsp__warp_issue_stalled_(?P<r>\w+?)_per_warp_active\.pct$"),
    re.compile(r"^smsp__pcsamp_warps_issue_stalled_(?P<r>\w+?)(?:_not_issued)?$"),
)
NOT_A_STALL = {"selected"}  # the warp issued: the cycle was used


def _first(row: dict[str, str], names: Sequence[str]) -> float | None:
    for name in names:
        if name in row and (value := _number(row[name])) is not None:
            return value
    return None


def _microseconds(value: float | None, unit: str) -> float | None:
    scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6}
    return None if value is None else value * scale.get(unit.strip(), 1e-3)


def stall_reasons(row: dict[str, str]) -> list[tuple[str, float]]:
    """(reason, value) by decreasing value, from the first stall family the report holds."""
    for family in STALL_FAMILIES:
        found: dict[str, float] = {}
        for name, text in row.items():
            m = family.match(name)
            if m and m["r"] not in NOT_A_STALL and (value := _number(text)) is not None:
                found[m["r"]] = found.get(m["r"], 0.0) + value
        if found:
            return sorted(found.items(), key=lambda kv: (-kv[1], kv[0]))
    return []


@dataclass
class KernelSummary:
    name: str
    grid: str = ""
    block: str = ""
    duration_us: float | None = None
    dram_pct: float | None = None
    occupancy_pct: float | None = None
    theoretical_pct: float | None = None
    stalls: list[tuple[str, float]] = field(default_factory=list)
    conflicts_ld: float | None = None
    conflicts_st: float | None = None
    wavefronts_ld: float | None = None
    wavefronts_st: float | None = None
    l2_hit_pct: float | None = None


def short_name(name: str) -> str:
    """`void saxpy_kernel<256>(int, float *)` -> `saxpy_kernel<256>`: the function, not its signature."""
    depth = 0
    for i, ch in enumerate(name):
        if ch in "<[":
            depth += 1
        elif ch in ">]":
            depth -= 1
        elif ch == "(" and depth == 0:
            name = name[:i]
            break
    return name.removeprefix("void ").strip()


def summarize(units: dict[str, str], kernels: list[dict[str, str]]) -> list[KernelSummary]:
    out = []
    for row in kernels:
        duration = _first(row, ["gpu__time_duration.sum"])
        out.append(
            KernelSummary(
                name=short_name(row.get("Kernel Name", row.get("Function Name", "?"))),
                grid=row.get("Grid Size", ""),
                block=row.get("Block Size", ""),
                duration_us=_microseconds(duration, units.get("gpu__time_duration.sum", "nsecond")),
                dram_pct=_first(
                    row,
                    [
                        "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
                        "dram__throughput.avg.pct_of_peak_sustained_elapsed",
                    ],
                ),
                occupancy_pct=_first(row, ["sm__warps_active.avg.pct_of_peak_sustained_active"]),
                theoretical_pct=_first(row, ["sm__maximum_warps_per_active_cycle_pct"]),
                stalls=stall_reasons(row),
                conflicts_ld=_first(row, ["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"]),
                conflicts_st=_first(row, ["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"]),
                wavefronts_ld=_first(row, ["l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"]),
                wavefronts_st=_first(row, ["l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum"]),
                l2_hit_pct=_first(row, ["lts__t_sector_hit_rate.pct"]),
            )
        )
    return out


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}%"


def _duration(us: float | None) -> str:
    if us is None:
        return ""
    return f"{us / 1e3:.3f} ms" if us >= 1000 else f"{us:.1f} µs"


def _count(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


def format_kernel(k: KernelSummary) -> list[str]:
    """The lines `make profile-labN` prints for one kernel."""
    head = f"  {k.name}"
    if k.grid or k.block:
        head += f"  grid {k.grid} × block {k.block}"
    if k.duration_us is not None:
        head += f"  {_duration(k.duration_us)}"
    lines = [head, f"    {'DRAM throughput':<29} {_pct(k.dram_pct)} of peak"]
    occupancy = f"{_pct(k.occupancy_pct)} of the SM's warp slots"
    if k.theoretical_pct is not None:
        occupancy += f" (theoretical {_pct(k.theoretical_pct)})"
    lines.append(f"    {'achieved occupancy':<29} {occupancy}")
    if k.stalls:
        total = sum(v for _, v in k.stalls) or 1.0
        top = [
            f"{r.replace('_', ' ')} {100 * v / total:.0f}%" + (f" ({STALL_HINTS[r]})" if r in STALL_HINTS else "")
            for r, v in k.stalls[:3]
        ]
        lines.append(f"    {'top warp stalls':<29} " + "; ".join(top))
    else:
        lines.append(f"    {'top warp stalls':<29} n/a")
    if k.conflicts_ld is None and k.conflicts_st is None:
        banks = "n/a"
    elif not k.conflicts_ld and not k.conflicts_st:
        banks = "none" + (" (no shared-memory accesses)" if not k.wavefronts_ld and not k.wavefronts_st else "")
    else:
        banks = f"{_count(k.conflicts_ld)} on loads, {_count(k.conflicts_st)} on stores"
        if k.wavefronts_ld or k.wavefronts_st:
            banks += f" (of {_count(k.wavefronts_ld)} / {_count(k.wavefronts_st)} shared-memory wavefronts)"
    lines.append(f"    {'shared-memory bank conflicts':<29} {banks}")
    lines.append(f"    {'L2 hit rate':<29} {_pct(k.l2_hit_pct)}")
    return lines


def permission_problem(output: str) -> bool:
    return "ERR_NVGPUCTRPERM" in output


def run_tool(cmd: Sequence[str], timeout: float) -> tuple[int | None, str]:
    """A profiler with the task's process under it: (exit status, stdout+stderr); (None, output) when
    it ran past `timeout`, after the whole process group was killed (a hung kernel dies with it)."""
    from grader.parent.isolation import child_env

    proc = subprocess.Popen(
        list(cmd),
        cwd=paths.ROOT,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, out


def _tail(text: str, n: int = 12) -> str:
    return "\n".join("    " + line for line in text.strip().splitlines()[-n:])


# --------------------------------------------------------------------------- the command


def build_task(task: CudaTask, sources: Mapping[str, Path], variant: str) -> BuildResult:
    """The task's library, built exactly as the runner builds it (one unit: all its files, its flags,
    libraries and header wheels). The one call of build_all here, so a change to it lands here."""
    unit = BuildUnit.for_task(task, sources, variant)
    return build_all([unit])[unit]


def profile(task_id: str, solutions: bool, say: Callable[[str], None]) -> int:
    """0: the summary was printed; 1: the task did not build or run; 2: this machine lacks what
    profiling needs (a tool, a GPU, the permission), or there is no such task."""
    from grader.child.profiling import profiled_case
    from grader.parent.runner import Options, sources_of
    from grader.parent.static_checks import check_source
    from grader.tasks.catalogue import task_by_id

    try:
        task = task_by_id(task_id)
    except KeyError as e:
        say(f"error: {e.args[0]}")
        return 2
    if not isinstance(task, CudaTask):
        say(f"{task.task_id} is a {task.kind} task: profiling covers the CUDA-library tasks (their .cu files)")
        return 2
    ncu = find_ncu()
    problems = [] if ncu else [NCU_MISSING]
    if not toolchain.has_gpu():
        problems.append("no NVIDIA GPU visible (nvidia-smi finds none): Nsight Compute profiles kernels on a GPU")
    if problems:
        for p in problems:
            say(p)
        return 2
    assert ncu is not None
    sources = sources_of(task, Options(solutions=solutions))
    src = sources[task.source]
    if not src.exists():
        say(f"error: {paths.rel(src)} does not exist")
        return 1
    outcome = check_source(task, src.read_text(), paths.rel(src))
    if outcome.verdict == Verdict.NOT_STARTED:
        say(f"{outcome.message}: nothing to profile yet (--solutions profiles the reference solution)")
        return 1
    if outcome.verdict is not None:
        say(f"note: {outcome.message}")
    variant = "solution" if solutions else "student"
    try:
        built = build_task(task, sources, variant)
    except toolchain.ToolchainError as e:
        say(f"error: {e}")
        return 2
    if not built.ok or built.lib is None:
        say(f"{built.verdict}: {built.error}")
        return 2 if built.verdict == Verdict.ENVIRONMENT else 1
    base = report_base(task.task_id, solutions)
    base.parent.mkdir(parents=True, exist_ok=True)
    job_file, result = base.with_suffix(".job.json"), base.with_suffix(".result.json")
    job = ChildJob(
        spec=task.spec_file,
        sources={rel: str(p) for rel, p in sources.items()},
        lib=str(built.lib),
        timing=TimingMode.OFF,
        variant=variant,
        profile=True,
    )
    job_file.write_text(job.to_line())
    case = profiled_case(task)
    who = "the reference solution" if solutions else "your code"
    say(f"Profiling {task.task_id} ({task.title}), {who} in {paths.rel(src)}, on case {case.label} ...")
    timeout = max(300.0, 10 * (task.timeout or 60.0))
    report = Path(str(base) + ".ncu-rep")
    report.unlink(missing_ok=True)
    result.unlink(missing_ok=True)
    code, output = run_tool(ncu_command(ncu, base, child_command(result, job_file)), timeout)
    log = Path(str(base) + ".ncu.log")
    log.write_text(output)
    if code is None:
        say(f"ncu ran past {timeout:.0f} s and was stopped: a kernel that never finishes? ({paths.rel(log)})")
        return 1
    if permission_problem(output):
        say(PERMISSION)
        return 2
    child = ChildReport.load(result)
    if child.verdict != Verdict.PASS:
        why = child.message or f"the task's process ended in {child.phase} without a result"
        say(f"the task did not run to the end under ncu ({child.verdict or 'crash'}): {why}")
        say(f"ncu's output (all of it in {paths.rel(log)}):\n{_tail(output)}")
        return 1
    if not report.exists():
        if "No kernels were profiled" in output:
            say("ncu profiled no kernel: the entry points launched none between cudaProfilerStart and Stop")
        else:
            say(f"ncu wrote no report (exit {code}); its output (all of it in {paths.rel(log)}):")
            say(_tail(output))
        return 1
    imported = subprocess.run(import_command(ncu, report), capture_output=True, text=True, timeout=300, check=False)
    units, kernels = parse_raw_csv(imported.stdout)
    if not kernels:
        say(f"could not read the report back (ncu --import exit {imported.returncode}):\n{_tail(imported.stderr)}")
        return 1
    summaries = summarize(units, kernels)
    device = f" on {child.device.name}" if child.device else ""
    say(f"Nsight Compute{device}: {len(summaries)} kernel launch{'es' if len(summaries) != 1 else ''} profiled")
    for k in summaries[:SHOWN_KERNELS]:
        for line in format_kernel(k):
            say(line)
    if len(summaries) > SHOWN_KERNELS:
        say(f"  … and {len(summaries) - SHOWN_KERNELS} more launches in the report")
    if len(summaries) >= LAUNCH_LIMIT:
        say(f"  (ncu stops after {LAUNCH_LIMIT} launches: later ones are not profiled)")
    for note in child.notes:
        say(f"note: {note}")
    say(f"full report: {paths.rel(report)}  (open it with ncu-ui, the Nsight Compute GUI, for every section)")
    nsys = find_nsys()
    if nsys is None:
        say(NSYS_MISSING)
        return 0
    timeline = Path(str(base) + ".nsys-rep")
    timeline.unlink(missing_ok=True)
    code, _ = run_tool(nsys_command(nsys, base, child_command(result.with_suffix(".nsys.json"), job_file)), timeout)
    if code == 0 and timeline.exists():
        say(f"timeline: {paths.rel(timeline)}  (open it with nsys-ui, the Nsight Systems GUI)")
    else:
        say(f"nsys could not record a timeline (the ncu summary above stands): {nsys} exited without {timeline.name}")
    return 0

"""`python -m grader profile` (make profile-labN TASK=NN): the ncu/nsys commands, reading ncu's raw
CSV back, the messages for a missing tool or permission, and, on a GPU with ncu, the real thing."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from grader import paths, toolchain
from grader.build.nvcc import BuildResult
from grader.instructor import profile
from grader.records import ChildJob, Verdict
from grader.tasks.catalogue import task_by_id

HEADER = (
    '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
    '"Device","CC","dram__bytes_read.sum","gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",'
    '"gpu__time_duration.sum","l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",'
    '"l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",'
    '"l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum","l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",'
    '"lts__t_sector_hit_rate.pct","sm__maximum_warps_per_active_cycle_pct",'
    '"sm__warps_active.avg.pct_of_peak_sustained_active",'
    '"smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio",'
    '"smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",'
    '"smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",'
    '"smsp__average_warps_issue_stalled_selected_per_issue_active.ratio",'
    '"smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio",'
    '"smsp__average_warps_issue_stalled_wait_per_issue_active.ratio"'
)
UNITS = '"","","","","","","","","","","","byte","%","nsecond","","","","","%","%","%","","","","","",""'
SAXPY = (
    '"0","4242","python3.11","gpu-host","saxpy_kernel(int, float, const float *, const float *, float *)","1","7",'
    '"(256, 1, 1)","(262144, 1, 1)","0","9.0","805,306,368","91.37","523,488","0","0","0","0","33.21","100",'
    '"85.12","99.0","0.02","24.51","1.00","0.03","2.10"'
)
TRANSPOSE = (
    '"1","4242","python3.11","gpu-host","void transpose_tiled<32>(const float *, float *, int, int)","1","7",'
    '"(32, 8, 1)","(128, 128, 1)","0","9.0","67,108,864","61.5","89,120","95,141","62,295","1,048,576",'
    '"1,048,576","12.5","100","72.4","n/a","6.2","3.1","1","4.4","0.9"'
)
CSV = "\n".join(["==PROF== Connected to process 4242", HEADER, UNITS, SAXPY, TRANSPOSE]) + "\n"


def test_ncu_command_profiles_only_the_range_with_the_why_is_it_slow_sections():
    target = ["python", "-m", "grader.child", "--result", "r.json", "--job", "j.json"]
    cmd = profile.ncu_command("/cuda/bin/ncu", Path(".build/profile/lab1-03"), target)
    assert cmd[0] == "/cuda/bin/ncu" and cmd[-len(target) :] == target
    assert cmd[cmd.index("--profile-from-start") + 1] == "off"
    sections = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--section"]
    assert sections == [
        "SpeedOfLight",
        "Occupancy",
        "LaunchStats",
        "WarpStateStats",
        "MemoryWorkloadAnalysis",
        "MemoryWorkloadAnalysis_Tables",
    ]
    assert cmd.count("--metrics") == 1  # ncu keeps only the last --metrics
    assert "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum" in cmd[cmd.index("--metrics") + 1]
    assert cmd[cmd.index("--export") + 1] == ".build/profile/lab1-03" and "--force-overwrite" in cmd
    assert cmd.index("--force-overwrite") < cmd.index("python")


def test_import_and_nsys_commands():
    imp = profile.import_command("ncu", Path("r.ncu-rep"))
    assert imp == ["ncu", "--import", "r.ncu-rep", "--csv", "--page", "raw", "--print-units", "base"]
    nsys = profile.nsys_command("nsys", Path(".build/profile/lab1-03"), ["python", "x"])
    assert nsys[:2] == ["nsys", "profile"] and nsys[nsys.index("--trace") + 1] == "cuda,nvtx"
    assert nsys[nsys.index("--output") + 1] == ".build/profile/lab1-03" and nsys[-2:] == ["python", "x"]
    assert nsys[nsys.index("--capture-range") + 1] == "cudaProfilerApi"


def test_report_names():
    assert profile.report_base("lab1/03", False) == paths.BUILD / "profile" / "lab1-03"
    assert profile.report_base("lab1/03", True).name == "lab1-03-solution"


def test_raw_csv_is_read_per_kernel():
    units, kernels = profile.parse_raw_csv(CSV)
    assert units["gpu__time_duration.sum"] == "nsecond" and len(kernels) == 2
    saxpy, transpose = profile.summarize(units, kernels)
    assert saxpy.name == "saxpy_kernel" and saxpy.grid == "(262144, 1, 1)" and saxpy.block == "(256, 1, 1)"
    assert saxpy.duration_us == pytest.approx(523.488)
    assert (saxpy.dram_pct, saxpy.occupancy_pct, saxpy.theoretical_pct, saxpy.l2_hit_pct) == (91.37, 85.12, 100, 33.21)
    # the per-issue family wins over the latency one; "selected" is not a stall
    assert [r for r, _ in saxpy.stalls] == ["long_scoreboard", "wait", "short_scoreboard", "barrier"]
    assert (saxpy.conflicts_ld, saxpy.conflicts_st) == (0, 0)
    assert transpose.name == "transpose_tiled<32>"
    assert (transpose.conflicts_ld, transpose.conflicts_st, transpose.wavefronts_ld) == (95141, 62295, 1048576)


def test_summary_lines_say_the_numbers_that_matter():
    units, kernels = profile.parse_raw_csv(CSV)
    saxpy, transpose = profile.summarize(units, kernels)
    text = "\n".join(profile.format_kernel(saxpy))
    assert "saxpy_kernel  grid (262144, 1, 1) × block (256, 1, 1)  523.5 µs" in text
    assert "DRAM throughput               91.4% of peak" in text
    assert "achieved occupancy            85.1% of the SM's warp slots (theoretical 100.0%)" in text
    assert "long scoreboard 92% (waiting for global/local memory); wait 8%" in text
    assert "shared-memory bank conflicts  none (no shared-memory accesses)" in text
    assert "L2 hit rate                   33.2%" in text
    other = "\n".join(profile.format_kernel(transpose))
    assert "95,141 on loads, 62,295 on stores (of 1,048,576 / 1,048,576 shared-memory wavefronts)" in other
    assert "long scoreboard" in other and "barrier" in other


def test_missing_metrics_read_as_n_a_and_other_stall_families():
    header = (
        '"ID","Kernel Name","dram__throughput.avg.pct_of_peak_sustained_elapsed",'
        '"smsp__pcsamp_warps_issue_stalled_barrier","smsp__pcsamp_warps_issue_stalled_wait"'
    )
    csv = "\n".join([header, '"","","%","",""', '"0","k(int)","12.5","300","100"'])
    (k,) = profile.summarize(*profile.parse_raw_csv(csv))
    assert k.dram_pct == 12.5 and k.stalls == [("barrier", 300.0), ("wait", 100.0)]
    lines = "\n".join(profile.format_kernel(k))
    assert "achieved occupancy            n/a" in lines and "L2 hit rate                   n/a" in lines
    assert profile.parse_raw_csv("==ERROR== something went wrong\n") == ({}, [])


def test_short_kernel_names():
    assert profile.short_name("void saxpy_kernel<(int)256>(int, float *)") == "saxpy_kernel<(int)256>"
    assert profile.short_name("reduce(const float *, float *)") == "reduce"
    assert profile.short_name("plain") == "plain"


def test_missing_ncu_and_gpu_are_said_with_what_to_install(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(profile, "find_ncu", lambda: None)
    monkeypatch.setattr(toolchain, "has_gpu", lambda: False)
    out: list[str] = []
    assert profile.profile("lab1/03", False, out.append) == 2
    assert out[0] == profile.NCU_MISSING and "ships with the CUDA toolkit" in out[0]
    assert "no NVIDIA GPU" in out[1]


def test_unknown_task_is_a_usage_error():
    out: list[str] = []
    assert profile.profile("lab1/99", False, out.append) == 2 and "lab1/03" in out[0]


def test_permission_error_is_explained():
    assert profile.permission_problem("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission")
    assert "NVreg_RestrictProfilingToAdminUsers=0" in profile.PERMISSION and "sudo" in profile.PERMISSION


FAKE_NCU = """\
#!{python}
# A stand-in for ncu: writes the report and the task's result as the real run would, or refuses.
import json, os, sys
args = sys.argv[1:]
if "--import" in args:
    sys.stdout.write(open({csv!r}).read())
    sys.exit(0)
if os.environ.get("FAKE_NCU_PERM"):
    print("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters")
    sys.exit(1)
open(args[args.index("--export") + 1] + ".ncu-rep", "w").write("report")
job = json.loads(open(args[args.index("--job") + 1]).read())
assert job["profile"] is True and job["timing"] == "off", job
report = {{"verdict": "pass", "phase": {{"stage": "done"}}, "message": "n=67108867",
          "device": {{"name": "NVIDIA H100 80GB HBM3", "cc": "9.0", "sms": 132}}}}
open(args[args.index("--result") + 1], "w").write(json.dumps(report))
"""

needs_solutions = pytest.mark.skipif(
    not (paths.ROOT / "lab1" / "solutions" / "03_saxpy.cu").exists(), reason="no reference solutions (a release)"
)


@pytest.fixture
def fake_ncu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "raw.csv").write_text(CSV)
    exe = tmp_path / "ncu"
    exe.write_text(FAKE_NCU.format(python=sys.executable, csv=str(tmp_path / "raw.csv")))
    exe.chmod(0o755)
    monkeypatch.setattr(profile, "find_ncu", lambda: str(exe))
    monkeypatch.setattr(profile, "find_nsys", lambda: None)
    monkeypatch.setattr(toolchain, "has_gpu", lambda: True)
    monkeypatch.setattr(profile, "report_base", lambda task_id, solutions: tmp_path / "out" / "lab1-03")
    monkeypatch.setattr(profile, "build_task", lambda task, srcs, variant: BuildResult(Path(), True, tmp_path / "l.so"))
    return exe


@needs_solutions
def test_the_whole_command_with_a_stand_in_ncu(fake_ncu: Path):
    out: list[str] = []
    assert profile.profile("lab1/03", True, out.append) == 0, "\n".join(out)
    text = "\n".join(out)
    assert "Profiling lab1/03 (saxpy (many blocks)), the reference solution" in text and "n=67108867" in text
    assert "Nsight Compute on NVIDIA H100 80GB HBM3: 2 kernel launches profiled" in text
    assert "DRAM throughput               91.4% of peak" in text
    assert "full report: " in text and "lab1-03.ncu-rep" in text and "ncu-ui" in text
    assert out[-1] == profile.NSYS_MISSING


@needs_solutions
def test_the_whole_command_when_ncu_may_not_read_the_counters(fake_ncu: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("FAKE_NCU_PERM", "1")
    out: list[str] = []
    assert profile.profile("lab1/03", True, out.append) == 2
    assert out[-1] == profile.PERMISSION


def test_profile_jobs_round_trip_and_pick_the_timing_case():
    from grader.child.profiling import profiled_case

    job = ChildJob(spec="s.py", sources={}, lib="x.so", timing="off", profile=True)
    assert ChildJob.from_line(job.to_line()).profile is True
    assert ChildJob.from_line(ChildJob(spec="s.py", sources={}).to_line()).profile is False
    task = task_by_id("lab1/03")
    assert profiled_case(task).label == task.timing_case == f"n={(1 << 26) + 3}"


def _gpu_and_ncu() -> str | None:
    if not toolchain.has_gpu():
        return "no NVIDIA GPU: profiling needs one"
    if profile.find_ncu() is None:
        return "Nsight Compute (ncu) not installed"
    if not (paths.ROOT / "lab1" / "solutions" / "03_saxpy.cu").exists():
        return "no reference solutions here (a student release)"
    return None


@pytest.mark.gpu
@pytest.mark.skipif(_gpu_and_ncu() is not None, reason=_gpu_and_ncu() or "")
def test_profile_lab1_03_on_the_gpu():
    run = subprocess.run(
        [sys.executable, "-m", "grader", "profile", "lab1/03", "--solutions"],
        cwd=paths.ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    text = textwrap.dedent(run.stdout + run.stderr)
    if "ERR_NVGPUCTRPERM" in text:
        pytest.skip("ncu may not read the GPU's counters here (ERR_NVGPUCTRPERM): " + profile.PERMISSION)
    assert run.returncode == 0, text
    for words in (
        "saxpy",
        "DRAM throughput",
        "% of peak",
        "achieved occupancy",
        "top warp stalls",
        "shared-memory bank conflicts",
        "L2 hit rate",
        "ncu-ui",
    ):
        assert words in text, f"{words!r} missing from:\n{text}"
    assert "n/a of peak" not in text, text
    assert (paths.BUILD / "profile" / "lab1-03-solution.ncu-rep").exists()
    print(text)


@pytest.mark.skipif(toolchain.has_gpu(), reason="checks the answer of a machine without a GPU")
def test_task_process_in_profile_mode_without_a_gpu_says_so(tmp_path: Path):
    from grader.parent.isolation import child_env
    from grader.records import ChildReport, Verdict

    task = task_by_id("lab1/03")
    job = ChildJob(spec=task.spec_file, sources={}, lib=str(tmp_path / "lib.so"), timing="off", profile=True)
    job_file, result = tmp_path / "job.json", tmp_path / "result.json"
    job_file.write_text(job.to_line())
    env = {**child_env(), "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run(
        profile.child_command(result, job_file), cwd=paths.ROOT, env=env, capture_output=True, text=True
    )
    report = ChildReport.load(result)
    assert run.returncode == 0, run.stderr
    assert report.verdict == Verdict.SKIPPED and "profiling needs one" in report.message


@needs_solutions
@pytest.mark.parametrize(("verdict", "code"), [(Verdict.COMPILE_ERROR, 1), (Verdict.ENVIRONMENT, 2)])
def test_a_failed_build_is_reported_with_its_verdict(
    fake_ncu: Path, monkeypatch: pytest.MonkeyPatch, verdict: Verdict, code: int
):
    failed = BuildResult(Path(), False, None, error="03_saxpy.cu:12: error: boom", verdict=verdict)
    monkeypatch.setattr(profile, "build_task", lambda task, srcs, variant: failed)
    out: list[str] = []
    assert profile.profile("lab1/03", True, out.append) == code
    assert out == [f"{verdict}: 03_saxpy.cu:12: error: boom"]


@needs_solutions
@pytest.mark.skipif(shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists(), reason="no nvcc")
def test_build_task_builds_the_unit_the_runner_builds():
    from grader.parent.runner import Options, sources_of

    task = task_by_id("lab1/03")
    built = profile.build_task(task, sources_of(task, Options(solutions=True)), "solution")
    assert built.ok and built.lib is not None and built.lib.exists(), built.error


def test_run_tool_kills_a_hung_run():
    code, _ = profile.run_tool(["sleep", "30"], timeout=0.5)
    assert code is None


@needs_solutions
def test_a_timeline_where_nsys_is_installed(fake_ncu: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    nsys = tmp_path / "nsys"
    script = "import sys\na = sys.argv\nopen(a[a.index('--output') + 1] + '.nsys-rep', 'w').write('t')\n"
    nsys.write_text(f"#!{sys.executable}\n{script}")
    nsys.chmod(0o755)
    monkeypatch.setattr(profile, "find_nsys", lambda: str(nsys))
    out: list[str] = []
    assert profile.profile("lab1/03", True, out.append) == 0
    assert out[-1].startswith("timeline: ") and "lab1-03.nsys-rep" in out[-1] and "nsys-ui" in out[-1]

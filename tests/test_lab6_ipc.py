"""Lab 6's tasks 02 and 03 (the ring and one-shot all-reduces over CUDA IPC memory), where no GPU is needed.

Their graders (lab6/tests/test_02_ring.py, test_03_one_shot.py) run on 2 GPUs only. What can be
checked without one:

- the specs: Python tasks whose source is a .cu file the grader builds (builds_library), on 2
  GPUs, every scenario of kiln_tp/ipc.py checked by one point test, every mistake class named;
- the files: each skeleton is its solution's, with TODO(lab6/NN) regions, and returns
  cudaErrorNotYetImplemented where the work goes; the solution flags with release/acquire at
  system scope;
- the builds: skeleton and solution compile with the course's nvcc flags and export the task's
  seven C functions (loading a library needs no GPU: nothing runs at load);
- kiln_tp/ipc.py: the inputs are whole numbers whose sums are exact and new at every call, a
  mismatch is described, a library whose first call fails is reported by name, and a GPU that
  never finishes a call is named by its scenario and call within CALL_LIMIT_S;
- bench_allreduce.py: sizes, bus bandwidth (the 2(W - 1)/W factor), the table and the goals, from
  made-up timings; and the README's block is still the placeholder until a GPU run writes it.
"""

from __future__ import annotations

import ctypes
import re
import sys
from pathlib import Path

import pytest

from grader import paths, toolchain
from grader.tasks.catalogue import load_task
from grader.tasks.python import PythonTask
from grader.tasks.regions import find_regions, make_skeleton

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
LAB6 = ROOT / "lab6"
if str(LAB6) not in sys.path:
    sys.path.insert(0, str(LAB6))

TASKS = {"02": ("02_ring.cu", "ring"), "03": ("03_one_shot.cu", "one_shot")}
FUNCTIONS = ("alloc", "buffer", "export", "open", "all_reduce", "close", "free")
has_solutions = (LAB6 / "solutions" / "02_ring.cu").exists()
needs_solutions = pytest.mark.skipif(not has_solutions, reason="no reference solutions here (a student release)")


def spec(number: str) -> PythonTask:
    stem = {"02": "test_02_ring.py", "03": "test_03_one_shot.py"}[number]
    task = load_task(LAB6 / "tests" / stem)
    assert isinstance(task, PythonTask)
    return task


def ipc():
    from kiln_tp import ipc as module

    return module


@pytest.mark.parametrize("number", sorted(TASKS))
def test_spec_is_a_two_gpu_python_task_with_a_library(number):
    task = spec(number)
    source, _ = TASKS[number]
    assert list(task.sources) == [source] and task.builds_library and task.library_sources == [source]
    assert task.gpu and task.gpus == 2 and task.timeout and task.timeout >= 300
    assert "kiln_tp" in task.packages and task.mistakes


@pytest.mark.parametrize("number", sorted(TASKS))
def test_every_scenario_has_a_point_test(number):
    """Each scenario check_all_reduce runs is one point test of the spec, and each point test reads one."""
    text = (LAB6 / "tests" / Path(spec(number).spec_file).name).read_text()
    checked = re.findall(r'check\(found, "(\w+)"\)', text)
    assert sorted(checked) == sorted(ipc().SCENARIOS)
    assert len(re.findall(r"@pytest\.mark\.points\(\d+\)", text)) == len(ipc().SCENARIOS)


@needs_solutions
@pytest.mark.parametrize("number", sorted(TASKS))
def test_skeleton_is_the_solutions_with_tagged_todos(number):
    source, prefix = TASKS[number]
    sol, student = paths.solution_source(LAB6, source), LAB6 / source
    assert student.read_text() == make_skeleton(sol.read_text(), paths.rel(sol))
    regions = find_regions(student.read_text(), source)
    assert regions and {r.tag for r in regions} == {f"lab6/{number}"}
    skeleton = student.read_text()
    assert f"COURSE_API cudaError_t {prefix}_all_reduce(" in skeleton
    assert "return cudaErrorNotYetImplemented;" in skeleton
    assert "Test:      make test-lab6 TASK=" + number in skeleton
    solution = sol.read_text()
    assert "st.release.sys" in solution and "ld.acquire.sys" in solution  # the flags' two sides
    assert "CUDA_CHECK(" in solution and '#include "course.h"' in solution


@pytest.mark.parametrize("number", sorted(TASKS))
@pytest.mark.parametrize("which", ["student", "solution"])
def test_library_builds_and_exports_the_seven_functions(number, which):
    try:
        toolchain.find_nvcc()
    except toolchain.ToolchainError as e:
        pytest.skip(str(e))
    from grader.build import shared_library

    source, prefix = TASKS[number]
    path = LAB6 / source if which == "student" else paths.solution_source(LAB6, source)
    if not path.exists():
        pytest.skip("no reference solutions here (a student release)")
    lib = shared_library(source, [path], group="lab6", stem=f"{path.stem}.{which}-check")
    loaded = ctypes.CDLL(str(lib))  # loading runs nothing on a GPU
    missing = [f"{prefix}_{f}" for f in FUNCTIONS if not hasattr(loaded, f"{prefix}_{f}")]
    assert not missing, f"{path.name} does not export {missing}"


@needs_solutions
@pytest.mark.skipif(toolchain.has_gpu(), reason="a machine with a GPU allocates: this checks the error path")
def test_a_failing_call_is_reported_by_name():
    try:
        toolchain.find_nvcc()
    except toolchain.ToolchainError as e:
        pytest.skip(str(e))
    from grader.build import shared_library

    path = paths.solution_source(LAB6, "02_ring.cu")
    lib = shared_library("02_ring.cu", [path], group="lab6", stem=f"{path.stem}.sol-check")
    with pytest.raises(ipc().AllReduceError, match=r"ring_alloc returned cuda\w+ \(\d+\) on rank 0"):
        ipc().Communicator(lib, "ring", 16, 0, 1)


def test_load_library_refuses_an_unknown_prefix(tmp_path):
    with pytest.raises(ValueError, match="prefix"):
        ipc().load_library(tmp_path / "x.so", "tree")


def test_inputs_are_whole_numbers_with_exact_new_sums():
    m = ipc()
    n = 4099
    for world in (2, 4, 8):
        for call in (1, 2, 3):
            xs = [m.rank_input(r, call, n, "cpu") for r in range(world)]
            for x in xs:
                assert x.dtype == torch.float32 and (x == x.round()).all() and x.abs().max() <= 8
            want = m.expected_sum(world, call, n, "cpu")
            assert torch.equal(want, sum(x.double() for x in xs).float())
            assert (want != xs[0]).float().mean() > 0.5  # a rank's own input passed through is wrong
            before = m.expected_sum(world, call - 1, n, "cpu")
            assert (want != before).float().mean() > 0.5  # a sum left from the call before is wrong
    assert (m.expected_sum(2, 1, n, "cpu") != 0).float().mean() > 0.5  # zeros are wrong


def test_describe_names_the_first_mismatch():
    m = ipc()
    want = torch.arange(6, dtype=torch.float32)
    got = want.clone()
    assert m.describe(got, want, "x") == ""
    got[3] = -1
    assert m.describe(got, want, "x") == "x: wrong at 1 of 6 elements; first at [3]: -1, expected 3"
    assert "shape" in m.describe(got[:2], want, "x")


def test_a_stuck_gpu_is_named_by_its_call_within_the_limit(monkeypatch):
    """settle() waits as torch.cuda.synchronize() does, for the rank's own device, but gives up after
    CALL_LIMIT_S naming the scenario's call; a kernel's error comes through as it is."""
    import threading
    import time

    m = ipc()
    synced: list[int] = []
    release = threading.Event()

    def stuck(device: int) -> None:
        synced.append(device)
        release.wait()  # a kernel spinning on a flag that never comes

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "synchronize", stuck)
    monkeypatch.setattr(m, "CALL_LIMIT_S", 0.3)
    s = m._Scenario(comm=None)
    s.next_call()
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"one call, n=5, call 1: the GPU had not finished 0.3 s later"):
        s.settle("one call, n=5")
    assert time.monotonic() - start < 5
    assert synced == [1]  # rank 1's GPU, not the waiting thread's default device 0
    release.set()

    def crashed(device: int) -> None:
        raise RuntimeError("CUDA error: misaligned address")

    monkeypatch.setattr(torch.cuda, "synchronize", crashed)
    with pytest.raises(RuntimeError, match="misaligned address"):
        s.settle("one call, n=1001")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device: None)
    s.settle("one call, n=1001")  # finished: no error


class _FakeCommunicator:
    """A Communicator's set-up and close (two barriers, as the real one) without a library or a GPU."""

    def __init__(self, lib_path, prefix, capacity, rank, world) -> None:
        self.rank = rank

    def close(self) -> None:
        import torch.distributed as dist

        dist.barrier()
        dist.barrier()


class _FakeLinkLoad:
    """The slow_reader scenario's link load: its gather at set-up and its barrier at close."""

    def __init__(self, rank, world) -> None:
        import torch.distributed as dist

        gathered: list = [None] * world
        dist.all_gather_object(gathered, rank)

    def close(self) -> None:
        import torch.distributed as dist

        dist.barrier()


def checks_with_a_failing_rank(rank: int, world: int, failing: int, real_load: bool = False) -> dict:
    """check_all_reduce on fake scenarios: rank `failing` raises in the first (a call that never
    finished), every other rank finishes them all. real_load: the real link load, whose set-up
    fails on a machine without GPUs."""
    from kiln_tp import ipc as m

    def first(s) -> None:
        if s.comm.rank == failing:
            raise TimeoutError("one call, n=1, call 1: the GPU had not finished")

    m.Communicator = _FakeCommunicator
    if not real_load:
        m._LinkLoad = _FakeLinkLoad
    m.RUNS = {name: (first if name == m.SCENARIOS[0] else lambda s: None) for name in m.SCENARIOS}
    return m.check_all_reduce(rank, world, "", "ring")


def test_findings_come_back_when_one_rank_raised():
    """A rank that raised goes straight to the gather of findings; the others must not wait for it
    in the communicator's close (its barriers would pair with the gather and hang)."""
    from kiln_tp import launch

    found = launch(2, checks_with_a_failing_rank, 0, timeout=60)
    first, *rest = ipc().SCENARIOS
    assert "raised TimeoutError" in found[first][0][0] and found[first][1] == []
    assert all(found[name][0] == [f"not run: scenario {first!r} raised first"] for name in rest)
    assert launch(2, checks_with_a_failing_rank, -1, timeout=60) == {name: [[], []] for name in ipc().SCENARIOS}


@pytest.mark.skipif(torch.cuda.is_available(), reason="the link load's set-up must fail: a machine without GPUs")
def test_a_failed_link_load_fails_slow_reader_on_every_rank():
    """The slow_reader scenario's own set-up (cuda-python, memory outside torch) failing is that
    test's failure on every rank, named as the harness's, and no rank waits for another."""
    from kiln_tp import launch

    found = launch(2, checks_with_a_failing_rank, -1, True, timeout=60)
    for rank in (0, 1):
        (message,) = found["slow_reader"][rank]
        assert "slow_reader scenario's set-up (not your library) failed" in message and "rank 0" in message
    assert all(found[name] == [[], []] for name in ipc().SCENARIOS if name != "slow_reader")


def test_sizes_cover_the_edges():
    m = ipc()
    assert min(m.SIZES) == 1 and max(m.SIZES) + m.PAD <= m.CAPACITY
    assert any(n % 4 for n in m.SIZES if n > 4) and any(n % 2 for n in m.SIZES if n > 4)
    assert max(m.SIZES) >= 1 << 22  # many steps of a grid


# --- bench_allreduce.py -------------------------------------------------------------------------------


def bench():
    if str(LAB6) not in sys.path:
        sys.path.insert(0, str(LAB6))
    import bench_allreduce

    return bench_allreduce


def test_bench_sizes_and_bus_bandwidth():
    b = bench()
    assert b.parse_size("8K") == 8192 and b.parse_size("256M") == 256 << 20 and b.parse_size("12") == 12
    for bad in ("3", "1.5M", "x"):
        with pytest.raises(Exception, match="size"):
            b.parse_size(bad)
    assert b.size_label(8192) == "8 KB" and b.size_label(256 << 20) == "256 MB"
    # W = 2: the factor 2(W - 1)/W is 1; W = 4: 1.5; 1 GB in 10 ms is 107.4 GB/s of algorithm bandwidth
    assert b.bus_bandwidth(1 << 30, 10_000.0, 2) == pytest.approx((1 << 30) / 1e-2 / 1e9)
    assert b.bus_bandwidth(1 << 30, 10_000.0, 4) == pytest.approx(1.5 * (1 << 30) / 1e-2 / 1e9)
    with pytest.raises(SystemExit):
        b.parse_args(["--world", "1"])


def made_up(world: int = 2, ring_256m: float = 1000.0, one_shot_64k: float = 10.0) -> dict:
    k64, m256 = str(64 << 10), str(256 << 20)
    return {
        "device": "Made-up GPU",
        "driver": "0",
        "nvcc": "13.0",
        "torch": "2.0.0+cu",
        "nccl": "2.0.0",
        "date": "2000-01-01",
        "world": world,
        "iters": 20,
        "reps": 10,
        "times_us": {
            "ring": {k64: 30.0, m256: ring_256m},
            "one_shot": {k64: one_shot_64k, m256: 5000.0},
            "nccl": {k64: 12.0, m256: 900.0},
        },
        "left_out": {},
    }


def test_bench_table_and_goals_from_made_up_timings():
    b = bench()
    text = b.table(made_up())
    assert "| 64 KB | 30.0 µs |" in text and "| 256 MB | 1000.0 µs |" in text
    assert "ring (02) time" in text and "NCCL bus bw" in text
    assert "ring bus bandwidth over NCCL's at 256 MB, 2 GPUs, >= 0.8x: 0.90x, met" in text
    assert "one-shot speed over NCCL's at 64 KB, 2 GPUs, >= 1x: 1.20x, met" in text
    missed = b.table(made_up(ring_256m=2000.0, one_shot_64k=24.0))
    assert "0.45x, **missed**" in missed and "0.50x, **missed**" in missed
    assert "not measured in this run" in b.table(made_up(world=4))


def test_bench_refuses_figures_past_the_link():
    """256 MB in 1000 us is 268 GB/s of bus bandwidth at W = 2: under NV18's rated 450 GB/s one way,
    past a PCIe gen 4 x16 link's 31.5 GB/s; with no rating known, nothing is judged."""
    b = bench()
    fine = {**made_up(), "link": "NV18", "rated_gb_s": 450.0}
    assert b.beyond_the_link(fine) == []
    assert "GPU0-GPU1 link NV18: rated 450 GB/s one way." in b.table(fine)
    slow_link = {**made_up(), "link": "PIX", "rated_gb_s": 31.5}
    found = b.beyond_the_link(slow_link)
    assert len(found) == 3 and all("past the PIX link's rated 32 GB/s one way" in f for f in found), found
    assert b.beyond_the_link({**made_up(), "link": None, "rated_gb_s": None}) == []


def test_readme_block_is_a_placeholder_until_measured():
    b = bench()
    text = b.README.read_text()
    assert text.count(b.BEGIN) == 1 and text.count(b.END) == 1
    block = text.split(b.BEGIN)[1].split(b.END)[0]
    # the placeholder, or a table bench_allreduce.py wrote: never figures written by hand
    assert "Not yet measured" in block or block.lstrip().startswith("Measured by `python lab6/bench_allreduce.py")

"""Ladders: the fixture fixtures/94 (three copy kernels against torch's copy_) writes its table and
plot; the README table's shape is held to the declaration; gates read the ladder. On the CPU from
synthetic timing rows, on the GPU from a real `bench` run into a copy of the fixture's README."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from grader import paths, toolchain
from grader.cli import main as cli
from grader.instructor import verify
from grader.instructor.bench import bench
from grader.parent import scoring
from grader.records import TaskResult, Timing, Verdict
from grader.report import ladders
from grader.tasks.catalogue import load_task
from grader.tasks.ladder import Ladder
from grader.tasks.spec import Case, CudaTask, PerfTarget

FIXTURE = paths.ROOT / "grader" / "tests" / "fixtures" / "ladder"
ENV = {"gpus": [{"name": "NVIDIA H100 80GB HBM3", "driver": "580.95.05"}], "nvcc": "13.0", "torch": "2.11.0+cu130"}
PNG = b"\x89PNG\r\n\x1a\n"


def fixture_task() -> CudaTask:
    task = load_task(FIXTURE / "tests" / "test_94_copy.py")
    assert isinstance(task, CudaTask) and task.ladder is not None
    return task


def synthetic_rows(task: CudaTask) -> list[Timing]:
    """What the task process reports for a ladder: a row per rung and baseline per sweep size."""
    ladder = task.ladder
    assert ladder is not None
    rows = []
    for j, case in enumerate(ladder.sweep):
        torch_ms = 0.01 * 64**j
        for i, name in enumerate([*ladder.rungs, *ladder.baselines]):
            ms = torch_ms * (1.6 - 0.25 * i) if name in ladder.rungs else torch_ms
            n = case.params["n"]
            rows.append(
                Timing(
                    entry=name if name in ladder.rungs else "",
                    case=case.label,
                    median_ms=ms,
                    q1_ms=ms,
                    q3_ms=ms,
                    min_ms=ms,
                    n=50,
                    gbps=8 * n / (ms * 1e-3) / 1e9,
                    vs={"torch": torch_ms / ms},
                    speedup=torch_ms / ms,
                    ladder=ladder.name,
                    rung=name,
                )
            )
    return rows


def test_the_fixture_declares_a_sound_ladder() -> None:
    task = fixture_task()
    assert task.ladder is not None and task.ladder.problems(task) == []
    assert task.ladder.header() == ["kernel", "n=2^20", "n=2^26"]
    assert task.ladder.row_labels()[-1] == "torch (baseline)"


def test_unsound_declarations_are_named() -> None:
    task = fixture_task()
    bad = Ladder(name="x", rungs=["copy_scalar", "nope"], sweep=[Case("a", n=1), Case("a", n=2)], metric="gflops")
    problems = " | ".join(bad.problems(task))
    assert "`nope` is not an entry point" in problems and "distinct" in problems and "needs flops" in problems
    odd = Ladder(name="x", rungs=["copy_scalar"], sweep=[Case("a", n=1)], metric="share_of:cuBLAS")
    assert "no baseline of that name" in " ".join(odd.problems(task))


def test_a_ladder_fixture_writes_its_table_and_plot(tmp_path: Path) -> None:
    task = fixture_task()
    readme = tmp_path / "README.md"
    shutil.copy(FIXTURE / "README.md", readme)
    before = readme.read_text()
    existed, png = ladders.write(readme, task, synthetic_rows(task), ENV)
    assert existed, "the fixture README already holds the block: it is replaced, not appended"
    text = readme.read_text()
    assert text.split(ladders.begin(task.task_id))[0] == before.split(ladders.begin(task.task_id))[0]
    block = ladders.blocks(text)[task.task_id]
    for words in ("NVIDIA H100 80GB HBM3", "driver 580.95.05", "CUDA toolkit 13.0", "torch 2.11.0+cu130", "GB/s"):
        assert words in block, words
    assert "| torch (baseline) | 839 | 839 |" in block  # 8 MB in 10 µs; 512 MB in 640 µs
    assert "–" not in block.split("| kernel")[1]  # every cell measured
    assert png == tmp_path / "figures" / "ladder-94.png" and png.read_bytes()[:8] == PNG
    assert "![copy ladder](figures/ladder-94.png)" in block
    assert ladders.drift(task, text) == []  # numbers changed, shape did not
    # writing again replaces the block: one block, never two
    ladders.write(readme, task, synthetic_rows(task), ENV)
    assert readme.read_text().count(ladders.begin(task.task_id)) == 1


def test_a_missing_measurement_shows_as_a_dash(tmp_path: Path) -> None:
    task = fixture_task()
    rows = [r for r in synthetic_rows(task) if not (r.rung == "copy_vec4" and r.case == "n=2^26")]
    text = "\n".join(ladders.table(task, rows))
    assert "| float4 (four per thread) | " in text and text.count("–") == 1


def test_the_readme_table_is_held_to_the_declaration() -> None:
    task = fixture_task()
    text = (FIXTURE / "README.md").read_text()
    assert ladders.drift(task, text) == [] and ladders.orphans([task], text) == []
    renamed = text.replace("| grid-stride loop |", "| grid stride |")
    assert "rows" in " ".join(ladders.drift(task, renamed))
    one_size = text.replace("| kernel | n=2^20 | n=2^26 |", "| kernel | n=2^20 |")
    assert "header" in " ".join(ladders.drift(task, one_size))
    assert "no ladder block" in " ".join(ladders.drift(task, "# a README without the block\n"))
    assert ladders.orphans([], text) == ["ladder block fixtures/94 has no ladder declared for it"]


def test_placeholder_writes_the_shape_without_a_gpu(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# Lab\n")
    assert cli(["bench", str(FIXTURE), "--readme", str(readme), "--placeholder"]) == 0
    text = readme.read_text()
    assert ladders.drift(fixture_task(), text) == [] and "Not measured yet" in text
    assert not (tmp_path / "figures").exists()


def test_scoring_reads_ladder_rows_and_library_shares() -> None:
    task = fixture_task()
    rows = synthetic_rows(task)
    for r in rows:
        r.vs["cuBLAS"] = r.vs["torch"] / 2
    result = TaskResult("fixtures", "94", "copy", "94_copy.cu", Verdict.PASS, timings=rows)
    # no timing-case row for copy_vec4 here: its ladder row at the last sweep size answers
    vec4_last = next(r for r in rows if r.rung == "copy_vec4" and r.case == "n=2^26")
    assert scoring.metric(task, result, PerfTarget("copy_vec4", "share_of:cuBLAS", 0.5, 1)) == vec4_last.vs["cuBLAS"]
    assert scoring.metric(task, result, PerfTarget("copy_vec4", "gbps", 1, 1)) == vec4_last.gbps
    timed = Timing("copy_vec4", "n=2^24", 1.0, 1.0, 1.0, 1.0, 9, gbps=12.0, share_of_peak=0.5)
    result.timings.insert(0, timed)  # the timing case's own row wins over the ladder's
    assert scoring.metric(task, result, PerfTarget("copy_vec4", "gbps", 1, 1)) == 12.0
    line = scoring.reached(PerfTarget("copy_vec4", "share_of_peak", 0.6, 1), 0.5)
    assert line == "copy_vec4 reached 50% of the card's theoretical peak (target 60%)"


def test_a_gate_the_reference_misses_is_a_verify_problem() -> None:
    task = fixture_task()
    gate = next(p for p in task.perf if p.gate)
    row = Timing(gate.entry, "n=2^24", 1.0, 1.0, 1.0, 1.0, 9, share_of_copy=0.4)
    missed = TaskResult("fixtures", "94", "copy", "94_copy.cu", Verdict.PASS, timings=[row])
    (problem,) = verify.gate_problems(task, missed)
    assert "misses its gate" in problem and "copy_vec4 reached 40% of the copy bandwidth (target 60%)" in problem
    row.share_of_copy = 0.9
    assert verify.gate_problems(task, missed) == []
    wrong = TaskResult("fixtures", "94", "copy", "94_copy.cu", Verdict.WRONG, "`out`: 3 of 9 wrong", timings=[row])
    assert "not checked" in verify.gate_problems(task, wrong)[0]
    unmeasured = TaskResult("fixtures", "94", "copy", "94_copy.cu", Verdict.PASS)
    assert "was not measured" in verify.gate_problems(task, unmeasured)[0]
    said: list[str] = []
    assert verify.check_gates([task], gpu=False, say=said.append) == []
    assert said == ["performance gates not checked: no GPU (1 gated targets in 1 tasks)"]


@pytest.mark.gpu
@pytest.mark.skipif(not toolchain.has_gpu(), reason="no NVIDIA GPU: a ladder is timed on one")
def test_bench_grades_the_fixture_and_writes_the_real_table(tmp_path: Path) -> None:
    task = fixture_task()
    readme = tmp_path / "README.md"
    shutil.copy(FIXTURE / "README.md", readme)
    said: list[str] = []
    assert bench(str(FIXTURE), "", False, readme, said.append) == 0, "\n".join(said)
    text = readme.read_text()
    block = ladders.blocks(text)[task.task_id]
    assert "Not measured yet" not in block and "–" not in block.split("| kernel")[1], block
    assert ladders.drift(task, text) == []
    png = tmp_path / "figures" / "ladder-94.png"
    assert png.read_bytes()[:8] == PNG
    print("\n".join(said))


@pytest.mark.gpu
@pytest.mark.skipif(not toolchain.has_gpu(), reason="no NVIDIA GPU: a ladder is timed on one")
def test_ladder_rows_are_typed_and_plausible() -> None:
    from grader.parent import runner

    task = fixture_task()
    (r,) = runner.grade([task], runner.Options(timing="ladder", timeout=600))
    assert r.verdict == Verdict.PASS, r.message
    assert verify.gate_problems(task, r) == []
    rows = [t for t in r.timings if t.ladder]
    assert len(rows) == 4 * 2 and {t.rung for t in rows} == {"copy_scalar", "copy_vec4", "copy_grid_stride", "torch"}
    for t in rows:
        assert t.gbps and t.copy_gbps and t.read_gbps and t.vs["torch"] > 0, t
        assert t.peak_gbps is None or t.gbps < 1.2 * t.peak_gbps, t
    big = {t.rung: t for t in rows if t.case == "n=2^26"}
    assert 0.5 < big["copy_vec4"].vs["torch"] < 2.0, big["copy_vec4"]  # a float4 copy is about torch's speed

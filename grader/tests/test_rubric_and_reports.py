import json

import pytest

from grader.parent.scoring import perf_report, score
from grader.records import TaskResult, Timing, Verdict
from grader.report.files import markdown, write_json
from grader.report.terminal import table
from grader.tasks.spec import Case, CudaTask, PerfTarget


def task():
    return CudaTask(
        lab="lab1",
        number="03",
        title="saxpy",
        sources=["03_saxpy.cu"],
        entries=[],
        cases=[],
        make_inputs=lambda p, r: {},
        perf=[PerfTarget("saxpy", "share_of_copy", 0.8, 2)],
    )


def result(verdict, share):
    t = Timing("saxpy", "n=1", 1.0, 0.9, 1.1, 0.8, 10, 1.2, 1.2, 2400.0, 3000.0, share)
    return TaskResult("lab1", "03", "saxpy", "lab1/03_saxpy.cu", verdict, timings=[t])


def test_performance_points_only_on_top_of_a_pass():
    assert score(task(), result(Verdict.PASS, 0.9)) == (12, 12)
    assert score(task(), result(Verdict.PASS, 0.5)) == (10, 12)
    assert score(task(), result(Verdict.WRONG, 0.99)) == (0, 12)


def test_reports(tmp_path):
    r = result(Verdict.PASS, 0.9)
    r.points, r.max_points = 12, 12
    w = TaskResult("lab1", "04", "swap", "lab1/04.cu", Verdict.WRONG, "`out`: 1 of 2 wrong")
    text = table([r, w])
    assert "✓ pass" in text and "1.20×" in text and "90%" in text and "✗ wrong" in text
    env = {"gpus": [], "nvcc": "13.0", "torch": "x", "arch": "sm_90"}
    write_json(tmp_path / "r.json", [r, w], env)
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["total"] == {"points": 12, "max_points": 12} and doc["tasks"][1]["verdict"] == "wrong"
    md = markdown([r, w], env)
    assert "| lab1/03 saxpy | pass |" in md and "1 of 2 wrong" in md


def test_performance_report_names_value_target_and_points():
    (line,) = perf_report(task(), result(Verdict.PASS, 0.9))
    assert "saxpy reached 90% of the copy bandwidth (target 80%): +2 points" in line
    (line,) = perf_report(task(), result(Verdict.WRONG, 0.9))
    assert line.endswith("no performance points")


def batched(perf):
    cases = [Case(f"n={n}", n=n) for n in (1, 7, 4096)]
    return CudaTask(
        lab="lab3",
        number="07",
        title="infer",
        sources=["07.cu"],
        entries=[],
        cases=cases,
        make_inputs=lambda p, r: {},
        timing_case="n=1",
        perf=perf,
        sweep=[cases[1], Case("n=64", n=64)],
    )


def test_a_target_reads_its_own_case_and_no_sweep_row():
    perf = [PerfTarget("infer", "speedup", 3.0, 3), PerfTarget("infer", "speedup", 1.0, 2, case="n=4096")]
    t = batched(perf)
    assert [c.label for c in t.timed_cases(bench=False)] == ["n=1", "n=4096"]
    assert [c.label for c in t.timed_cases(bench=True)] == ["n=1", "n=4096", "n=7", "n=64"]

    def row(case, speedup, sweep=False):
        return Timing("infer", case, 1.0, 1.0, 1.0, 1.0, 9, 1.0, speedup, sweep=sweep)

    rows = [row("n=1", 3.5), row("n=4096", 0.9), row("n=7", 50.0, sweep=True), row("n=64", 50.0, sweep=True)]
    r = TaskResult("lab3", "07", "infer", "07.cu", Verdict.PASS, timings=rows)
    assert score(t, r) == (13, 15)  # 3.5x at n=1 earns its 3 points; 0.9x at 4096 misses; sweeps count for nothing
    lines = perf_report(t, r)
    assert "infer reached 3.5× the speed of torch (target 3×)" in lines[0]
    assert "infer reached 0.9× the speed of torch at n=4096 (target 1×)" in lines[1]
    text = table([r])
    assert "n=4096" in text and "n=64" not in text  # sweep rows go to the plots, not the report
    with pytest.raises(ValueError, match="'n=9' is not among the cases"):
        batched([PerfTarget("infer", "speedup", 1.0, 1, case="n=9")])


def test_headline_of_a_grader_error_names_the_exception() -> None:
    from grader.records import TaskResult, Verdict

    tb = "internal grader error (please report it):\nTraceback (most recent call last):\n  File x\n"
    tb += "TypeError: sum() bad\n"
    r = TaskResult("lab9", "01", "t", "s.cu", Verdict.GRADER_ERROR, tb)
    assert r.headline() == "internal grader error (please report it): TypeError: sum() bad"
    assert TaskResult("lab9", "01", "t", "s.cu", Verdict.WRONG, "3 of 8 wrong\ndetail").headline() == "3 of 8 wrong"
    assert TaskResult("lab9", "01", "t", "s.cu", Verdict.WRONG, "").headline() == ""

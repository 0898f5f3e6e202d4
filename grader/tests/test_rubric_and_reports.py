import json

from grader.parent.scoring import perf_report, score
from grader.records import TaskResult, Timing, Verdict
from grader.report.files import markdown, write_json
from grader.report.terminal import table
from grader.tasks.spec import CudaTask, PerfTarget


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


def test_headline_of_a_grader_error_names_the_exception() -> None:
    from grader.records import TaskResult, Verdict

    tb = "internal grader error (please report it):\nTraceback (most recent call last):\n  File x\n"
    tb += "TypeError: sum() bad\n"
    r = TaskResult("lab9", "01", "t", "s.cu", Verdict.GRADER_ERROR, tb)
    assert r.headline() == "internal grader error (please report it): TypeError: sum() bad"
    assert TaskResult("lab9", "01", "t", "s.cu", Verdict.WRONG, "3 of 8 wrong\ndetail").headline() == "3 of 8 wrong"
    assert TaskResult("lab9", "01", "t", "s.cu", Verdict.WRONG, "").headline() == ""

"""The points the student release's CI reports, in the form GitHub Classroom's autograding reporter
reads, and the workflow that carries them there. Runs on any machine."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from grader.instructor import release
from grader.records import TaskResult, Verdict
from grader.report import classroom


def result(number: str, verdict: Verdict, points: float, max_points: float, **kw: Any) -> TaskResult:
    source = f"lab1/{number}_task.cu"
    return TaskResult("lab1", number, f"task {number}", source, verdict, points=points, max_points=max_points, **kw)


PERF = "performance: saxpy reached 84% of the copy bandwidth (target 75%): +2 points"


@pytest.fixture
def results() -> list[TaskResult]:
    return [
        result("03", Verdict.PASS, 12, 12, seconds=2.34, notes=[PERF], build_seconds=1.2),
        result("04", Verdict.WRONG, 0, 10, message="12 of 1000 elements wrong in n=1000\nindex 3: got 1, expected 2"),
        result("05", Verdict.WRONG, 10 * 2 / 3, 10, message="1 of 3 tests failed"),  # graded by tests: partial
        result("06", Verdict.NOT_STARTED, 0, 12),
    ]  # fmt: skip


def reporter_points(result_json: dict[str, Any]) -> tuple[float, float]:
    """What autograding-grading-reporter's NotifyClassroom computes for one runner (dist/main.js):
    the tests' scores and the top-level max_score, skipped when max_score is 0."""
    if not result_json["max_score"]:
        return 0, 0
    return sum(t["score"] for t in result_json["tests"]), result_json["max_score"]


def test_one_test_per_task_and_the_points_add_up(results: list[TaskResult]) -> None:
    out = classroom.classroom_result(results)
    assert out["version"] == 1
    assert [t["name"] for t in out["tests"]] == [f"lab1/{r.number} task {r.number}" for r in results]
    score, max_score = reporter_points(out)
    assert score == pytest.approx(sum(r.points for r in results), abs=0.01)
    assert max_score == sum(r.max_points for r in results) == 44
    assert [t["max_score"] for t in out["tests"]] == [12, 10, 10, 12]


def test_a_failing_task_fails_and_keeps_only_what_it_earned(results: list[TaskResult]) -> None:
    tests = {t["name"][:7]: t for t in classroom.classroom_result(results)["tests"]}
    assert tests["lab1/03"]["status"] == "pass" and tests["lab1/03"]["score"] == 12
    assert tests["lab1/04"]["status"] == "fail" and tests["lab1/04"]["score"] == 0
    assert tests["lab1/05"]["status"] == "fail" and tests["lab1/05"]["score"] == 6.67  # its passing tests' share
    assert tests["lab1/06"]["status"] == "fail" and tests["lab1/06"]["message"] == "not started"
    assert classroom.classroom_result(results)["status"] == "fail"


def test_messages_are_short_and_say_what_happened(results: list[TaskResult]) -> None:
    tests = classroom.classroom_result(results)["tests"]
    assert tests[0]["message"].startswith("pass (performance: saxpy reached 84%")
    assert "built in" not in tests[0]["message"]  # build times are not feedback
    assert tests[1]["message"] == "wrong: 12 of 1000 elements wrong in n=1000"  # the first line only
    assert tests[1]["test_code"] == "make test-lab1 TASK=04" and tests[1]["line_no"] == 0
    long = result("07", Verdict.COMPILE_ERROR, 0, 10, message="error: " + "x" * 5000)
    assert len(classroom.message(long)) == classroom.MESSAGE_CHARS


def test_a_verdict_that_is_not_about_the_code_is_an_error(results: list[TaskResult]) -> None:
    env = result("08", Verdict.ENVIRONMENT, 0, 10, message="nvcc not found: install the CUDA toolkit")
    out = classroom.classroom_result([*results, env])
    assert out["status"] == "error" and out["tests"][-1]["status"] == "error"
    # the reporter logs an errored test by its message alone: the message names the task
    assert out["tests"][-1]["message"].startswith("lab1/08 task 08: environment: nvcc not found")
    passing = classroom.classroom_result([results[0]])
    assert passing["status"] == "pass"


def test_the_file_is_named_as_the_student_knows_it() -> None:
    graded = result("03", Verdict.PASS, 10, 10)
    graded.source = "/home/runner/work/hw/hw/submission/lab1/03_saxpy.cu"
    assert classroom.one_test(graded)["filename"] == "lab1/03_saxpy.cu"
    module = TaskResult("lab4", "01", "memory planner", "/tmp/x/lab4/kiln/planner.py", Verdict.PASS)
    assert classroom.one_test(module)["filename"] == "lab4/kiln/planner.py"


def test_base64_round_trip(results: list[TaskResult]) -> None:
    out = classroom.classroom_result(results)
    text = classroom.encode(out)
    assert "\n" not in text and re.fullmatch(r"[A-Za-z0-9+/=]+", text)
    assert classroom.decode(text) == out


def test_write_gives_the_file_and_the_step_output(results: list[TaskResult], tmp_path: Path) -> None:
    import json

    github_output = tmp_path / "github_output"
    github_output.write_text("other=1\n")  # earlier outputs of the step stay
    out = classroom.write(results, tmp_path / "ada", github_output)
    assert json.loads((tmp_path / "ada" / classroom.FILE).read_text()) == out
    lines = github_output.read_text().splitlines()
    assert lines[0] == "other=1" and lines[1].startswith("result=")
    assert classroom.decode(lines[1].removeprefix("result=")) == out
    classroom.write(results, tmp_path / "bob")  # outside GitHub Actions: the file only
    assert (tmp_path / "bob" / classroom.FILE).exists()


# --- the workflow the student release carries -----------------------------------------------------


def _template() -> dict[str, Any]:
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load(release.TEMPLATE.read_text())


def test_the_workflow_grades_with_the_pinned_grader_and_reports_to_classroom() -> None:
    wf = _template()
    on = wf.get("on", wf.get(True))  # YAML 1.1 reads a bare `on` as true
    assert set(on) == {"push", "workflow_dispatch"}
    assert wf["name"] == "Autograding Tests" and list(wf["jobs"]) == ["run-autograding-tests"]  # what Classroom reads
    assert wf["concurrency"]["group"] == "grade-${{ github.repository }}"
    job = wf["jobs"]["run-autograding-tests"]
    assert job["runs-on"] == ["self-hosted", "gpu"]
    assert job["env"]["GRADER_REPO"] == "@@GRADER_REPO@@" and job["env"]["GRADER_REF"] == "@@GRADER_REF@@"
    steps = {s.get("id") or s["name"]: s for s in job["steps"]}
    grader_checkout = next(s for s in job["steps"] if s.get("with", {}).get("path") == "grader-repo")
    assert grader_checkout["with"]["ref"] == "${{ env.GRADER_REF }}"
    assert grader_checkout["with"]["persist-credentials"] is False
    assert "!/lab*/solutions/" in grader_checkout["with"]["sparse-checkout"]
    grade = steps["grader"]
    assert grade["working-directory"] == "grader-repo"
    assert "submission ../submission --out ../grade-results" in grade["run"] and "--classroom" in grade["run"]
    # the secret seed reaches the grading step only
    seeded = [s for s in job["steps"] if "GRADER_SEED" in s.get("env", {})]
    assert seeded == [grade] and "GRADER_SEED" not in job["env"] and "GRADER_SEED" not in wf.get("env", {})
    reporter = next(s for s in job["steps"] if s.get("uses", "").startswith("classroom-resources/"))
    assert reporter["uses"] == "classroom-resources/autograding-grading-reporter@v1"
    runner = reporter["with"]["runners"]
    assert reporter["env"] == {f"{runner.upper()}_RESULTS": "${{ steps.grader.outputs.result }}"}


def test_the_workflow_names_no_placeholder_but_the_two_release_fills() -> None:
    text = release.TEMPLATE.read_text()
    assert set(re.findall(r"@@[A-Z_]+@@", text)) == {"@@GRADER_REPO@@", "@@GRADER_REF@@"}
    filled = release.workflow("course/instructors", "0" * 40)
    assert "@@" not in filled and 'GRADER_REF: "' + "0" * 40 + '"' in filled

"""The runner's own verdicts: what is the student's fault and what is not."""

from __future__ import annotations

import pytest

from grader import toolchain
from grader.parent import runner
from grader.records import Verdict
from grader.tasks import catalogue


def test_a_missing_toolkit_is_an_environment_verdict_not_a_compile_error(monkeypatch):
    def no_nvcc() -> None:
        raise toolchain.ToolchainError("nvcc not found: install the CUDA toolkit")

    monkeypatch.setattr(toolchain, "find_nvcc", no_nvcc)
    monkeypatch.setattr(toolchain, "nvcc_version", lambda: "unknown")
    # the student's file, forced past "not started": a student release has no solutions
    (result,) = runner.grade([catalogue.task_by_id("lab1/01")], runner.Options(force_run=True, timing="off"))
    assert result.verdict == Verdict.ENVIRONMENT and "nvcc not found" in result.message
    assert result.points == 0


@pytest.mark.parametrize(
    ("selector", "expected"),
    [("lab1/03", ["lab1/03"]), ("3", ["lab1/03"]), ("01,lab1/04", ["lab1/01", "lab1/04"]), ("lab2/03", [])],
)
def test_task_selectors(selector, expected):
    tasks = catalogue.all_tasks(["lab1"])
    assert [t.task_id for t in catalogue.select(tasks, selector)] == expected


def test_timeouts_per_task_and_for_huge_cases(monkeypatch):
    monkeypatch.delenv("GRADER_TIMEOUT", raising=False)
    matrix_add = catalogue.task_by_id("lab1/02")
    assert runner.Options().timeout_for(matrix_add) == runner.DEFAULT_TIMEOUT
    assert runner.Options(huge=True).timeout_for(matrix_add) == 4 * runner.DEFAULT_TIMEOUT
    monkeypatch.setenv("GRADER_TIMEOUT", "20")
    assert runner.Options().timeout_for(matrix_add) == 20

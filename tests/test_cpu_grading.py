"""What a student without a GPU sees: untouched tasks are `not started`, finished ones compile
and are skipped with a reason — never passed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from grader import paths
from grader.instructor import skeletons


def _grade(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GRADER_NO_GPU": "1"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "lab1/tests", "-q", "-p", "no:cacheprovider", "-rs", *args],
        cwd=paths.ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_untouched_lab_reports_every_task_not_started():
    out = _grade()
    assert out.returncode == 1, out.stdout
    assert out.stdout.count("· not started") == 8, out.stdout
    assert " passed" not in out.stdout.splitlines()[-1]


@pytest.mark.skipif(not skeletons.pairs(), reason="no reference solutions here (a student release)")
def test_solutions_are_skipped_with_a_reason_without_a_gpu():
    out = _grade("--solutions")
    last = out.stdout.strip().splitlines()[-1]
    assert out.returncode == 0 and "8 skipped" in last and "passed" not in last, out.stdout
    assert "no NVIDIA GPU visible" in out.stdout


def test_one_task_only():
    # the other task files are not even imported (pytest_ignore_collect): nothing to deselect
    out = _grade("--task", "3")
    last = out.stdout.strip().splitlines()[-1]
    assert "1 failed" in last and "deselected" not in last and "lab1/03" in out.stdout, out.stdout


def test_a_task_that_is_not_there_is_named_with_the_tasks_that_are():
    out = _grade("--task", "99")
    said = out.stdout + out.stderr
    assert out.returncode == 4, said  # pytest's usage error, not "no tests ran"
    assert "TASK=99: no task 99 in lab1; its tasks are 00-07" in said, said


def test_a_lab_that_is_not_there_is_an_error_naming_the_labs(tmp_path):
    stamp = tmp_path / "stamp"  # newer than setup.sh: make never runs the set-up here
    stamp.touch()
    out = subprocess.run(
        ["make", "-s", "test-lab9", f"STAMP={stamp}"], cwd=paths.ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode != 0 and "there is no lab9: the labs are lab1" in out.stdout, out.stdout + out.stderr

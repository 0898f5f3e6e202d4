"""What a student reads when a task fails (`make test-labN`): its message once, under its row in the
grader's table; pytest's own report of the test (the failure section, the FAILED line) a one-line
pointer; the exit status and JUnit XML (`make grade`) as before, the XML with the whole message.

Graded for real on any machine: a copy of the Python-module fixture task (fixtures/92) whose
module is the `wrong` variant of grader/tests/test_kind_python.py, in the student's own session."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from grader import paths
from grader.records import TaskResult, Timing, Verdict
from grader.report.terminal import table
from grader.tests.test_kind_python import FIXTURE, SOURCE, variant_file

DISTINCTIVE = ["1 of 4 tests did not pass", "test_variance: assert 25.0 == 0.0", "where 25.0 = variance([5.0, 5.0])"]


@pytest.fixture(scope="module")
def wrong_spec(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fixture") / "python"
    shutil.copytree(FIXTURE, root, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(variant_file("wrong"), root / SOURCE)
    return root / "tests" / "test_92_tinystats.py"


def session(spec: Path, tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], ET.Element]:
    """The student's session (make test-labN's options), with CI set: pytest then prints the short
    summary's message in full, the way it repeated a failing task's message before."""
    env = {**os.environ, "GRADER_FORKSERVER": "0", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "CI": "1"}
    xml = tmp_path / "junit.xml"
    cmd = [sys.executable, "-m", "pytest", str(spec), "-p", "grader.pytest_plugin", "-p", "no:cacheprovider"]
    cmd += [*args, f"--junitxml={xml}", "-o", "junit_family=xunit1"]
    proc = subprocess.run(cmd, cwd=paths.ROOT, env=env, capture_output=True, text=True, timeout=300)
    return proc, ET.parse(xml).getroot()


@pytest.mark.parametrize("args", [("-q", "--no-header", "-rfEs"), ("-vv",), ("-q", "-x", "--tb=line")])
def test_a_failing_tasks_message_is_printed_once_under_its_row(wrong_spec, tmp_path, args):
    proc, junit = session(wrong_spec, tmp_path, *args)
    out = proc.stdout
    assert proc.returncode == 1 and "1 failed" in out.strip().splitlines()[-1], out + proc.stderr
    for line in DISTINCTIVE:
        assert out.count(line) == 1, f"{line!r} is not printed exactly once:\n{out}"
    lines = out.splitlines()
    row = next(i for i, ln in enumerate(lines) if ln.startswith("fixtures/92 tiny statistics (fixture)"))
    assert "✗ wrong" in lines[row] and "5.71/10" in lines[row]
    assert lines[row - 2].startswith("task ") and set(lines[row - 1]) <= {"─", " "}  # the table, its header
    assert lines[row + 1] == "  │ 1 of 4 tests did not pass (3 of 7 test points):"  # the message, under its row
    assert lines[row + 2].startswith("  │   test_variance: assert 25.0 == 0.0")
    assert any(ln.startswith("score: 5.71 / 10") for ln in lines[row + 3 :])
    pointer = "wrong: details under fixtures/92 in the grader table"
    assert out.count(pointer) >= 1 and "Failed:" not in out
    assert "test_92_tinystats.py::test_tinystats" in out and "FAILED" in out
    if "-rfEs" in args or "-vv" in args:
        assert f"test_92_tinystats.py::test_tinystats - {pointer}" in out  # the short summary's FAILED line

    (case,) = junit.iter("testcase")
    failure = case.find("failure")
    assert failure is not None and failure.text is not None
    assert failure.text.startswith("wrong: 1 of 4 tests did not pass (3 of 7 test points):")
    assert all(line in failure.text for line in DISTINCTIVE), failure.text
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert props["verdict"] == "wrong" and props["points"] == "5.71/10"


def result(number: str, verdict: Verdict, message: str = "", notes: list[str] | None = None) -> TaskResult:
    t = Timing("k", "n=1", 1.0, 0.9, 1.1, 0.8, 10, 1.2, 1.2, 2400.0, 3000.0, 0.9)
    r = TaskResult("lab1", number, "task", f"lab1/{number}.cu", verdict, message, timings=[t], notes=notes or [])
    r.max_points = 10
    return r


def test_the_table_puts_the_details_of_a_task_that_did_not_pass_under_its_row():
    long_line = "x" * 200
    wrong = f"`out`: 1 of 2 wrong\n  index 1: got 3, expected 4\n{long_line}"
    results = [
        result("01", Verdict.PASS, "all cases match", ["k is fast"]),
        result("02", Verdict.WRONG, wrong),
        result("03", Verdict.SKIPPED, "no NVIDIA GPU visible"),
        result("04", Verdict.COMPILE_ERROR, "04.cu(3): error: expected a ';'", ["ptxas says hi"]),
    ]
    plain = table(results)
    assert "1 of 2 wrong" not in plain and "│" not in plain  # the table alone, as `make bench-labN` prints it
    lines = table(results, with_details=True).splitlines()
    assert lines[:4] == plain.splitlines()[:4]  # header, rule, 01, 02: columns not widened by the details
    assert lines[4:7] == ["  │ `out`: 1 of 2 wrong", "  │   index 1: got 3, expected 4", f"  │ {long_line}"]
    assert lines[7].startswith("lab1/03 task") and "- skipped" in lines[7]  # a skip's reason is pytest's (-rs)
    assert lines[8].startswith("lab1/04 task") and "✗ compile error" in lines[8]
    assert lines[9:] == ["  │ 04.cu(3): error: expected a ';'", "  │ note: ptxas says hi"]

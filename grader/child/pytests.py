"""Runs a Python-module task in the task process: the spec's point tests, through pytest.

The student's package is staged, not imported in place: the lab's package folders are copied
into a scratch folder beside the report (the grading process removes that folder even when this
process is killed), the graded sources (the student's, the solution's or a variant's) are put
over them, and the folder goes first on sys.path. So a variant is graded exactly like the
student's file, and nothing is written into the lab.

pytest then runs the spec file in an inner session (`--grader-inner`: the point tests are kept,
the `grade` test dropped). A point test may leave a line in the task's notes with pytest's
`record_property("note", text)` (lab 7's loss curve says how close it came). Every test is
written to the report as soon as it ends, and the phase names the running one, so a test that
crashes the process (a segfault through ctypes, a CUDA error that aborts) or hangs is named in
the verdict the grading process gives: crash or timeout.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from grader import paths, toolchain
from grader.build import STAGE_ENV
from grader.records import ChildJob, Phase, Stage, TestOutcome, Verdict
from grader.tasks.python import DEFAULT_TEST_POINTS, LIBRARY_ENV, PythonTask

if TYPE_CHECKING:
    from grader.child.__main__ import Recorder

MESSAGE_LINES = 3  # of each failing test's message, in the verdict
MAX_LISTED = 8  # failing tests named in the verdict
NOTE = "note"  # record_property("note", text) in a point test: a line in the task's notes
_ADDRESS = re.compile(r"<(?:function|bound method|built-in function) ([\w.]+) at 0x[0-9a-f]+>")


def stage(task: PythonTask, sources: dict[str, str], dest: Path) -> None:
    """The lab's staged folders and files under `dest`, with the graded sources put over them."""
    lab = task.lab_dir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for top in task.staged():
        home, inner = paths.lab_file(lab, top)  # `../lab4/kiln` is staged as `kiln`
        src = home / inner
        if src.is_dir():
            shutil.copytree(src, dest / inner, ignore=ignore)
        elif src.is_file():
            shutil.copy2(src, dest / inner)
    for rel, path in sources.items():
        target = dest / paths.lab_file(lab, rel)[1]
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)


def points_of(item: pytest.Item) -> float:
    mark = item.get_closest_marker("points")
    if mark is None:
        return DEFAULT_TEST_POINTS
    value = mark.args[0] if mark.args else mark.kwargs.get("n", DEFAULT_TEST_POINTS)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"{item.nodeid}: @pytest.mark.points takes a number >= 0, not {value!r}")
    return float(value)


class Collector:
    """A pytest plugin that writes each test's outcome into the report as the test ends."""

    def __init__(self, rec: Recorder, stage_dir: Path, modules: list[str]) -> None:
        self.rec = rec
        self.stage_dir = str(stage_dir)
        self.stage_prefix = str(stage_dir) + os.sep
        self.modules = modules
        self.points: dict[str, float] = {}
        self.names: dict[str, str] = {}
        self.outcomes: dict[str, tuple[str, str]] = {}  # nodeid -> (outcome, message) so far
        self.errors: list[str] = []  # collection errors: a broken spec file
        self.deselected: list[str] = []  # the `gpu` tests a machine without a GPU leaves out

    def _clean(self, text: str) -> str:
        """Paths as the student knows them (relative to the lab), `f` for `<function f at 0x...>`."""
        return _ADDRESS.sub(r"\1", text.replace(self.stage_prefix, ""))

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.errors.append(self._clean(str(report.longrepr)))

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        self.deselected += [item.name for item in items]

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self._stage_first()
        for item in session.items:
            self.names[item.nodeid] = item.name
            try:
                self.points[item.nodeid] = points_of(item)
            except ValueError as e:
                self.errors.append(str(e))

    def _stage_first(self) -> None:
        """The staged package is the one the tests import: a conftest.py in the lab, or anything
        collection ran, may have put the lab's own copy on sys.path or imported it already."""
        while self.stage_dir in sys.path:
            sys.path.remove(self.stage_dir)
        sys.path.insert(0, self.stage_dir)
        for name in list(sys.modules):
            top = name.partition(".")[0]
            path = getattr(sys.modules[name], "__file__", None) or ""
            if top in self.modules and not path.startswith(self.stage_prefix):
                del sys.modules[name]

    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        self.rec.at(Stage.CHECKING, f"test {self.names.get(nodeid, nodeid)}")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        before = self.outcomes.get(report.nodeid)
        for key, value in report.user_properties if report.when == "call" else ():
            if key == NOTE:  # a passing check's figure for the report (the loss curve's worst step)
                self.rec.report.notes.append(f"{self.names.get(report.nodeid, report.nodeid)}: {value}")
        if report.passed:
            if before is None:
                self.outcomes[report.nodeid] = ("passed", "")
            return
        if before is not None and before[0] != "passed":
            return  # the first problem is the one to tell
        if report.skipped:
            outcome = "skipped"
        elif report.when == "call":
            outcome = "failed"
        else:
            outcome = "error"  # in a fixture's setup or teardown
        self.outcomes[report.nodeid] = (outcome, self._message(report))

    def pytest_runtest_logfinish(self, nodeid: str, location: Any) -> None:
        outcome, message = self.outcomes.get(nodeid, ("error", "the test never reported"))
        name = self.names.get(nodeid, nodeid)
        self.rec.report.tests.append(TestOutcome(name, outcome, self.points.get(nodeid, DEFAULT_TEST_POINTS), message))
        self.rec.flush()

    def _message(self, report: pytest.TestReport) -> str:
        longrepr = report.longrepr
        if isinstance(longrepr, tuple):  # a skip: (path, line, reason)
            return str(longrepr[2]).removeprefix("Skipped: ")
        crash = getattr(longrepr, "reprcrash", None)
        if crash is None:
            return self._clean(str(longrepr).strip().splitlines()[-1] if str(longrepr).strip() else "")
        lines = [ln for ln in self._clean(crash.message).splitlines() if ln.strip()][:MESSAGE_LINES]
        text = "\n".join(lines)
        if str(crash.path).startswith(self.stage_prefix):  # raised in the student's code: say where
            text += f" (at {self._clean(str(crash.path))}:{crash.lineno})"
        return text


def inner_args(task: PythonTask, gpu: bool = True) -> list[str]:
    """The inner session's options. Without a GPU, the tests marked `gpu` are deselected: a
    CPU machine grades the checks it can run, and the GPU ones are neither passed nor failed."""
    return [
        task.spec_file,
        *([] if gpu else ["-m", "not gpu"]),
        "--grader-inner",
        "-p",
        "grader.pytest_plugin",
        "-p",
        "no:cacheprovider",
        "--import-mode=importlib",  # the spec's folders stay off sys.path: the staged package comes first
        "-q",
        "--no-header",
        "--tb=short",
    ]


def verdict(tests: list[TestOutcome]) -> tuple[Verdict, str]:
    bad = [t for t in tests if t.outcome != "passed"]
    if not bad:
        return Verdict.PASS, ""
    lost = sum(t.points for t in bad)
    total = sum(t.points for t in tests)
    lines = [f"{len(bad)} of {len(tests)} tests did not pass ({lost:g} of {total:g} test points):"]
    for t in bad[:MAX_LISTED]:
        head, *rest = (t.message or t.outcome).splitlines() or [t.outcome]
        word = "" if t.outcome == "failed" else f"{t.outcome}: "
        lines.append(f"  {t.name}: {word}{head}")
        lines += [f"      {r}" for r in rest]
    if len(bad) > MAX_LISTED:
        lines.append(f"  ... and {len(bad) - MAX_LISTED} more")
    return Verdict.WRONG, "\n".join(lines)


def run(task: PythonTask, job: ChildJob, rec: Recorder) -> None:
    # the task's scratch folder: the grading process removes it even if this process is killed
    stage_dir = Path(tempfile.mkdtemp(prefix="stage-", dir=rec.scratch))
    try:
        rec.at(Stage.BUILDING, "staging the package")
        stage(task, job.sources, stage_dir)
        sys.path.insert(0, str(stage_dir))
        # the student's environment must not change what the inner session runs (-x, --task, plugins)
        os.environ.pop("PYTEST_ADDOPTS", None)
        os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        os.environ[STAGE_ENV] = str(stage_dir)  # shared_library builds what is staged here from a settled copy
        if job.lib:  # the library the grading process built from the task's .cu sources
            os.environ[LIBRARY_ENV] = job.lib
        else:
            os.environ.pop(LIBRARY_ENV, None)
        collector = Collector(rec, stage_dir, [Path(top).stem for top in task.staged()])
        rec.at(Stage.CHECKING, "collecting the tests")
        code = pytest.main(inner_args(task, toolchain.has_gpu()), plugins=[collector])
    finally:
        shutil.rmtree(stage_dir, ignore_errors=True)
    tests = rec.report.tests
    if collector.errors or code in (pytest.ExitCode.INTERNAL_ERROR, pytest.ExitCode.USAGE_ERROR):
        detail = "\n".join(collector.errors) or f"pytest ended with {pytest.ExitCode(code).name}"
        rec.set(verdict=Verdict.GRADER_ERROR, message=f"{task.spec_file}: the spec's tests cannot run:\n{detail}")
        return
    if not tests:
        rec.set(
            verdict=Verdict.GRADER_ERROR,
            message=f"{task.spec_file}: no point tests to run (a Python task's checks are the spec's own "
            f"tests, each marked @pytest.mark.points(n))",
        )
        return
    if collector.deselected:
        n = len(collector.deselected)
        rec.report.notes.append(
            f"{n} GPU check{'s' * (n > 1)} not run (no NVIDIA GPU here): {', '.join(collector.deselected[:4])}"
            f"{' ...' if n > 4 else ''}; a GPU machine grades them too"
        )
    v, message = verdict(tests)
    rec.set(verdict=v, message=message, phase=Phase(Stage.DONE))

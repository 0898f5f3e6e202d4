"""pytest front end: `pytest lab1` grades lab 1, so -k, -x and markers work as usual.

Each task file defines `TASK = Task(...)` and one test that calls the `grade` fixture. The
first such test builds every selected task in one parallel nvcc run; each test then waits for
its own task's verdict. At the end the plugin prints the table and, with --grade-dir, writes
results.json and summary.md.

A task that does not pass fails its test, but its message is printed once, under its row in the
table: what pytest itself prints for that test (the failure section, the short summary's FAILED
line) is a one-line pointer, while JUnit XML (`--junitxml`) still gets the whole message.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from grader.parent import runner
from grader.records import TaskResult, Verdict
from grader.report import envinfo
from grader.report.files import markdown, write_json
from grader.report.terminal import details, table
from grader.tasks import catalogue
from grader.tasks.spec import Task


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("grader")
    g.addoption("--task", default="", help="only these tasks: 03, 01,04 or lab2/03")
    g.addoption("--solutions", action="store_true", help="grade the reference solutions (instructors)")
    g.addoption("--timing", default="quick", choices=["off", "quick", "bench"], help="how carefully to time")
    g.addoption("--sanitize", action="store_true", help="run compute-sanitizer memcheck and racecheck")
    g.addoption("--force-run", action="store_true", help="run the checks even on untouched skeletons")
    g.addoption("--huge", action="store_true", help="also the cases past 2^31 elements (tens of GB; make grade)")
    g.addoption("--grade-dir", default="", help="write results.json and summary.md here")
    g.addoption("--grader-inner", action="store_true", help="internal: the task process's session of a Python task")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs an NVIDIA GPU to pass (skipped, with a reason, without one)")
    config.addinivalue_line("markers", "points(n): what a Python-module task's test is worth (default 1)")
    config.stash[_KEY] = Session(config)


_TASK_FILE = re.compile(r"test_(\d\d)_\w*\.py")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With --task, a lab's other task files are not imported at all (importing a spec costs its
    imports: a third of a second of lab 3's `make test-lab3 TASK=06`). Only when some file of the
    folder is a selected task's: a TASK= naming none is told which tasks there are, from them all."""
    selectors = [s for s in config.getoption("--task").split(",") if s.strip()]
    found = _TASK_FILE.fullmatch(collection_path.name)
    if not selectors or not found or collection_path.parent.name != "tests":
        return None
    lab = collection_path.parent.parent.name

    def wanted(number: str) -> bool:
        return any(catalogue.names_number(lab, number, s) for s in selectors)

    if wanted(found[1]):
        return None
    siblings = (_TASK_FILE.fullmatch(p.name) for p in collection_path.parent.iterdir())
    return True if any(m and wanted(m[1]) for m in siblings) else None


def _task_of(item: pytest.Item) -> Task | None:
    module = getattr(item, "module", None)
    task = getattr(module, "TASK", None)
    if isinstance(task, Task):
        task.spec_file = str(Path(str(module.__file__)).resolve())
        return task
    return None


def _runs_here(config: pytest.Config, item: pytest.Item) -> bool:
    """A task graded by its spec's own tests (a Python module) runs them in its task process, in
    an inner session (--grader-inner) that drops the `grade` test; the student's session runs only
    the `grade` test. What one side drops is not a test of that session, so it goes silently."""
    if not getattr(_task_of(item), "point_tests", False):
        return True
    return ("grade" in getattr(item, "fixturenames", ())) != config.getoption("--grader-inner")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items[:] = [item for item in items if _runs_here(config, item)]
    selectors = config.getoption("--task")
    if selectors:
        _check_selectors(selectors, [t for item in items if (t := _task_of(item)) is not None])
    keep, drop = [], []
    for item in items:
        task = _task_of(item)
        if task is not None and task.gpu:
            item.add_marker(pytest.mark.gpu)
        if selectors and (task is None or not catalogue.select([task], selectors)):
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _check_selectors(selectors: str, tasks: list[Task]) -> None:
    """A TASK= that names no task here is a mistyped command: say which tasks there are, instead
    of pytest's "N deselected" and an exit status that means "no tests ran"."""
    if not tasks:
        return
    for selector in (s.strip() for s in selectors.split(",") if s.strip()):
        if catalogue.select(tasks, selector):
            continue
        labs = sorted({t.lab for t in tasks})
        numbers = sorted({t.number for t in tasks})
        span = f"{numbers[0]}-{numbers[-1]}" if len(numbers) > 2 else " and ".join(numbers)
        where = " or ".join(labs)
        raise pytest.UsageError(
            f"TASK={selector}: no task {selector} in {where}; its tasks are {span} "
            f"(TASK=03, or labN/03 for a task of another lab with make test-labN)"
        )


class Session:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.results: list[TaskResult] = []
        self._pending: dict[str, TaskResult] = {}
        self._stream: Iterator[TaskResult] | None = None

    def options(self) -> runner.Options:
        c = self.config
        return runner.Options(
            solutions=c.getoption("--solutions"),
            timing=c.getoption("--timing"),
            sanitize=c.getoption("--sanitize"),
            force_run=c.getoption("--force-run"),
            huge=c.getoption("--huge"),
        )

    def result_for(self, task: Task, items: list[pytest.Item]) -> TaskResult:
        if self._stream is None:
            tasks = [t for t in (_task_of(i) for i in items) if t is not None]
            self._stream = runner.grade(tasks, self.options())
        while task.task_id not in self._pending:
            r = next(self._stream)
            self._pending[r.task_id] = r
        result = self._pending.pop(task.task_id)
        self.results.append(result)
        return result


_KEY = pytest.StashKey[Session]()


@pytest.fixture
def grade(request: pytest.FixtureRequest, record_property: Callable[[str, Any], None]) -> Callable[[Task], None]:
    session = request.config.stash[_KEY]

    def run(task: Task) -> None:
        r = session.result_for(task, request.session.items)
        record_property("verdict", str(r.verdict))
        record_property("points", f"{r.points:g}/{r.max_points:g}")
        seen: set[str] = set()
        for t in r.timings:
            key = t.entry if t.entry not in seen else f"{t.entry}, {t.case}"  # an entry's later cases
            seen.add(t.entry)
            record_property(f"time_ms[{key}]", f"{t.median_ms:.4f}")
            if t.speedup:
                record_property(f"speedup[{key}]", f"{t.speedup:.3f}")
        if r.verdict == Verdict.PASS:
            return
        if r.verdict == Verdict.SKIPPED:
            pytest.skip(r.message)
        raise TaskFailed(r)

    return run


class TaskFailed(pytest.fail.Exception):  # type: ignore[misc,valid-type]  # pytest.fail.Exception: pytest's Failed
    """`pytest.fail` for a task that did not pass, carrying its whole message and a one-line pointer."""

    def __init__(self, r: TaskResult) -> None:
        super().__init__(f"{r.verdict}: " + "\n".join(details(r)), pytrace=False)
        self.pointer = f"{r.verdict}: details under {r.task_id} in the grader table"


class _Crash:
    """What pytest's short summary (`FAILED test - ...`), `--tb=line` and JUnit's `message`
    attribute read from a report: the pointer."""

    def __init__(self, message: str) -> None:
        self.message = message

    def __str__(self) -> str:
        return self.message


class TaskFailureRepr:
    """A failed task's report for pytest (its `longrepr`): the terminal gets the pointer, since the
    table prints the message; `str()`, which JUnit XML writes into its <failure> element, the whole
    message. One object for every reader, so no hook order matters."""

    def __init__(self, pointer: str, message: str, line_style: bool) -> None:
        self.reprcrash = _Crash(pointer)
        self.message = message
        self.line_style = line_style  # --tb=line prints reprcrash itself: the pointer once, not twice

    def toterminal(self, tw: Any) -> None:
        if not self.line_style:
            tw.line(self.reprcrash.message)

    def __str__(self) -> str:
        return self.message


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    failure = call.excinfo.value if call.excinfo is not None else None
    if isinstance(failure, TaskFailed) and report.failed:
        line_style = item.config.getoption("tbstyle", "auto") == "line"
        report.longrepr = TaskFailureRepr(failure.pointer, failure.msg or "", line_style)
    return report


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    session = config.stash[_KEY]
    if not session.results:
        return
    tr = terminalreporter
    tr.section("grader")
    for line in table(session.results, with_details=True).splitlines():
        tr.write_line(line)
    got = sum(r.points for r in session.results)
    total = sum(r.max_points for r in session.results)
    tr.write_line(f"score: {got:g} / {total:g}")
    for r in session.results:
        for k in r.kernels:
            if k.spill_stores or k.spill_loads:
                tr.write_line(
                    f"note: {r.task_id} {k.kernel} spills {k.spill_stores} bytes to local memory "
                    f"({k.registers} registers): see the ptxas report in .build/"
                )
        for n in r.notes:
            if r.verdict == Verdict.PASS:
                tr.write_line(f"{r.task_id}: {n}")
    not_started = [r.task_id for r in session.results if r.verdict == Verdict.NOT_STARTED]
    if not_started and len(not_started) == len(session.results):
        tr.write_line("nothing started yet: open the lab's README.md and fill in the TODO regions")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    s = session.config.stash.get(_KEY, None)
    if s is not None and s._stream is not None:
        s._stream.close()  # lets the runner clean up its scratch folder now, not at interpreter exit
    out = session.config.getoption("--grade-dir", default="")
    if not s or not out:
        return
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    env = envinfo.environment()
    write_json(d / "results.json", s.results, env)
    (d / "summary.md").write_text(markdown(s.results, env))

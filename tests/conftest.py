"""Shared fixtures for the course's own tests, and how `make check` runs them on several
pytest-xdist workers (-n, --dist loadgroup): which tests share a worker, which start first, and a
line of progress per test file where pytest's own per-file lines would be dots only."""

from __future__ import annotations

import inspect
import os
import sys
import time
from collections import Counter
from typing import Any

import pytest

from grader import toolchain
from grader.tasks import catalogue
from grader.tasks.spec import Task


def all_tasks() -> list[Task]:
    return catalogue.all_tasks()


def build_everything() -> bool:
    """True under .ci/run, which installs every library and header wheel a .cu file builds against
    (cuBLAS, cuDNN, its frontend, CUTLASS): there a build "not built on this machine" is a broken
    set-up that would leave those tasks uncompiled, a failure rather than a warning."""
    return os.environ.get("COURSE_BUILD_EVERYTHING") == "1"


@pytest.fixture(scope="session")
def tasks() -> list[Task]:
    return all_tasks()


# --- make check on several workers ------------------------------------------------------------

# Tests that build the same units (every task's skeleton and solution, keyed alike in .build/):
# in one worker, the first builds and the others find them built, where two workers would each
# build them at once. test_compile_all goes first: verify and the release's checks then grade from
# its builds.
TASK_BUILDS = (
    "tests/test_compile_all.py",
    "tests/test_verify_cpu.py",
    "tests/test_cpu_grading.py",
    "tests/test_release.py",  # its student tree starts from a copy of .build, keyed relative to the tree
)

# What starts first on a worker, longest first, so that no worker starts a long one when the other
# is nearly done (xdist hands each worker its next test, or group of tests, as it finishes)
FIRST = (
    "tests/test_compile_all.py",
    "tests/test_verify_cpu.py",
    "tests/test_release.py::test_release_has_no_solutions_and_passes_its_checks",
    "tests/test_broken_variants.py::test_every_variant_applies_and_compiles",
    "tests/test_broken_variants.py::test_broken_variant_is_caught",
)


def _group_of(item: pytest.Item) -> str | None:
    """The xdist group an item joins, when it does not name one: a test of TASK_BUILDS joins
    theirs, and a test of a file with a module-scoped fixture of its own (a model trained, a tree
    copied, an extension built) joins its file's, so that the fixture is made once."""
    path = item.nodeid.split("::")[0]
    if path in TASK_BUILDS:
        return "task-builds"
    module = item.nodeid.split("::")[0]
    info = getattr(item, "_fixtureinfo", None)
    for defs in info.name2fixturedefs.values() if info else ():
        if any(d.scope == "module" and d.baseid == module for d in defs):
            return module
    return None


def _rank(item: pytest.Item) -> int:
    return next((i for i, prefix in enumerate(FIRST) if item.nodeid.startswith(prefix)), len(FIRST))


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist registers its mark itself; without it (a plain pytest run) the mark is inert
    config.addinivalue_line("markers", "xdist_group(name): tests that run in one pytest-xdist worker")
    # on the controller of a run spread over workers (-n N sets --dist too)
    if getattr(config.option, "dist", "no") != "no" and not hasattr(config, "workerinput"):
        if config.option.dist == "loadgroup" and _loadgroup_ignored():
            pytest.exit(
                f"pytest {pytest.__version__} with this pytest-xdist would group no tests under --dist loadgroup "
                "(pytest-xdist issue #1386): run ./setup.sh, which installs the pytest requirements.txt asks for",
                returncode=pytest.ExitCode.USAGE_ERROR,
            )
        config.pluginmanager.register(FileProgress(config), "course-file-progress")


def pytest_sessionstart(session: pytest.Session) -> None:
    workerinput = getattr(session.config, "workerinput", None)
    if workerinput is None:
        return
    # each worker's torch (and the graders and task processes it starts) on its share of the cores:
    # two workers' thread pools of every core each would spin against one another
    for name, threads in toolchain.cpu_share(int(workerinput.get("workercount", 1))).items():
        os.environ.setdefault(name, threads)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the groups off the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is None and (group := _group_of(item)):
            item.add_marker(pytest.mark.xdist_group(group))
    if hasattr(config, "workerinput"):  # every worker sorts alike: xdist checks they collect the same
        items.sort(key=_rank)


def _loadgroup_ignored() -> bool:
    """Whether pytest-xdist's --dist loadgroup would group nothing: it tells its scheduler a test's
    group by writing the test's `_nodeid`, which pytest 9.2 no longer reads (pytest-xdist issue
    #1386). Nothing fails then: grouped tests are spread over the workers, and each builds what its
    group shares, on both workers at once."""
    import xdist.remote

    writes = "._nodeid =" in inspect.getsource(xdist.remote)
    return writes and "_nodeid" not in inspect.getsource(pytest.Item.nodeid.fget)


SLOW_S = 30.0  # a test that runs this long gets a line of its own when it ends


class FileProgress:
    """Under pytest-xdist, on the controller: one line per test file as its last test ends (its
    counts, its seconds from its first test's start, the run's seconds so far), and one per test
    that ran SLOW_S or more, instead of a dot per test; failures still print their letter."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.start = time.monotonic()
        self.total: Counter[str] = Counter()
        self.done: Counter[str] = Counter()
        self.outcomes: dict[str, Counter[str]] = {}
        self.began: dict[str, float] = {}
        self.worst: dict[str, str] = {}

    @staticmethod
    def _file(nodeid: str) -> str:
        return nodeid.split("::")[0]

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        if not self.total:  # every worker collects the same tests
            self.total.update(self._file(i) for i in ids)

    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        self.began.setdefault(self._file(nodeid), time.monotonic())

    @pytest.hookimpl(tryfirst=True)
    def pytest_report_teststatus(self, report: pytest.TestReport, config: pytest.Config) -> Any:
        if report.when == "call" and report.passed and not hasattr(report, "wasxfail"):
            return "passed", "", ""
        if report.skipped and not hasattr(report, "wasxfail"):
            return "skipped", "", ""
        return None

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        outcome = "error" if report.failed and report.when != "call" else report.outcome
        order = ("passed", "skipped", "failed", "error")
        if order.index(outcome) > order.index(self.worst.get(report.nodeid, "passed")):
            self.worst[report.nodeid] = outcome
        tr = self.config.pluginmanager.get_plugin("terminalreporter")
        if report.when != "teardown" and report.duration >= SLOW_S and tr is not None:
            # a long test (or fixture) says so when it ends: its file's line may come minutes later
            what = "" if report.when == "call" else f" ({report.when})"
            tr.write_line(f"[{self._now():5.0f} s]   {report.nodeid}{what}: {outcome} ({report.duration:.0f} s)")
        if report.when != "teardown":
            return
        path = self._file(report.nodeid)
        self.outcomes.setdefault(path, Counter())[self.worst.pop(report.nodeid, "passed")] += 1
        self.done[path] += 1
        if self.done[path] == self.total.get(path, -1):
            counts = ", ".join(f"{n} {what}" for what, n in sorted(self.outcomes[path].items()))
            took = time.monotonic() - self.began.get(path, time.monotonic())
            if tr is not None:
                tr.write_line(f"[{self._now():5.0f} s] {path}: {counts} ({took:.0f} s)")

    def _now(self) -> float:
        return time.monotonic() - self.start

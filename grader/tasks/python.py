"""The Python-module kind: the student edits `.py` files of a package, graded by pytest tests.

Labs 4 and 5 build a compiler in Python; there the unit of work is a module of a package, and
the natural check is a handful of ordinary pytest tests. Those tests live in the spec file itself,
next to `TASK`, each marked with the points it is worth:

    @pytest.mark.points(3)
    def test_plan_orders_nodes():
        from kiln import planner          # import the student's code inside the test, never at the top
        ...

They never run in the student's own pytest session (`make test-labN`): the grader's plugin drops
them from collection there, and the spec's one `test_x(grade)` test grades the task through the
runner, which stages the package with the graded sources in a scratch folder and runs the point
tests in the task process (grader/child/pytests.py). A crash (ctypes, CUDA) or a hang in student
code therefore ends that process only and becomes this task's verdict.

A test without a `points` mark is worth 1 point; a parametrized test earns its points once per
parameter. The task's `points` are shared out in proportion to the points of the passing tests.

A test marked `@pytest.mark.gpu` is a GPU check inside such a task: a machine without a GPU
deselects it (the verdict notes how many were left out), so a CPU machine grades what it can
run, and a GPU machine grades all of it.

`gpu` defaults to False for this kind: most of a compiler is plain Python, and a task that needs
no GPU is run and graded on a CPU-only machine too (lab 4's CPU executor must be). A task whose
tests use CUDA says `gpu=True` and is skipped, with a reason, where there is no GPU.

A task's sources may also be `.cu`/`.cpp` files (with their headers): then it `builds_library`.
The grading process builds them with nvcc into one shared library, as it builds a CUDA task's
(grader/build/nvcc.py: the course's flags, the task's `nvcc_flags`, the same cache and compile-
error verdicts), before the task process starts, and passes the library's path to it in
GRADER_TASK_LIB; the point tests load it with `task_library()` (lab 6's all-reduces: a library the
tests drive from several processes, which a CudaTask's one call per case cannot). Where the task
is skipped (no GPU, too few), the build still runs: a compile error is still the verdict.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import ClassVar

from grader.tasks.spec import Task

DEFAULT_TEST_POINTS = 1.0
# what a PythonTask's sources may be: Python modules, and the C++/CUDA files of its library
PYTHON = (".py",)
COMPILED = (".cu", ".cpp", ".cc", ".cxx", ".c")  # grader/build/nvcc.py compiles these
HEADERS = (".h", ".hpp", ".cuh")  # hashed into the build's key, not compiled
LIBRARY_ENV = "GRADER_TASK_LIB"  # the task process's variable that names the built library


def task_library() -> Path:
    """The shared library the grading process built from the task's `.cu` sources, for the point
    tests to load with ctypes (`ctypes.CDLL(str(task_library()))`). Only inside a task process of a
    task that `builds_library`; elsewhere a RuntimeError that says so."""
    where = os.environ.get(LIBRARY_ENV)
    if not where:
        raise RuntimeError(
            f"{LIBRARY_ENV} is not set: the task's library is built by the grader and named to its task process "
            "(grade it with make test-labN TASK=NN, not by running the spec's tests directly)"
        )
    return Path(where)


@dataclass(kw_only=True)
class PythonTask(Task):
    """`sources` are the student's `.py` files relative to the lab folder (`kiln/planner.py`).

    The task process copies every top-level folder (or file) of the lab that `sources` or
    `packages` name into a scratch folder, puts the graded sources over them, and imports from
    there first: `packages` adds folders the tests need beyond the sources' own package.
    `builds_on` names other tasks' files the tests run (any suffix): a variant replaces only this
    task's own sources, so a run with `--solutions` runs the reference of every file involved.
    `packages` and `builds_on` may name another lab's files as `../lab4/kiln/...`: lab 5 runs lab
    4's compiler, staged as the top-level package `kiln` beside lab 5's own.
    """

    kind: ClassVar[str] = "python"
    # the spec's own pytest tests, marked with points, are the checks (the plugin reads this)
    point_tests: ClassVar[bool] = True

    gpu: bool = False
    packages: Sequence[str] = ()
    nvcc_flags: Sequence[str] = ()  # for the library of the `.cu` sources, beyond the course's flags
    # files of earlier tasks this one runs (lab 4's executor runs the kernels of tasks 03-05): staged
    # as this run grades them, the reference solutions' with --solutions, else the student's own
    builds_on: Sequence[str] = ()

    def __post_init__(self) -> None:
        allowed = (*PYTHON, *COMPILED, *HEADERS)
        bad = [s for s in self.sources if PurePosixPath(s).suffix not in allowed]
        if not self.sources or bad:
            raise ValueError(
                f"{self.lab}/{self.number}: a PythonTask's sources are .py files (and the .cu/.cpp files of its "
                f"library, with their headers), not {bad or 'none'}"
            )
        if not any(PurePosixPath(s).suffix in (*PYTHON, *COMPILED) for s in self.sources):
            raise ValueError(f"{self.lab}/{self.number}: a PythonTask's sources are .py files or compiled ones")

    @property
    def builds_library(self) -> bool:
        """True when some source is C++/CUDA: the grader builds the task's library (task_library)."""
        return any(PurePosixPath(s).suffix in COMPILED for s in self.sources)

    @property
    def library_sources(self) -> list[str]:
        """The sources the library is built from (and the headers hashed with them), in spec order."""
        return [s for s in self.sources if PurePosixPath(s).suffix in (*COMPILED, *HEADERS)]

    def staged(self) -> list[str]:
        """The lab's top-level folders and files that the task process copies: each source's
        package (or the source itself, at the top of the lab) and the declared `packages`."""
        tops = []
        for s in [*self.sources, *self.packages]:
            parts = PurePosixPath(s).parts
            tops.append(str(PurePosixPath(*parts[:3])) if parts[0] == ".." else parts[0])
        return list(dict.fromkeys(tops))

"""Deliberately broken submissions get the right verdict, and one broken task never stops the
others. Every lab with a `labN/solutions/broken.py` lists its variants there, as edits to that
lab's reference solutions, each standing for a class of mistake its task's spec names in
`mistakes`; they compile anywhere, and are graded where there is a GPU (grader/instructor/broken.py)."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable

import pytest

from grader import toolchain
from grader.build import nvcc as build
from grader.build.nvcc import BuildUnit
from grader.instructor import broken
from grader.records import TaskResult, Verdict
from grader.tasks.python import PythonTask
from grader.tasks.spec import CudaTask
from tests.conftest import build_everything

LABS = broken.labs()
if not LABS:
    pytest.skip("the broken variants ship with the solutions, not in a student release", allow_module_level=True)
BROKEN = {lab: broken.catalogue_of(lab) for lab in LABS}


GPU = toolchain.has_gpu()


def _grading_runs(lab: str) -> list[list[str]]:
    """The grading runs of a lab's variants that a machine without a GPU makes, as
    broken.grade_lab makes them there: the batches' variants a CPU can grade, one per task a run."""
    b = BROKEN[lab]
    return broken.one_per_task([n for batch in b.BATCHES for n in batch if not broken.needs_gpu(lab, n)])


RUNS = {lab: _grading_runs(lab) for lab in LABS}


def _graded_with(lab: str, name: str) -> str:
    """The pytest-xdist group of a variant's test: the variants of one grading run stay in one
    worker (the `results` fixture makes each run once per worker); with a GPU, a whole lab is one
    broken.grade_lab."""
    if not GPU:
        for i, run in enumerate(RUNS[lab]):
            if name in run:
                return f"variants-{lab}-{i}"
    return f"variants-{lab}"


def _each(lists: Callable, gpu_marks: bool = False, grouped: bool = False) -> list[pytest.ParameterSet]:
    """(lab, name) for the names `lists` picks from every lab's catalogue, with ids `labN/name`."""
    return [
        pytest.param(
            lab,
            name,
            id=f"{lab}/{name}",
            marks=[
                *([pytest.mark.gpu] if gpu_marks and broken.needs_gpu(lab, name) else []),
                *([pytest.mark.xdist_group(_graded_with(lab, name))] if grouped else []),
            ],
        )
        for lab in LABS
        for name in lists(BROKEN[lab])
    ]


def _by_task() -> list[pytest.ParameterSet]:
    """(lab, task) for every task with variants, ids `labN/NN_name`: one compile check per task, so
    that make check's workers share them out. The tasks whose builds read a library's or a header
    wheel's headers (cuDNN's frontend: a minute a variant) come first, so no worker starts one last."""
    found = []
    for lab in LABS:
        for stem in dict.fromkeys(n.split(".")[0] for n in BROKEN[lab].VARIANTS):
            task = broken.task_of(lab, f"{stem}.x")
            heavy = bool(getattr(task, "include_packages", ()) or getattr(task, "libraries", ()))
            found.append((not heavy, lab, stem))
    found.sort(key=lambda f: f[0])  # stable: otherwise in lab and task order
    return [pytest.param(lab, stem, id=f"{lab}/{stem}") for _, lab, stem in found]


# Whether a variant compiles, not how fast it runs: the front end alone (BuildUnit.check_only: no host
# code generated, no ptxas, no link) with the device code unoptimized (grading a variant on the GPU
# builds it with the task's own flags, to SASS). nvcc's last -O wins: this -O0 comes after the grader's -O3.
COMPILE_ONLY = ("-O0", "-Xcicc", "-O0")


@pytest.mark.parametrize(("lab", "stem"), _by_task())
def test_every_variant_applies_and_compiles(lab: str, stem: str) -> None:
    try:
        toolchain.find_nvcc()
    except toolchain.ToolchainError as e:
        pytest.skip(str(e))
    units = []
    for name in (n for n in BROKEN[lab].VARIANTS if n.split(".")[0] == stem):
        task = broken.task_of(lab, name)
        files = broken.sources(lab, task, name)  # every variant's edits apply, a notebook's too
        if name in BROKEN[lab].AT_BUILD:
            # test_build_time_variant_is_caught_without_a_gpu builds it with the task's own flags
            # wherever this test builds (where nvcc is), and its verdict needs that build to succeed
            continue
        # built as its task builds it: flags, libraries, header wheels (a Python task's library too)
        if isinstance(task, CudaTask) or (isinstance(task, PythonTask) and task.builds_library):
            unit = BuildUnit.for_task(task, files, "variant")
            units.append(dataclasses.replace(unit, flags=(*unit.flags, *COMPILE_ONLY), facts=False, check_only=True))
    results = build.build_all(units)  # notebooks and torch extensions are built by their own kinds
    # a library or header wheel this machine lacks (cuBLAS, the cuDNN frontend) is reported, as
    # tests/test_compile_all.py reports it: the GPU machine builds those variants when it grades them
    for unit, r in results.items():
        if r.verdict == Verdict.ENVIRONMENT and not r.ok:
            assert not build_everything(), f"{unit.name} ({unit.stem}) not built (COURSE_BUILD_EVERYTHING=1): {r.error}"
            warnings.warn(f"{unit.name} ({unit.stem}) not built on this machine: {r.error}", stacklevel=1)
    failed = {
        f"{u.name} ({u.stem})": r.error for u, r in results.items() if not r.ok and r.verdict != Verdict.ENVIRONMENT
    }
    assert not failed, failed


@pytest.mark.parametrize("lab", LABS)
def test_batches_cover_every_variant(lab: str) -> None:
    b = BROKEN[lab]
    graded = [n for batch in b.BATCHES for n in batch]
    assert sorted(graded + b.SANITIZED + b.HUGE + b.TIMED) == sorted(b.VARIANTS)
    assert sorted(n for n, v in b.VARIANTS.items() if v.timing) == sorted(b.TIMED)
    assert set(b.AT_BUILD) <= set(graded), "the build-time variants are graded on the GPU too"
    for batch in b.BATCHES:  # a grading run grades each task once: two variants of one task would collide
        tasks = [n.split(".")[0] for n in batch]
        assert len(set(tasks)) == len(tasks), f"a batch holds two variants of one task: {batch}"


@pytest.mark.parametrize("lab", LABS)
def test_every_mistake_class_has_a_variant(lab: str) -> None:
    """Every task names the mistakes its cases are built to catch, each class has a broken variant,
    and every variant stands for a class its task names."""
    problems = broken.mistake_problems(lab)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(("lab", "name"), _each(lambda b: b.AT_BUILD))
def test_build_time_variant_is_caught_without_a_gpu(lab: str, name: str) -> None:
    """The rules judge what was compiled, after the build and before anything runs: these verdicts
    need nvcc, not a GPU."""
    try:
        toolchain.find_nvcc()
    except toolchain.ToolchainError as e:
        pytest.skip(str(e))
    r = broken.grade(lab, [name], sanitize=False)[name]
    assert not (why := broken.missed(lab, name, r)), why


@pytest.fixture(scope="module")
def results() -> Callable[[str, str], TaskResult]:
    """A variant's result. With a GPU each lab is graded once (broken.grade_lab), when its first
    variant is checked; without one, each of the lab's grading runs (RUNS, grade_lab's there) is
    made once, when its first variant is checked."""
    graded: dict[str, dict[str, TaskResult]] = {}

    def of(lab: str, name: str) -> TaskResult:
        if GPU:
            if lab not in graded:
                graded[lab] = broken.grade_lab(lab, GPU)
            return graded[lab][name]
        run = _graded_with(lab, name)
        if run not in graded:
            graded[run] = broken.grade(lab, next(r for r in RUNS[lab] if name in r), sanitize=False)
        return graded[run][name]

    return of


@pytest.mark.parametrize(("lab", "name"), _each(lambda b: sorted(b.VARIANTS), gpu_marks=True, grouped=True))
def test_broken_variant_is_caught(lab: str, name: str, results: Callable[[str, str], TaskResult]) -> None:
    if broken.needs_gpu(lab, name) and not GPU:
        pytest.skip("no NVIDIA GPU: this variant can only be graded on one")
    need, seen = broken.task_of(lab, name).gpus, toolchain.visible_gpu_count()
    if need > seen:
        pytest.skip(f"its task needs {need} GPUs; this machine shows {toolchain.gpus_seen()}")
    if GPU and (reason := broken.unsupported_here(lab, name)):
        pytest.skip(f"the grader skips the entry point it breaks on this card: {reason}")
    r = results(lab, name)
    assert not (why := broken.missed(lab, name, r)), why
    print(f"{lab}/{name}: {r.verdict}: {r.message.splitlines()[0] if r.message else ''}")

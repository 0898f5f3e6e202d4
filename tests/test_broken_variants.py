"""Deliberately broken submissions get the right verdict, and one broken task never stops the
others. Every lab with a `labN/solutions/broken.py` lists its variants there, as edits to that
lab's reference solutions; they compile anywhere, and are graded where there is a GPU."""

from __future__ import annotations

import dataclasses
import importlib.util
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from grader import paths, toolchain
from grader.build import nvcc as build
from grader.build.nvcc import BuildUnit
from grader.parent import runner, scoring
from grader.records import TaskResult, Verdict
from grader.tasks import NotebookTask, PythonTask, Task, TorchExtensionTask, catalogue
from grader.tasks.spec import CudaTask
from grader.tests import variants


def _catalogue(lab: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"{lab}_broken", paths.ROOT / lab / "solutions" / "broken.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# the labs that describe broken variants, in lab order
LABS = [lab.name for lab in paths.labs() if (lab / "solutions" / "broken.py").exists()]
if not LABS:
    pytest.skip("the broken variants ship with the solutions, not in a student release", allow_module_level=True)
BROKEN = {lab: _catalogue(lab) for lab in LABS}


def _each(lists: Callable[[ModuleType], list[str]]) -> list[pytest.ParameterSet]:
    """(lab, name) for the names `lists` picks from every lab's catalogue, with ids `labN/name`."""
    return [pytest.param(lab, name, id=f"{lab}/{name}") for lab in LABS for name in lists(BROKEN[lab])]


def materialize(lab: str, name: str) -> Path:
    v = BROKEN[lab].VARIANTS[name]
    return variants.materialize(paths.ROOT / lab / "solutions" / v.solution, v.edits, f"{lab}-{name}", v.why)


def _sources(lab: str, task: Task, name: str) -> dict[str, Path]:
    """The files a variant is graded with: its broken one, and the task's other files, and those
    of earlier tasks it runs (`builds_on`), as solved."""
    rels = [*task.sources, *getattr(task, "builds_on", ())]
    files = {rel: paths.solution_source(task.lab_dir(), rel) for rel in rels}
    files[BROKEN[lab].VARIANTS[name].solution] = materialize(lab, name)
    return files


COMPILE_ONLY = ("-Xcicc", "-O0", "-Xptxas", "-O0")


@pytest.mark.parametrize("lab", LABS)
def test_every_variant_applies_and_compiles(lab: str) -> None:
    try:
        toolchain.find_nvcc()
    except toolchain.ToolchainError as e:
        pytest.skip(str(e))
    units = []
    for name in BROKEN[lab].VARIANTS:
        task = _task(lab, name)
        files = _sources(lab, task, name)  # every variant's edits apply, a notebook's too
        if isinstance(task, CudaTask):  # built as its task builds it: flags, libraries, header wheels
            unit = BuildUnit.for_task(task, files, "variant")
            # whether it compiles, not how fast it runs: device code unoptimized halves the build
            # (grading a variant on the GPU builds it with the task's own flags)
            units.append(dataclasses.replace(unit, flags=(*unit.flags, *COMPILE_ONLY)))
    results = build.build_all(units)  # notebooks and torch extensions are built by their own kinds
    # a library or header wheel this machine lacks (cuBLAS, the cuDNN frontend) is reported, as
    # tests/test_compile_all.py reports it: the GPU machine builds those variants when it grades them
    for unit, r in results.items():
        if r.verdict == Verdict.ENVIRONMENT and not r.ok:
            warnings.warn(f"{unit.name} ({unit.stem}) not built on this machine: {r.error}", stacklevel=1)
    failed = {
        f"{u.name} ({u.stem})": r.error for u, r in results.items() if not r.ok and r.verdict != Verdict.ENVIRONMENT
    }
    assert not failed, failed


@pytest.mark.parametrize("lab", LABS)
def test_batches_cover_every_variant(lab: str) -> None:
    broken = BROKEN[lab]
    graded = [n for batch in broken.BATCHES for n in batch]
    assert sorted(graded + broken.SANITIZED + broken.HUGE + broken.TIMED) == sorted(broken.VARIANTS)
    assert sorted(n for n, v in broken.VARIANTS.items() if v.timing) == sorted(broken.TIMED)
    assert set(broken.AT_BUILD) <= set(graded), "the build-time variants are graded on the GPU too"
    for batch in broken.BATCHES:  # a grading run grades each task once: two variants of one task would collide
        tasks = [n.split(".")[0] for n in batch]
        assert len(set(tasks)) == len(tasks), f"a batch holds two variants of one task: {batch}"


def _task(lab: str, name: str) -> Task:
    """The task a variant (`NN_name.what`) breaks."""
    tasks = {Path(t.spec_file).stem.removeprefix("test_"): t for t in catalogue.all_tasks([lab])}
    return tasks[name.split(".")[0]]


def _grade(
    lab: str, names: list[str], sanitize: bool, huge: bool = False, timing: str = "off"
) -> dict[str, TaskResult]:
    chosen = [_task(lab, n) for n in names]
    assert len({t.task_id for t in chosen}) == len(chosen), f"one variant per task in a grading run: {names}"
    sources = {t.task_id: _sources(lab, t, n) for t, n in zip(chosen, names, strict=True)}
    timeout = 120 if huge or timing == "bench" else (60 if timing != "off" else 20)
    # a notebook runs all its cells before its checks, an extension is built in the task process
    # (a cold build takes about a minute), and a Python task's tests build kernels and run models
    # there (lab 5's generation on the GPU): their own limits, not a kernel's
    slow = NotebookTask | TorchExtensionTask | PythonTask
    timeout = max([timeout] + [t.timeout or 0 for t in chosen if isinstance(t, slow)])
    opts = runner.Options(timing=timing, sanitize=sanitize, huge=huge, timeout=timeout)
    return dict(zip(names, runner.grade(chosen, opts, sources), strict=True))


@pytest.mark.parametrize(("lab", "name"), _each(lambda broken: broken.AT_BUILD))
def test_build_time_variant_is_caught_without_a_gpu(lab: str, name: str) -> None:
    """The rules judge what was compiled, after the build and before anything runs: these verdicts
    need nvcc, not a GPU."""
    try:
        toolchain.find_nvcc()
    except toolchain.ToolchainError as e:
        pytest.skip(str(e))
    v = BROKEN[lab].VARIANTS[name]
    r = _grade(lab, [name], sanitize=False)[name]
    assert str(r.verdict) in v.verdicts, f"{lab}/{name}: {r.verdict}: {r.message}"
    assert v.words.lower() in r.message.lower(), r.message


def one_per_task(names: list[str]) -> list[list[str]]:
    """`names` in batches that hold each task at most once (a grading run grades a task once)."""
    batches: list[list[str]] = []
    for name in names:
        task = name.split(".")[0]
        free = next((b for b in batches if all(n.split(".")[0] != task for n in b)), None)
        if free is None:
            batches.append(free := [])
        free.append(name)
    return batches


def _grade_lab(lab: str, gpu: bool) -> dict[str, TaskResult]:
    """Every variant of `lab`, graded: its batches, the sanitized ones, the huge ones, the timed ones.
    Without a GPU, only the variants of tasks that need none (their batches' other names wait)."""
    broken = BROKEN[lab]
    out: dict[str, TaskResult] = {}
    if not gpu:
        cpu = [n for batch in broken.BATCHES for n in batch if not _task(lab, n).gpu]
        for batch in one_per_task(cpu):
            out.update(_grade(lab, batch, sanitize=False))
        return out
    for batch in broken.BATCHES:
        out.update(_grade(lab, batch, sanitize=False))
    if broken.SANITIZED:
        out.update(_grade(lab, broken.SANITIZED, sanitize=True))
    if broken.HUGE:
        out.update(_grade(lab, broken.HUGE, sanitize=False, huge=True))
    # they game only the timed calls: timing on, with benchmark timing as `make grade` scores them
    # (quick timing's few calls let a run's noise decide a close target, either way)
    for batch in one_per_task(broken.TIMED):
        out.update(_grade(lab, batch, sanitize=False, timing="bench"))
    return out


@pytest.fixture(scope="module")
def results() -> Callable[[str], dict[str, TaskResult]]:
    """A lab's graded variants, by name: each lab is graded once, when its first variant is checked."""
    gpu = toolchain.has_gpu()
    graded: dict[str, dict[str, TaskResult]] = {}

    def of(lab: str) -> dict[str, TaskResult]:
        if lab not in graded:
            graded[lab] = _grade_lab(lab, gpu)
        return graded[lab]

    return of


def _every_variant() -> list[pytest.ParameterSet]:
    """Every variant, marked `gpu` where its task needs one (a CPU task's variants run anywhere)."""
    return [
        pytest.param(lab, name, id=f"{lab}/{name}", marks=[pytest.mark.gpu] if _task(lab, name).gpu else [])
        for lab in LABS
        for name in sorted(BROKEN[lab].VARIANTS)
    ]


@pytest.mark.parametrize(("lab", "name"), _every_variant())
def test_broken_variant_is_caught(lab: str, name: str, results: Callable[[str], dict[str, TaskResult]]) -> None:
    if _task(lab, name).gpu and not toolchain.has_gpu():
        pytest.skip("no NVIDIA GPU: this variant's task can only be graded on one")
    v = BROKEN[lab].VARIANTS[name]
    r = results(lab)[name]
    assert str(r.verdict) in v.verdicts, f"{lab}/{name}: {r.verdict}: {r.message}"
    assert v.words.lower() in r.message.lower(), r.message
    if v.perf_points is not None:  # a slow kernel that is right: the timing, not the verdict, must tell
        task = _task(lab, name)
        earned = scoring.score(task, r)[0] - task.points
        assert earned == v.perf_points, f"{lab}/{name}: {earned:g} performance points, expected {v.perf_points:g}"
    print(f"{lab}/{name}: {r.verdict}: {r.message.splitlines()[0] if r.message else ''}")

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
from grader.tasks.spec import CudaTask

LABS = broken.labs()
if not LABS:
    pytest.skip("the broken variants ship with the solutions, not in a student release", allow_module_level=True)
BROKEN = {lab: broken.catalogue_of(lab) for lab in LABS}


def _each(lists: Callable, gpu_marks: bool = False) -> list[pytest.ParameterSet]:
    """(lab, name) for the names `lists` picks from every lab's catalogue, with ids `labN/name`."""
    return [
        pytest.param(
            lab,
            name,
            id=f"{lab}/{name}",
            marks=[pytest.mark.gpu] if gpu_marks and broken.needs_gpu(lab, name) else [],
        )
        for lab in LABS
        for name in lists(BROKEN[lab])
    ]


COMPILE_ONLY = ("-Xcicc", "-O0")


@pytest.mark.parametrize("lab", LABS)
def test_every_variant_applies_and_compiles(lab: str) -> None:
    try:
        toolchain.find_nvcc()
    except toolchain.ToolchainError as e:
        pytest.skip(str(e))
    units = []
    for name in BROKEN[lab].VARIANTS:
        task = broken.task_of(lab, name)
        files = broken.sources(lab, task, name)  # every variant's edits apply, a notebook's too
        if isinstance(task, CudaTask):  # built as its task builds it: flags, libraries, header wheels
            unit = BuildUnit.for_task(task, files, "variant")
            # whether it compiles, not how fast it runs: device code unoptimized and no ptxas (PTX only)
            # make the build a few times faster (grading a variant on the GPU builds it with the
            # task's own flags, to SASS)
            units.append(dataclasses.replace(unit, flags=(*unit.flags, *COMPILE_ONLY), facts=False, ptx_only=True))
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
def results() -> Callable[[str], dict[str, TaskResult]]:
    """A lab's graded variants, by name: each lab is graded once, when its first variant is checked."""
    gpu = toolchain.has_gpu()
    graded: dict[str, dict[str, TaskResult]] = {}

    def of(lab: str) -> dict[str, TaskResult]:
        if lab not in graded:
            graded[lab] = broken.grade_lab(lab, gpu)
        return graded[lab]

    return of


@pytest.mark.parametrize(("lab", "name"), _each(lambda b: sorted(b.VARIANTS), gpu_marks=True))
def test_broken_variant_is_caught(lab: str, name: str, results: Callable[[str], dict[str, TaskResult]]) -> None:
    if broken.needs_gpu(lab, name) and not toolchain.has_gpu():
        pytest.skip("no NVIDIA GPU: this variant can only be graded on one")
    need, seen = broken.task_of(lab, name).gpus, toolchain.visible_gpu_count()
    if need > seen:
        pytest.skip(f"its task needs {need} GPUs; this machine shows {toolchain.gpus_seen()}")
    r = results(lab)[name]
    assert not (why := broken.missed(lab, name, r)), why
    print(f"{lab}/{name}: {r.verdict}: {r.message.splitlines()[0] if r.message else ''}")

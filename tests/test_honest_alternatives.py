"""Honest solutions written differently from the reference pass, under several secret seeds:
the grader rejects wrong code, never a different right one (grader/instructor/honest.py)."""

from __future__ import annotations

import dataclasses

import pytest

from grader import toolchain
from grader.build import nvcc as build
from grader.build.nvcc import BuildUnit
from grader.instructor import honest
from grader.instructor.broken import task_of
from grader.records import Verdict
from grader.tasks.python import PythonTask
from grader.tasks.spec import CudaTask

LABS = honest.labs()
if not LABS:
    pytest.skip("the alternatives ship with the solutions, not in a student release", allow_module_level=True)


@pytest.mark.parametrize("lab", LABS)
def test_every_alternative_applies_and_compiles(lab: str) -> None:
    try:
        toolchain.find_nvcc()
    except toolchain.ToolchainError as e:
        pytest.skip(str(e))
    units = []
    for name in honest.catalogue_of(lab).ALTERNATIVES:
        task = task_of(lab, name)
        files = honest.sources(lab, name)
        # whether it compiles (a Python task's library too): nvcc's front end alone, device code
        # unoptimized, as for the variants (test_broken_variants.py); grading it on a GPU builds it whole
        if isinstance(task, CudaTask) or (isinstance(task, PythonTask) and task.builds_library):
            unit = BuildUnit.for_task(task, files, "honest")
            units.append(
                dataclasses.replace(unit, flags=(*unit.flags, "-O0", "-Xcicc", "-O0"), facts=False, check_only=True)
            )
    failed = {f"{u.name} ({u.stem})": r.error for u, r in build.build_all(units).items() if not r.ok}
    assert not failed, failed


@pytest.mark.gpu
@pytest.mark.parametrize("seed", honest.SEEDS)
@pytest.mark.parametrize("lab", LABS)
def test_honest_alternatives_pass(lab: str, seed: str) -> None:
    if not toolchain.has_gpu():
        pytest.skip("no NVIDIA GPU: the alternatives can only be graded on one")
    results = honest.grade_lab(lab, seed)
    flagged = {n: f"{r.verdict}: {r.headline()}" for n, r in results.items() if r.verdict != Verdict.PASS}
    assert not flagged, f"GRADER_SEED={seed}: honest solutions flagged: {flagged}"

"""Every kernel in the course compiles: each CUDA task's skeleton and reference solution as the
grader builds them (all the task's files, its flags, libraries and header wheels), and any other
.cu file of a lab on its own. A task whose library or header wheel this machine lacks is an
environment verdict, reported, never a failure."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from grader import paths, toolchain
from grader.build import nvcc as build
from grader.build.nvcc import BuildUnit
from grader.records import Verdict
from grader.tasks import catalogue
from grader.tasks.spec import CudaTask
from tests.conftest import build_everything


def _units() -> list[BuildUnit | Path]:
    units: list[BuildUnit | Path] = []
    covered: set[Path] = set()
    for task in catalogue.all_tasks():
        if not isinstance(task, CudaTask):
            # a torch extension's sources are built by torch.utils.cpp_extension, against torch's
            # headers, when the task is graded (grader/child/torch_ext.py): not nvcc files on their own
            for where in (paths.student_source, paths.solution_source):
                covered.update(where(task.lab_dir(), rel).resolve() for rel in task.sources)
            continue
        lab = task.lab_dir()
        for variant, where in (("student", paths.student_source), ("solution", paths.solution_source)):
            files = {rel: where(lab, rel) for rel in task.sources}
            if all(f.exists() for f in files.values()):
                units.append(BuildUnit.for_task(task, files, variant))
                covered.update(f.resolve() for f in files.values())
    strays = sorted(p for lab in paths.labs() for p in lab.rglob("*.cu") if p.resolve() not in covered)
    return units + strays


def _name(unit: BuildUnit | Path) -> str:
    return paths.rel(unit) if isinstance(unit, Path) else f"{unit.name} ({unit.stem})"


def test_every_cu_file_compiles():
    try:
        toolchain.find_nvcc()
    except toolchain.ToolchainError as e:
        pytest.skip(str(e))
    units = _units()
    assert units, "no .cu files found"
    results = build.build_all(units)
    missing = {_name(u): r.error for u, r in results.items() if r.verdict == Verdict.ENVIRONMENT and not r.ok}
    assert not (missing and build_everything()), "not built (COURSE_BUILD_EVERYTHING=1):\n" + "\n".join(
        f"{k}: {v}" for k, v in missing.items()
    )
    for what, why in missing.items():
        warnings.warn(f"{what} not built on this machine: {why}", stacklevel=1)
    failed = {_name(u): r.error for u, r in results.items() if not r.ok and _name(u) not in missing}
    assert not failed, "\n".join(f"{k}: {v}" for k, v in failed.items())


def test_no_timed_build_uses_device_debug():
    assert "-G" not in build.FLAGS and "-O3" in build.FLAGS and "-lineinfo" in build.FLAGS
    assert "-G" in build.REFUSED_TASK_FLAGS  # nor may a task's own nvcc_flags ask for it

"""Deliberately broken lab 1 submissions get the right verdict, and one broken task never stops
the others. The variants are edits to the reference solutions (lab1/solutions/broken.py); they
compile anywhere, and are graded where there is a GPU."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from grader import paths, toolchain
from grader.build import nvcc as build
from grader.parent import runner
from grader.records import TaskResult
from grader.tasks import catalogue

SOLUTIONS = paths.ROOT / "lab1" / "solutions"
OUT = paths.BUILD / "broken"


def _catalogue() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lab1_broken", SOLUTIONS / "broken.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if not (SOLUTIONS / "broken.py").exists():
    pytest.skip("the broken variants ship with the solutions, not in a student release", allow_module_level=True)
BROKEN = _catalogue()


def materialize(name: str) -> Path:
    v = BROKEN.VARIANTS[name]
    text = (SOLUTIONS / v.solution).read_text()
    for old, new in v.edits:
        assert old in text, f"{name}: the edit no longer applies to {v.solution}: {old!r}"
        text = text.replace(old, new)
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{name}.cu"
    path.write_text(f"// BROKEN ON PURPOSE ({v.why})\n{text}")
    return path


def test_every_variant_applies_and_compiles():
    try:
        toolchain.find_nvcc()
    except toolchain.ToolchainError as e:
        pytest.skip(str(e))
    results = build.build_all([materialize(n) for n in BROKEN.VARIANTS])
    failed = {paths.rel(s): r.error for s, r in results.items() if not r.ok}
    assert not failed, failed


def test_batches_cover_every_variant():
    graded = [n for batch in BROKEN.BATCHES for n in batch]
    assert sorted(graded + BROKEN.SANITIZED + BROKEN.HUGE + BROKEN.TIMED) == sorted(BROKEN.VARIANTS)
    assert sorted(n for n, v in BROKEN.VARIANTS.items() if v.timing) == sorted(BROKEN.TIMED)
    assert set(BROKEN.AT_BUILD) <= set(graded), "the build-time variants are graded on the GPU too"


def _grade(names: list[str], sanitize: bool, huge: bool = False, timing: str = "off") -> dict[str, TaskResult]:
    tasks = {Path(t.spec_file).stem.removeprefix("test_"): t for t in catalogue.all_tasks(["lab1"])}
    chosen = [tasks[n.split(".")[0]] for n in names]
    assert len({t.task_id for t in chosen}) == len(chosen), f"one variant per task in a grading run: {names}"
    sources = {t.task_id: materialize(n) for t, n in zip(chosen, names, strict=True)}
    timeout = 120 if huge else (60 if timing != "off" else 20)
    opts = runner.Options(timing=timing, sanitize=sanitize, huge=huge, timeout=timeout)
    return dict(zip(names, runner.grade(chosen, opts, sources), strict=True))


@pytest.mark.parametrize("name", BROKEN.AT_BUILD)
def test_build_time_variant_is_caught_without_a_gpu(name: str) -> None:
    """The rules judge what was compiled, after the build and before anything runs: these verdicts
    need nvcc, not a GPU."""
    try:
        toolchain.find_nvcc()
    except toolchain.ToolchainError as e:
        pytest.skip(str(e))
    v = BROKEN.VARIANTS[name]
    r = _grade([name], sanitize=False)[name]
    assert str(r.verdict) in v.verdicts, f"{name}: {r.verdict}: {r.message}"
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


@pytest.fixture(scope="module")
def results() -> dict[str, TaskResult]:
    if not toolchain.has_gpu():
        pytest.skip("no NVIDIA GPU: the broken variants can only be run on one")
    out: dict[str, TaskResult] = {}
    for batch in BROKEN.BATCHES:
        out.update(_grade(batch, sanitize=False))
    out.update(_grade(BROKEN.SANITIZED, sanitize=True))
    out.update(_grade(BROKEN.HUGE, sanitize=False, huge=True))
    for batch in one_per_task(BROKEN.TIMED):  # they game only the timed calls: timing on
        out.update(_grade(batch, sanitize=False, timing="quick"))
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(BROKEN.VARIANTS))
def test_broken_variant_is_caught(name: str, results: dict[str, TaskResult]) -> None:
    v = BROKEN.VARIANTS[name]
    r = results[name]
    assert str(r.verdict) in v.verdicts, f"{name}: {r.verdict}: {r.message}"
    assert v.words.lower() in r.message.lower(), r.message
    print(f"{name}: {r.verdict}: {r.message.splitlines()[0] if r.message else ''}")

"""The CUDA-library kind end to end, on the fixture task fixtures/90 (grader/tests/fixtures/cuda):
two files (a hand kernel and host code calling cuBLAS), a per-task nvcc flag, a library.

Without a GPU every variant builds, links cuBLAS and is skipped with the reason; with one, the
four variants get pass, wrong, crash and timeout. The build cache is checked on a copy of the
fixture: a header edit rebuilds, a flag change builds anew, an unchanged task is cached.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from grader import paths, toolchain
from grader.build import nvcc, packages
from grader.build.nvcc import BuildUnit, build_all
from grader.parent import runner
from grader.records import Verdict
from grader.tasks import catalogue
from grader.tasks.spec import CudaTask

FIXTURE = Path(__file__).parent / "fixtures" / "cuda"
SPEC = FIXTURE / "tests" / "test_90_blas_axpy.py"
KERNEL = "90_axpy_kernel.cu"
EXPECTED = {"pass": Verdict.PASS, "wrong": Verdict.WRONG, "crash": Verdict.CRASH, "timeout": Verdict.TIMEOUT}
OPTS = runner.Options(timing="off", timeout=20)


def _task() -> CudaTask:
    task = catalogue.load_task(SPEC)
    assert isinstance(task, CudaTask)
    return task


def _override(variant: str) -> dict[str, Path]:
    return {} if variant == "pass" else {KERNEL: FIXTURE / "variants" / f"90_axpy_kernel.{variant}.cu"}


def _need_nvcc() -> None:
    try:
        toolchain.find_nvcc()
    except toolchain.ToolchainError as e:
        pytest.skip(str(e))


def _need_cublas() -> None:
    _need_nvcc()
    tk = nvcc._toolkit(toolchain.find_nvcc())
    try:
        packages.find_library("cublas", tk.lib_dirs, tk.include_dirs)
    except toolchain.ToolchainError as e:
        pytest.skip(f"cuBLAS is not installed here, so the fixture cannot link: {e}")


def _grade(variant: str):
    task = _task()
    overrides = {task.task_id: _override(variant)} if variant != "pass" else {}
    (result,) = runner.grade([task], OPTS, overrides)
    return result


def test_every_variant_builds_both_files_with_the_flag_and_links_the_library():
    _need_cublas()
    task = _task()
    units = {v: BuildUnit.for_task(task, runner.sources_of(task, OPTS, _override(v)), "variant") for v in EXPECTED}
    results = build_all(list(units.values()))
    for variant, unit in units.items():
        r = results[unit]
        assert r.ok, f"{variant}: {r.error}"
        assert r.facts is not None and r.facts.needed is not None
        assert any(n.startswith("libcublas.so") for n in r.facts.needed), r.facts.needed
        assert "cublasSaxpy_v2" in (r.facts.library_symbols or [])
        assert [k.kernel.split("(")[0] for k in r.facts.kernels] == ["axpy_kernel"]
    assert len({r.lib for r in results.values()}) == 4, "each variant has its own library"


@pytest.mark.skipif(toolchain.has_gpu(), reason="checks the no-GPU path; test_on_a_gpu_... covers this machine")
@pytest.mark.parametrize("variant", sorted(EXPECTED))
def test_without_a_gpu_each_variant_builds_and_is_skipped_with_the_reason(variant: str) -> None:
    _need_cublas()
    r = _grade(variant)
    assert r.verdict == Verdict.SKIPPED, f"{variant}: {r.verdict}: {r.message}"
    assert "no NVIDIA GPU" in r.message and "compiled" in r.message


@pytest.mark.gpu
@pytest.mark.parametrize("variant", sorted(EXPECTED))
def test_on_a_gpu_each_variant_gets_its_verdict(variant: str) -> None:
    if not toolchain.has_gpu():
        pytest.skip("no NVIDIA GPU: the fixture's variants can only be run on one")
    _need_cublas()
    r = _grade(variant)
    assert r.verdict == EXPECTED[variant], f"{variant}: {r.verdict}: {r.message}"


def test_a_missing_library_is_an_environment_verdict_naming_the_fix(monkeypatch):
    _need_nvcc()

    def not_here(name: str, *_: object) -> packages.FoundLibrary:
        raise toolchain.ToolchainError(f"cuBLAS is not installed here: .venv/bin/python -m pip install nvidia-{name}")

    monkeypatch.setattr(packages, "find_library", not_here)
    r = _grade("pass")
    assert r.verdict == Verdict.ENVIRONMENT and "pip install nvidia-cublas" in r.message, r.message
    assert r.points == 0


def test_a_missing_header_wheel_is_an_environment_verdict_naming_the_fix(monkeypatch):
    _need_nvcc()
    fake = packages.HeaderPackage("nvidia-no-such-headers", "none.h", "the fixture's headers")
    monkeypatch.setitem(packages.HEADER_PACKAGES, fake.dist, fake)
    task = dataclasses.replace(_task(), include_packages=[fake.dist], libraries=[])
    (r,) = runner.grade([task], OPTS)
    assert r.verdict == Verdict.ENVIRONMENT, r.message
    assert "pip install --no-deps nvidia-no-such-headers" in r.message


@pytest.mark.parametrize(
    ("change", "words"),
    [({"libraries": ["cublas", "magma"]}, "unknown library 'magma'"), ({"nvcc_flags": ["-G"]}, "-G")],
)
def test_a_spec_the_build_refuses_is_a_grader_error(change, words):
    _need_nvcc()
    (r,) = runner.grade([dataclasses.replace(_task(), **change)], OPTS)
    assert r.verdict == Verdict.GRADER_ERROR and words in r.message, r.message


def test_the_cache_follows_headers_and_flags_and_nothing_else(tmp_path, monkeypatch):
    """On a copy of the fixture's hand-kernel file and header (cuBLAS is not needed for this)."""
    _need_nvcc()
    monkeypatch.setattr(paths, "BUILD", tmp_path / "build")
    lab = tmp_path / "cuda"
    shutil.copytree(FIXTURE, lab, ignore=shutil.ignore_patterns("variants", "__pycache__"))
    task = dataclasses.replace(
        _task(), spec_file=str(lab / "tests" / SPEC.name), sources=[KERNEL], libraries=[], entries=[]
    )

    def build(t: CudaTask) -> nvcc.BuildResult:
        unit = BuildUnit.for_task(t, runner.sources_of(t, OPTS), "student")
        return build_all([unit], arch="sm_90")[unit]

    first = build(task)
    assert first.ok and not first.cached, first.error
    assert str(lab / "fixture_scale.h") in first.facts.headers  # type: ignore[union-attr]
    header = lab / "fixture_scale.h"
    header.write_text(header.read_text())  # a save without a change
    again = build(task)
    assert again.cached and again.lib == first.lib

    header.write_text(header.read_text() + "// edited\n")
    edited = build(task)
    assert edited.ok and not edited.cached, "an edit to an included header must rebuild"
    assert build(task).cached

    flagged = build(dataclasses.replace(task, nvcc_flags=[*task.nvcc_flags, "--use_fast_math"]))
    assert flagged.ok and not flagged.cached and flagged.lib != first.lib

    unflagged = build(dataclasses.replace(task, nvcc_flags=[]))
    assert not unflagged.ok and "FIXTURE_SCALE must come from the task's nvcc_flags" in unflagged.log
    assert unflagged.verdict == Verdict.COMPILE_ERROR

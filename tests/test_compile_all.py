"""Every kernel in the course compiles: skeletons, reference solutions and the broken variants."""

from __future__ import annotations

import pytest

from grader import paths, toolchain
from grader.build import nvcc as build


def _sources():
    return sorted(p for lab in paths.labs() for p in lab.rglob("*.cu"))


def test_every_cu_file_compiles():
    try:
        toolchain.find_nvcc()
    except toolchain.ToolchainError as e:
        pytest.skip(str(e))
    sources = _sources()
    assert sources, "no .cu files found"
    results = build.build_all(sources)
    failed = {paths.rel(s): r.error for s, r in results.items() if not r.ok}
    assert not failed, "\n".join(f"{k}: {v}" for k, v in failed.items())


def test_no_timed_build_uses_device_debug():
    assert "-G" not in build.FLAGS and "-O3" in build.FLAGS and "-lineinfo" in build.FLAGS

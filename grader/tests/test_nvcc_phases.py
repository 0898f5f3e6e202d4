"""nvcc's phases side by side (grader/build/phases.py) build what nvcc builds, report what nvcc
reports, and give way to nvcc itself whenever its plan is not the one shape they know."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from grader import toolchain
from grader.build import nvcc as build
from grader.build import phases
from grader.build.nvcc import BuildUnit

try:
    NVCC = toolchain.find_nvcc()
except toolchain.ToolchainError as e:
    pytest.skip(str(e), allow_module_level=True)

FLAGS = [*build.FLAGS, *toolchain.gencode_flags(toolchain.target_arch())]

# a device-only header (under __CUDA_ARCH__), a warning on each side and two kernels
SOURCE = """\
#include <cstdio>
#ifdef __CUDA_ARCH__
#include "device_only.h"
#endif
__global__ void scale(float* x, int n) { int unused = 3; int i = threadIdx.x; if (i < n) x[i] *= 2.0f; }
__global__ void fill(float* x) { x[threadIdx.x] = 1.0f; }
void host_side() { int host_unused = 4; }
extern "C" int launch(float* x, int n) { scale<<<1, n>>>(x, n); fill<<<1, 1>>>(x); return 0; }
"""


def _compile(src: Path, out: Path, phased: bool) -> tuple[int, str, Path]:
    """(exit status, log, dependency file) of compiling src to out, by nvcc or by its phases."""
    keep = out.with_suffix(".keep")
    keep.mkdir()
    dep = out.with_suffix(".d")
    command = [str(NVCC), *FLAGS, "-MD", "-MF", str(dep), "--keep", "--keep-dir", str(keep), "-c", str(src)]
    command += ["-o", str(out)]
    if phased:
        text = phases.script(command, src, out, dep, keep)
        assert text is not None, "nvcc's plan was not recognized"
        (keep / "build.sh").write_text(text)
        command = ["/bin/sh", str(keep / "build.sh")]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    return done.returncode, done.stdout + done.stderr, dep


def _symbols(obj: Path) -> list[str]:
    out = subprocess.run(["nm", "-C", "--defined-only", str(obj)], capture_output=True, text=True, check=True).stdout
    return sorted(line.split(" ", 2)[2] for line in out.splitlines() if " T " in line)


@pytest.fixture
def source(tmp_path: Path) -> Path:
    (tmp_path / "device_only.h").write_text("#define DEVICE_ONLY 1\n")
    src = tmp_path / "k.cu"
    src.write_text(SOURCE)
    return src


def test_the_phases_build_what_nvcc_builds_and_say_what_it_says(source: Path, tmp_path: Path):
    rc1, log1, dep1 = _compile(source, tmp_path / "nvcc.o", phased=False)
    rc2, log2, dep2 = _compile(source, tmp_path / "phased.o", phased=True)
    assert rc1 == rc2 == 0, log2
    assert _symbols(tmp_path / "nvcc.o") == _symbols(tmp_path / "phased.o")
    assert "launch" in _symbols(tmp_path / "phased.o")

    def ptxas(log: str) -> list[str]:
        return [line for line in log.splitlines() if "Used" in line or "entry function" in line]

    assert ptxas(log1) == ptxas(log2) and len(ptxas(log2)) == 4
    for warning in ('"unused" was declared', '"host_unused" was declared'):
        assert log1.count(warning) == log2.count(warning) == 1
    # the headers both preprocessors read, the device-only one included
    assert set(build._dep_file(dep1)) == set(build._dep_file(dep2))
    assert str(tmp_path / "device_only.h") in build._dep_file(dep2)


def test_a_compile_error_is_reported_once_as_nvcc_reports_it(tmp_path: Path):
    src = tmp_path / "bad.cu"
    src.write_text("__global__ void k(float* x) { x[0] = undefined_thing; }\nvoid f(float* x) { k<<<1, 1>>>(x); }\n")
    rc1, log1, _ = _compile(src, tmp_path / "nvcc.o", phased=False)
    rc2, log2, _ = _compile(src, tmp_path / "phased.o", phased=True)
    assert rc1 != 0 and rc2 != 0
    assert log1.count('identifier "undefined_thing" is undefined') == 1
    assert log2.count('identifier "undefined_thing" is undefined') == 1
    assert not (tmp_path / "phased.o").exists()


def test_a_device_only_error_fails_the_build(tmp_path: Path):
    # the host chain passes; cicc refuses a host function called from device code
    src = tmp_path / "device.cu"
    src.write_text("int h() { return 1; }\n__global__ void k(int* x) { x[0] = h(); }\n")
    rc, log, _ = _compile(src, tmp_path / "phased.o", phased=True)
    assert rc != 0 and "h" in log and "error" in log
    assert not (tmp_path / "phased.o").exists()


def test_plans_of_another_shape_go_to_nvcc(source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    keep, obj, dep = tmp_path / "keep", tmp_path / "k.o", tmp_path / "k.d"
    command = [str(NVCC), *FLAGS, "-MD", "-MF", str(dep), "--keep", "--keep-dir", str(keep), "-c", str(source)]
    command += ["-o", str(obj)]
    assert phases.script(command, source, obj, dep, keep) is not None
    # two architectures: two device chains, not this module's shape
    two = [*command, "-gencode=arch=compute_80,code=sm_80"]
    assert phases.script(two, source, obj, dep, keep) is None
    assert phases.script([c for c in command if c != "--keep"], source, obj, dep, keep) is None
    real = phases.plan
    monkeypatch.setattr(phases, "plan", lambda c: (real(c)[0], [*real(c)[1], "nvlink --shared x.o"]))
    assert phases.script(command, source, obj, dep, keep) is None
    monkeypatch.setattr(phases, "plan", real)
    monkeypatch.setenv("GRADER_NVCC_PHASES", "0")
    assert phases.script(command, source, obj, dep, keep) is None


def test_a_path_the_shell_would_expand_goes_to_nvcc(tmp_path: Path):
    odd = tmp_path / "a$HOME"
    odd.mkdir()
    src = odd / "k.cu"
    src.write_text(SOURCE)
    command = [str(NVCC), *FLAGS, "--keep", "--keep-dir", str(odd), "-c", str(src), "-o", str(odd / "k.o")]
    assert phases.script(command, src, odd / "k.o", None, odd) is None


def test_the_grader_builds_through_the_phases(source: Path, monkeypatch: pytest.MonkeyPatch):
    made: list[str] = []
    real = phases.script

    def spy(*args, **kw):
        made.append(text := real(*args, **kw) or "")
        return text or None

    monkeypatch.setattr(phases, "script", spy)
    unit = BuildUnit("phases-test", (source,), "grader-tests", "phases", facts=False)
    (r,) = build.build_all([unit]).values()
    assert r.ok, r.error
    assert made and made[0], "the build did not use nvcc's phases"
    assert [k.kernel for k in r.kernels] and re.search(r"scale", " ".join(k.kernel for k in r.kernels))

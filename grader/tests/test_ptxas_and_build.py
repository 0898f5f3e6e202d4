import shutil

import pytest

from grader import paths, toolchain
from grader.build import nvcc as build
from grader.build.ptxas import parse_ptxas

LOG = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z4racePf' for 'sm_90'
ptxas info    : Function properties for _Z4racePf
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 12 registers, used 1 barriers, 1024 bytes smem
ptxas info    : Compiling entry function '_Z3addPKfPfi' for 'sm_90'
ptxas info    : Function properties for _Z3addPKfPfi
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 0 barriers
"""


def test_ptxas_report_per_kernel():
    ks = parse_ptxas(LOG)
    assert [k.registers for k in ks] == [12, 10]
    assert (ks[0].spill_stores, ks[0].stack_bytes, ks[0].smem_bytes) == (4, 8, 1024)
    if shutil.which("c++filt"):
        assert ks[0].kernel == "race(float*)"


def test_first_error_names_file_and_line(tmp_path):
    src = tmp_path / "k.cu"
    src.write_text("int a;\n  int b = undefined_thing;\n")
    log = f'{src}(2): error: identifier "undefined_thing" is undefined\n\n1 error detected\n'
    msg = build.first_error(log)
    assert msg.splitlines()[0].endswith(':2: error: identifier "undefined_thing" is undefined')
    assert "int b = undefined_thing;" in msg


def _have_nvcc() -> bool:
    try:
        toolchain.find_nvcc()
    except toolchain.ToolchainError:
        return False
    return True


@pytest.mark.skipif(not _have_nvcc(), reason="nvcc not installed: install the CUDA toolkit to compile kernels")
def test_build_caches_by_content_and_reports_errors(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "BUILD", tmp_path / "build")
    good = tmp_path / "good.cu"
    good.write_text(
        '#include "course.h"\n__global__ void k(float* x) { x[threadIdx.x] = 1.f; }\n'
        "COURSE_API cudaError_t run(float* x) { k<<<1, 32>>>(x); return cudaGetLastError(); }\n"
    )
    bad = tmp_path / "bad.cu"
    bad.write_text('#include "course.h"\n__global__ void k(float* x) { x[0] = oops; }\n')
    first = build.build_all([good, bad], arch="sm_90")
    assert first[good].ok and not first[good].cached and first[good].kernels[0].registers > 0
    assert not first[bad].ok and "bad.cu:2" in first[bad].error and "oops" in first[bad].error
    again = build.build_all([good], arch="sm_90")
    assert again[good].cached and again[good].lib == first[good].lib
    good.write_text(good.read_text() + "// edited\n")
    assert not build.build_all([good], arch="sm_90")[good].cached

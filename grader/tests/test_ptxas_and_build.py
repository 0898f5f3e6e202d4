import shutil
import subprocess
from pathlib import Path

import pytest

from grader import paths, toolchain
from grader.build import nvcc as build
from grader.build.nvcc import BuildUnit
from grader.build.ptxas import parse_entries, parse_ptx, parse_ptxas
from grader.records import Verdict

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
    assert [k.barriers for k in parse_entries(LOG)] == [1, 0]


PTX = """\
.extern .shared .align 16 .b8 dyn_smem[];
.func _Z6helperv()
{
\tbar.sync \t0;
\tret;
}
.visible .entry _Z3dynPf(
\t.param .u64 _Z3dynPf_param_0
)
{
\tmov.u32 \t%r1, dyn_smem;
\tst.shared.f32 \t[%r1], %f1;
\tbar.warp.sync \t-1;
\tret;
}
.visible .entry _Z5outerPf(
\t.param .u64 _Z5outerPf_param_0
)
{
\tcall.uni \t_Z6helperv, ();
\tret;
}
"""


def test_ptx_facts_per_kernel_follow_calls_and_know_a_warp_sync_from_a_barrier():
    facts = parse_ptx(PTX)
    assert (facts["_Z3dynPf"].shared, facts["_Z3dynPf"].barrier) == (True, False)
    assert (facts["_Z5outerPf"].shared, facts["_Z5outerPf"].barrier) == (False, True)
    assert "_Z6helperv" not in facts  # a device function is no kernel


def test_a_toolchain_failure_is_told_apart_from_a_compile_error():
    assert build.environment_problem("#error -- unsupported GNU version! gcc versions later than 14") is not None
    assert build.environment_problem("nvcc fatal   : Unsupported gpu architecture 'compute_20'") is not None
    assert build.environment_problem('f.cu(2): error: identifier "oops" is undefined') is None


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


def test_a_copy_of_the_checkout_finds_the_same_builds(tmp_path, monkeypatch):
    """The key names a source by its place in the checkout: a student release made with a copy of
    .build (or a moved clone) reuses the builds of its unchanged files; another place, or another
    file's content, is another key."""
    keys = {}
    for root in ("a", "b"):
        lab = tmp_path / root / "lab1"
        lab.mkdir(parents=True)
        (lab / "01.cu").write_text("__global__ void k() {}\n")
        (lab / "02.cu").write_text("__global__ void k() {}\n")
        monkeypatch.setattr(paths, "ROOT", tmp_path / root)
        monkeypatch.setattr(paths, "BUILD", tmp_path / root / ".build")
        for name in ("01", "02"):
            unit = BuildUnit("lab1/x", (lab / f"{name}.cu",), "lab1", "x.student", include_dirs=(lab,))
            keys[root, name] = build._plan(unit, "sm_90", "nvcc 13.0", Path("nvcc")).key
    assert keys["a", "01"] == keys["b", "01"] and keys["a", "02"] == keys["b", "02"]
    assert keys["a", "01"] != keys["a", "02"]  # the same content at another place


@pytest.mark.skipif(not _have_nvcc(), reason="nvcc not installed: install the CUDA toolkit to compile kernels")
def test_a_unit_of_several_files_links_into_one_library(tmp_path, monkeypatch):
    """Each file is its own translation unit: course.h in both must link (course_error_name is
    weak), a kernel in one is launched from the other, and a .cpp goes to the host compiler."""
    monkeypatch.setattr(paths, "BUILD", tmp_path / "build")
    (tmp_path / "shared.h").write_text("#pragma once\nvoid launch_fill(float* x, float v);\n")
    kernel = tmp_path / "a.cu"
    kernel.write_text(
        '#include "course.h"\n#include "shared.h"\n__global__ void fill(float* x, float v) { x[threadIdx.x] = v; }\n'
        "void launch_fill(float* x, float v) { fill<<<1, 32>>>(x, v); }\n"
    )
    host = tmp_path / "b.cpp"
    host.write_text(
        '#include "course.h"\n#include "shared.h"\n'
        "COURSE_API cudaError_t run(float* x) { launch_fill(x, SCALE * 1.f); return cudaGetLastError(); }\n"
    )
    unit = BuildUnit("t/1", (kernel, host), "t", "a.student", flags=("-DSCALE=2",), include_dirs=(tmp_path,))
    r = build.build_all([unit], arch="sm_90")[unit]
    assert r.ok, r.log
    assert r.lib is not None and r.lib.name.startswith("a.student.") and r.lib.parent == tmp_path / "build" / "t"
    assert [k.kernel for k in r.kernels] == ["fill(float*, float)"] or not shutil.which("c++filt")
    assert r.facts is not None and str(tmp_path / "shared.h") in r.facts.headers
    if shutil.which("nm"):
        symbols = subprocess.run(["nm", "-D", "--defined-only", str(r.lib)], capture_output=True, text=True).stdout
        assert "course_error_name" in symbols and " run" in symbols
    cached = build.build_all([unit], arch="sm_90")[unit]
    assert cached.cached and cached.lib == r.lib and cached.facts == r.facts and cached.kernels == r.kernels
    assert not list(r.lib.parent.glob("*.work*")), "the work folder goes once the build is done"


@pytest.mark.skipif(not _have_nvcc(), reason="nvcc not installed: install the CUDA toolkit to compile kernels")
@pytest.mark.parametrize(
    ("where", "mistake"),
    [
        ("a.cu", "__global__ void fill(float* x, float v) { x[threadIdx.x] = w; }"),  # device code
        ("a.cu", "void launch_fill(float* x, float v) { fill<<<1, 32>>>(x, v, 3); }"),  # host code of a .cu
        ("a.cu", "template <class T> T twice(T v) { return v.size(); }\nint use() { return twice(2); }"),  # an instance
        ("b.cpp", "int broken() { return undeclared; }"),  # a .cpp
    ],
)
def test_a_check_only_build_catches_errors_in_host_and_device_code(tmp_path, monkeypatch, where, mistake):
    """BuildUnit.check_only (the course's check that each broken variant compiles) runs nvcc's front
    end alone: it must still refuse what a full build refuses, in host code as in device code."""
    monkeypatch.setattr(paths, "BUILD", tmp_path / "build")
    kernel, host = tmp_path / "a.cu", tmp_path / "b.cpp"
    good = {
        "a.cu": '#include "course.h"\n__global__ void fill(float* x, float v) { x[threadIdx.x] = v; }\n'
        "void launch_fill(float* x, float v) { fill<<<1, 32>>>(x, v); }\n",
        "b.cpp": '#include "course.h"\nvoid launch_fill(float* x, float v);\n'
        "COURSE_API cudaError_t run(float* x) { launch_fill(x, 1.f); return cudaGetLastError(); }\n",
    }
    for name, text in good.items():
        (tmp_path / name).write_text(text)
    unit = BuildUnit("t/1", (kernel, host), "t", "a.variant", check_only=True, facts=False)
    ok = build.build_all([unit], arch="sm_90")[unit]
    assert ok.ok and ok.lib is not None and ok.lib.suffix == ".ok", ok.log
    (tmp_path / where).write_text(good[where] + mistake + "\n")
    bad = build.build_all([unit], arch="sm_90")[unit]
    assert not bad.ok and bad.verdict == Verdict.COMPILE_ERROR and "error" in bad.log, bad.log


@pytest.mark.skipif(not _have_nvcc(), reason="nvcc not installed: install the CUDA toolkit to compile kernels")
def test_a_bare_path_is_still_one_file_on_its_own(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "BUILD", tmp_path / "build")
    src = tmp_path / "solutions" / "01_x.cu"
    src.parent.mkdir()
    src.write_text('#include "course.h"\nCOURSE_API cudaError_t f() { return cudaSuccess; }\n')
    r = build.build_all([src], arch="sm_90")[src]
    assert r.ok and r.lib is not None and r.lib.parent == tmp_path / "build" / tmp_path.name
    assert r.lib.name.startswith("01_x.sol.") and r.verdict == Verdict.COMPILE_ERROR  # what a failure would mean
    assert Path(str(r.lib)[: -len(".so")] + ".json").exists() and Path(str(r.lib)[: -len(".so")] + ".log").exists()


@pytest.mark.skipif(not _have_nvcc(), reason="nvcc not installed: install the CUDA toolkit to compile kernels")
def test_racecheck_gets_a_build_whose_copies_land_at_their_issue(tmp_path, monkeypatch):
    """racecheck counts a cp.async's write at its wait: a unit that reads course_mma.h is rebuilt for
    it with COURSE_SYNC_COPIES, where cp_async_16 is a plain store (no cp.async in its PTX); a unit
    without the header keeps its own library."""
    from grader.parent import runner

    monkeypatch.setattr(paths, "BUILD", tmp_path / "build")
    src = tmp_path / "k.cu"
    src.write_text(
        '#include "course.h"\n#include "course_mma.h"\n'
        "__global__ void k(const float4* x, float* y) {\n"
        "    __shared__ float4 s[32];\n"
        "    cp_async_16(&s[threadIdx.x], &x[threadIdx.x], 16);\n"
        "    cp_async_commit();\n    cp_async_wait<0>();\n    __syncthreads();\n"
        "    y[threadIdx.x] = s[31 - threadIdx.x].x;\n}\n"
        "COURSE_API cudaError_t run(const float4* x, float* y) { k<<<1, 32>>>(x, y); return cudaGetLastError(); }\n"
    )
    plain = tmp_path / "plain.cu"
    plain.write_text('#include "course.h"\n__global__ void k(float* x) { x[threadIdx.x] = 1.f; }\n')
    nvcc = str(toolchain.find_nvcc())
    inc = ["-I", str(paths.ROOT / "grader" / "include"), "-arch=sm_90", "-ptx", "-o", "-"]
    ptx = {
        sync: subprocess.run(
            [nvcc, *inc, *(["-DCOURSE_SYNC_COPIES"] if sync else []), str(src)], capture_output=True, text=True
        )
        for sync in (False, True)
    }
    assert ptx[False].returncode == 0 and "cp.async.cg.shared.global" in ptx[False].stdout, ptx[False].stderr
    assert ptx[True].returncode == 0 and "cp.async.cg" not in ptx[True].stdout and "st.shared" in ptx[True].stdout

    opts = runner.Options()
    for path, rebuilt in ((src, True), (plain, False)):
        unit = BuildUnit("t/1", (path,), "t", f"{path.stem}.student", include_dirs=(paths.ROOT / "grader" / "include",))
        built = build.build_all([unit], arch="sm_90")[unit]
        assert built.ok, built.log
        lib = runner._sync_copies_lib(built, opts)
        assert (lib is not None) == rebuilt
        if lib:
            assert ".sync." in lib and lib != str(built.lib)


@pytest.mark.skipif(not _have_nvcc(), reason="nvcc not installed: install the CUDA toolkit to compile kernels")
def test_shared_library_links_the_libraries_it_is_given(tmp_path, monkeypatch):
    """Code outside the grader (lab 7's training step builds task 03's cuBLASLt file into its own
    library) names the CUDA libraries it links as a CudaTask does: the library then needs them
    (DT_NEEDED), they are part of the build's key, and an unknown name is refused."""
    from grader.build import BuildError, shared_library

    monkeypatch.setattr(paths, "BUILD", tmp_path / "build")
    src = tmp_path / "lt.cu"
    src.write_text(
        '#include <cublasLt.h>\n#include "course.h"\n'
        "COURSE_API int make_handle() {\n    cublasLtHandle_t h = nullptr;\n"
        "    if (cublasLtCreate(&h) != CUBLAS_STATUS_SUCCESS) return 1;\n"
        "    return cublasLtDestroy(h) == CUBLAS_STATUS_SUCCESS ? 0 : 2;\n}\n"
    )
    try:
        linked = shared_library("lt", [src], group="t", stem="lt", libraries=("cublasLt",))
    except BuildError as e:
        if "cannot build" in str(e):  # no cuBLASLt on this machine: an environment, not this test
            pytest.skip(str(e))
        raise
    assert linked.is_file()
    if shutil.which("readelf"):
        needed = subprocess.run(["readelf", "-d", str(linked)], capture_output=True, text=True).stdout
        assert "libcublasLt" in needed, needed
    # without the name, the library's headers are not found where a wheel holds them, or the .so
    # builds without needing it: either way another build, under another key
    try:
        bare = shared_library("lt", [src], group="t", stem="lt")
    except BuildError as e:
        assert "cublasLt.h" in str(e), str(e)
    else:
        assert bare != linked, "the libraries are part of the build's key"
    with pytest.raises(BuildError, match="unknown library"):
        shared_library("lt", [src], group="t", stem="lt", libraries=("cublasXt",))


def test_a_libraries_error_code_in_words(monkeypatch):
    """cuda_error_string: the runtime's words where cuda-python knows the code, the number always."""
    import sys
    import types

    from grader.build import cuda_error_string

    class Code(int):
        pass

    runtime = types.SimpleNamespace(
        cudaError_t=Code, cudaGetErrorString=lambda code: (0, b"invalid argument") if code == 1 else 1 / 0
    )
    cuda = types.ModuleType("cuda")
    bindings = types.ModuleType("cuda.bindings")
    bindings.runtime = runtime  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cuda", cuda)
    monkeypatch.setitem(sys.modules, "cuda.bindings", bindings)
    monkeypatch.setitem(sys.modules, "cuda.bindings.runtime", runtime)
    assert cuda_error_string(1) == "invalid argument (cudaError 1)"
    assert cuda_error_string(999) == "cudaError 999"


@pytest.mark.skipif(not _have_nvcc(), reason="nvcc not installed: install the CUDA toolkit to compile kernels")
def test_a_staged_library_is_built_once_for_the_same_files(tmp_path, monkeypatch):
    """A Python task's packages are staged in a new folder for every grading run (STAGE_ENV): the
    same kernel files staged twice find one library, an edited header another, and a compile error
    names the staged file, not the settled copy the build compiled."""
    from grader.build import STAGE_ENV, BuildError, shared_library

    monkeypatch.setattr(paths, "BUILD", tmp_path / "build")

    def stage(k: int, header: str, body: str = "return SCALE * x;") -> tuple[Path, Path]:
        root = tmp_path / f"stage-{k}"
        (root / "pkg" / "kernels").mkdir(parents=True)
        (root / "pkg" / "kernels" / "k.h").write_text(header)
        src = root / "pkg" / "kernels" / "k.cu"
        src.write_text(f'#include "pkg/kernels/k.h"\nextern "C" int scaled(int x) {{ {body} }}\n')
        return root, src

    def build(root: Path, src: Path) -> Path:
        monkeypatch.setenv(STAGE_ENV, str(root))
        return shared_library("k", [src], group="t", stem="k", include_dirs=[root])

    first, again, edited = stage(1, "#define SCALE 2\n"), stage(2, "#define SCALE 2\n"), stage(3, "#define SCALE 3\n")
    lib = build(*first)
    assert build(*again) == lib
    assert build(*edited) != lib
    broken = stage(4, "#define SCALE 2\n", body="return SCALE * y;")
    with pytest.raises(BuildError) as err:
        build(*broken)
    assert str(broken[1]) in str(err.value) and "settled" not in str(err.value), str(err.value)

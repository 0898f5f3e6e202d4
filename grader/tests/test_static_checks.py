"""The rules: source rules judge the text before the build; NO_LIBRARIES, uses_shared_memory and
uses_syncthreads judge what the build compiled (headers read, libraries linked, per-kernel shared
memory and barriers), whatever the spelling."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from grader import paths, toolchain
from grader.build import packages
from grader.build.nvcc import BuildFacts, BuildResult, BuildUnit, KernelFacts, build_all
from grader.parent.static_checks import check_build, check_source
from grader.records import Verdict
from grader.tasks import catalogue
from grader.tasks.rules import NO_LIBRARIES, never_executes, uses_shared_memory, uses_syncthreads
from grader.tasks.spec import CudaTask, Rule


def task(*rules: Rule) -> CudaTask:
    return CudaTask(
        lab="lab1",
        number="09",
        title="t",
        sources=["09_t.cu"],
        entries=[],
        cases=[],
        make_inputs=lambda p, r: {},
        rules=list(rules),
    )


def built(facts: BuildFacts) -> BuildResult:
    return BuildResult(Path("f.cu"), True, Path("f.so"), facts=facts)


def kernel(name: str, smem: int = 0, barriers: int = 0, ptx_shared: bool = False) -> KernelFacts:
    return KernelFacts(name, "f.cu", smem, barriers, ptx_shared or smem > 0, barriers > 0)


def judge(rule: Rule, facts: BuildFacts) -> tuple[Verdict | None, str]:
    out = check_build(task(rule), built(facts), {})
    return out.verdict, out.message


# --- source rules, before the build -------------------------------------------------------------


def test_a_source_rule_still_judges_the_text():
    malloc = Rule("require", r"cudaMalloc\s*\(", "allocate with cudaMalloc")
    out = check_source(task(malloc), "void f() { /* cudaMalloc( */ }", "f.cu")
    assert out.verdict == Verdict.RULE and "allocate with cudaMalloc" in out.message
    assert check_source(task(malloc), "void f() { cudaMalloc(&p, 4); }", "f.cu").verdict is None


def test_a_rule_that_reads_strings_sees_inline_ptx_but_not_comments():
    fma = Rule("require", r"asm\s*\(\s*\"fma\.rn\.f32", "fma as inline PTX", strings=True)
    asm = 'float f(float a) { float d; asm("fma.rn.f32 %0, %1, %1, %1;" : "=f"(d) : "f"(a)); return d; }'
    assert check_source(task(fma), asm, "f.cu").verdict is None
    commented = '// asm("fma.rn.f32 %0, %1, %1, %1;")\nfloat f(float a) { return a * a + a; }'
    assert check_source(task(fma), commented, "f.cu").verdict == Verdict.RULE
    plain = Rule("require", r"asm\s*\(\s*\"fma\.rn\.f32", "fma as inline PTX")  # strings blanked
    assert check_source(task(plain), asm, "f.cu").verdict == Verdict.RULE


def test_the_compiled_rules_leave_the_text_alone():
    text = "#include <cublas_v2.h>\n__global__ void k() {}"
    for rule in (NO_LIBRARIES, uses_shared_memory("x"), uses_syncthreads("x")):
        assert check_source(task(rule), text, "f.cu").verdict is None


def test_untouched_skeleton_is_not_started_before_rules_apply():
    src = "// TODO(lab1/09) begin: x\n// TODO(lab1/09) end\n"
    assert check_source(task(uses_shared_memory("x")), src, "f.cu").verdict == Verdict.NOT_STARTED


def test_a_forced_run_of_an_untouched_skeleton_is_not_judged_by_the_build_rules(tmp_path):
    skeleton = tmp_path / "09_t.cu"
    skeleton.write_text("// TODO(lab1/09) begin: x\n// TODO(lab1/09) end\n__global__ void k() {}\n")
    facts = BuildFacts(kernels=[kernel("k()")])
    out = check_build(task(uses_shared_memory("x")), built(facts), {"09_t.cu": skeleton})
    assert out.verdict is None


# --- the library rule on the build's record ----------------------------------------------------


def test_library_headers_are_judged_by_their_path_below_the_repository():
    assert packages.library_of_header("/usr/local/cuda/targets/x86_64-linux/include/cccl/thrust/sort.h") == "thrust"
    assert packages.library_of_header("/opt/site-packages/nvidia/cu13/include/cublas_v2.h") == "cublas"
    assert packages.library_of_header("/usr/include/x86_64-linux-gnu/cudnn_v9.h") == "cudnn"
    assert packages.library_of_header("/usr/local/cuda/include/cccl/cuda/std/atomic") is None
    assert packages.library_of_header("/usr/local/cuda/include/cuda_runtime.h") is None
    # a repository cloned into a folder named like a library is not a library
    assert (
        packages.library_of_header(Path("/home/me/torch/course/lab1/helpers.h"), Path("/home/me/torch/course")) is None
    )


def test_a_library_header_is_a_rule_violation_naming_the_include_line():
    facts = BuildFacts(library_headers={"/cuda/include/cccl/thrust/transform.h": "f.cu:3"})
    verdict, message = judge(NO_LIBRARIES, facts)
    assert verdict == Verdict.RULE and message.startswith("f.cu:3:") and "thrust/transform.h" in message


def test_a_linked_library_or_its_symbols_are_a_rule_violation():
    verdict, message = judge(NO_LIBRARIES, BuildFacts(needed=["libc.so.6", "libcublas.so.13"]))
    assert verdict == Verdict.RULE and "libcublas.so.13" in message
    verdict, message = judge(NO_LIBRARIES, BuildFacts(needed=["libc.so.6"], library_symbols=["cublasSgemm_v2"]))
    assert verdict == Verdict.RULE and "cublasSgemm_v2" in message
    assert judge(NO_LIBRARIES, BuildFacts(needed=["libc.so.6"], library_symbols=[]))[0] is None


def test_a_library_header_missing_from_this_machine_is_still_the_library_rule():
    log = "/x/f.cu:2:10: fatal error: cublas_v2.h: No such file or directory\ncompilation terminated.\n"
    out = check_build(task(NO_LIBRARIES), BuildResult(Path("f.cu"), False, None, log), {})
    assert out.verdict == Verdict.RULE and "f.cu:2" in out.message and "cublas_v2.h" in out.message
    other = log.replace("cublas_v2.h", "my_helpers.h")
    assert check_build(task(NO_LIBRARIES), BuildResult(Path("f.cu"), False, None, other), {}).verdict is None


# --- the per-kernel rules on the build's record ---------------------------------------------------

HISTOGRAM = BuildFacts(
    kernels=[kernel("histogram_global_kernel(int)"), kernel("histogram_shared_kernel(int)", 1024, 1)]
)


def test_shared_memory_unused_is_named_with_its_kernel():
    verdict, message = judge(uses_shared_memory("stage a tile"), BuildFacts(kernels=[kernel("swap(float*)", 0, 1)]))
    assert (
        verdict == Verdict.RULE and "`swap(float*)`" in message and "0 bytes" in message and "stage a tile" in message
    )


def test_dynamic_shared_memory_counts_though_ptxas_reports_none():
    facts = BuildFacts(kernels=[kernel("dyn(float*)", 0, 1, ptx_shared=True)])
    assert judge(uses_shared_memory("x"), facts)[0] is None


def test_without_a_pattern_one_kernel_is_enough_with_one_every_matching_kernel_must():
    assert judge(uses_shared_memory("x"), HISTOGRAM)[0] is None
    assert judge(uses_shared_memory("x", kernels="histogram_shared"), HISTOGRAM)[0] is None
    verdict, message = judge(uses_shared_memory("x", kernels="histogram_"), HISTOGRAM)
    assert verdict == Verdict.RULE and "histogram_global_kernel" in message
    verdict, message = judge(uses_shared_memory("x", kernels="tiled"), HISTOGRAM)
    assert verdict == Verdict.RULE and "no kernel named like `tiled`" in message


def test_a_barrier_is_judged_per_kernel_too():
    assert judge(uses_syncthreads("x"), HISTOGRAM)[0] is None
    verdict, message = judge(uses_syncthreads("sync", kernels="global"), HISTOGRAM)
    assert verdict == Verdict.RULE and "histogram_global_kernel" in message and "0 barriers" in message
    assert judge(uses_syncthreads("x"), BuildFacts())[0] == Verdict.RULE  # no kernel at all


# --- on real builds -------------------------------------------------------------------------------


def _nvcc() -> None:
    try:
        toolchain.find_nvcc()
    except toolchain.ToolchainError as e:
        pytest.skip(str(e))


def _build_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> tuple[Path, BuildResult]:
    monkeypatch.setattr(paths, "BUILD", tmp_path / "build")
    src = tmp_path / "09_t.cu"
    src.write_text('#include "course.h"\n' + text)
    result = build_all([src], arch="sm_90")[src]
    assert result.ok, result.error
    return src, result


def test_a_library_behind_a_macro_include_and_a_namespace_alias_is_caught(tmp_path, monkeypatch):
    _nvcc()
    src, result = _build_text(
        tmp_path,
        monkeypatch,
        "#define HDR <thrust/fill.h>\n#include HDR\n#include <thrust/execution_policy.h>\nnamespace lib = thrust;\n"
        "COURSE_API cudaError_t f(float* p, int n) { lib::fill(lib::device, p, p + n, 1.f); return cudaSuccess; }\n",
    )
    out = check_build(task(NO_LIBRARIES), result, {"09_t.cu": src})
    assert out.verdict == Verdict.RULE, out.message
    assert "09_t.cu:3:" in out.message and "`#include HDR`" in out.message and "thrust/fill.h" in out.message


def test_a_mention_in_a_comment_or_a_string_is_no_library(tmp_path, monkeypatch):
    _nvcc()
    src, result = _build_text(
        tmp_path,
        monkeypatch,
        '// unlike thrust::sort, we...\n/* #include <cublas_v2.h> cublasSgemm( */\nconst char* s = "<cub/cub.cuh>";\n'
        "__global__ void k(float* x) { x[threadIdx.x] = 1.f; }\n",
    )
    assert check_build(task(NO_LIBRARIES), result, {"09_t.cu": src}).verdict is None


def test_an_unused_shared_array_and_a_bare_barrier_are_no_shared_memory(tmp_path, monkeypatch):
    _nvcc()
    src, result = _build_text(
        tmp_path,
        monkeypatch,
        "__global__ void swap(const float* in, float* out, int n) {\n"
        "    __shared__ float tile[512];\n    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "    __syncthreads();\n    if (i + 1 < n) out[i] = in[i ^ 1];\n}\n"
        "__global__ void dyn(const float* in, float* out, int n) {\n    extern __shared__ float s[];\n"
        "    int i = threadIdx.x;\n    s[i] = in[i];\n    __syncthreads();\n    out[i] = s[n - 1 - i];\n}\n",
    )
    sources = {"09_t.cu": src}
    out = check_build(task(uses_shared_memory("use a tile", kernels="swap")), result, sources)
    assert out.verdict == Verdict.RULE and "swap(float const*, float*, int)" in out.message, out.message
    assert "0 bytes of shared memory" in out.message
    assert check_build(task(uses_shared_memory("x", kernels="dyn")), result, sources).verdict is None
    assert check_build(task(uses_syncthreads("x", kernels="swap|dyn")), result, sources).verdict is None


def test_the_lab1_solutions_own_includes_break_no_rule():
    """CUDA 13's headers for plain lab 1 code (course.h, <cmath>, <algorithm>, <cstdint>) include
    nothing the library rule names (cuda/std/... is CCCL's libcu++, allowed)."""
    _nvcc()
    tasks = [t for t in catalogue.all_tasks(["lab1"]) if isinstance(t, CudaTask)]
    sources = {t.task_id: {rel: paths.solution_source(t.lab_dir(), rel) for rel in t.sources} for t in tasks}
    if not all(p.exists() for s in sources.values() for p in s.values()):
        pytest.skip("no reference solutions here (a student release)")
    units = {t.task_id: BuildUnit.for_task(t, sources[t.task_id], "solution") for t in tasks}
    results = build_all(list(units.values()))
    for t in tasks:
        r = results[units[t.task_id]]
        assert r.ok and r.facts is not None, r.error
        assert not r.facts.library_headers and not [h for h in r.facts.headers if packages.library_of_header(h)]
        out = check_build(t, r, sources[t.task_id])
        assert out.verdict is None, f"{t.task_id}: {out.message}"


# --- rules on the SASS and on what an extension's object calls -----------------------------------


def sass_kernel(name: str, *opcodes: str) -> KernelFacts:
    k = kernel(name)
    k.sass = list(opcodes)
    return k


def test_never_executes_names_the_kernel_and_the_instructions_it_forbids():
    rule = never_executes(r"BSSY|BSYNC", "no divergence")
    clean = BuildFacts(kernels=[sass_kernel("uniform(float*)", "FFMA", "BRA", "EXIT")])
    assert judge(rule, clean)[0] is None
    branchy = BuildFacts(kernels=[sass_kernel("uniform(float*)", "BSSY", "BSYNC", "FFMA")])
    verdict, message = judge(rule, branchy)
    assert verdict == Verdict.RULE and "uniform" in message and "BSSY, BSYNC" in message and "no divergence" in message


def test_never_executes_without_cuobjdump_leaves_the_judgement_to_the_observed_call():
    assert judge(never_executes("BSSY", "x"), BuildFacts(kernels=[kernel("k(float*)")]))[0] is None
    assert never_executes("BSSY", "x").observed  # type: ignore[attr-defined]


def test_an_extension_object_calling_aten_through_an_alias_is_caught(tmp_path, monkeypatch):
    """never_references reads what the compiled object leaves undefined: a namespace alias and an
    include macro change nothing there."""
    from grader.child.torch_ext import check_references
    from grader.records import CheckFailure
    from grader.tasks.rules import never_references

    if not shutil.which("g++") or not shutil.which("readelf"):
        pytest.skip("needs g++ and readelf")
    src = tmp_path / "t.cpp"
    src.write_text(
        "namespace at { namespace _ops { struct addmm { static int call(int); }; } }\n"
        "namespace lib = at;\nint f(int x) { return lib::_ops::addmm::call(x); }\n"
    )
    subprocess.run(["g++", "-c", str(src), "-o", str(tmp_path / "t.o")], check=True)
    ext = SimpleNamespace(rules=[never_references(r"at::_ops::\w*mm", "the products are yours")])
    with pytest.raises(CheckFailure) as failure:
        check_references(ext, [src], tmp_path / "ext.so")  # type: ignore[arg-type]
    assert failure.value.verdict == Verdict.RULE
    assert "t.cpp, as compiled, calls at::_ops::addmm::call" in failure.value.message
    ext = SimpleNamespace(rules=[never_references(r"cblas_", "x")])
    check_references(ext, [src], tmp_path / "ext.so")  # type: ignore[arg-type]

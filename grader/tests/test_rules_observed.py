"""Rules judge what was compiled and what ran, not how the source is spelled.

On the build (any machine with nvcc): the calls each C entry point's code reaches, the inline PTX
and the SASS of the kernels it reaches, and no run-time symbol lookup (dlsym) in the student's
objects. On a GPU: one observed call per entry point (torch.profiler), judged on the kernels it
launched, the CUDA calls it made and the copies it did. The fixture task fixtures/91
(grader/tests/fixtures/rules) has a variant for each; the parsers and judges are tested on
canned inputs, without a GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from grader import toolchain
from grader.build import objects
from grader.build.nvcc import BuildFacts, BuildResult, KernelFacts
from grader.build.objects import EntryReach
from grader.build.ptxas import parse_ptx
from grader.child import observe
from grader.child.observe import Observation
from grader.parent import runner
from grader.parent.static_checks import check_build
from grader.records import Verdict
from grader.tasks import catalogue
from grader.tasks.rules import (
    allows_symbol_lookup,
    calls,
    calls_each_time,
    launches,
    launches_kernel,
    library_does_the_product,
    never_calls,
    no_library,
    no_runtime_calls,
    pinned_copies,
    replays_graph,
    uses_cuda_cores,
    uses_inline_ptx,
    uses_tensor_cores,
)
from grader.tasks.spec import CudaTask, Rule

FIXTURE = Path(__file__).parent / "fixtures" / "rules"
SPEC = FIXTURE / "tests" / "test_91_rules.py"
OPTS = runner.Options(timing="off", timeout=30)
# variant -> (verdict, words of its message); the first three are decided by the build
EXPECTED = {
    "pass": (Verdict.PASS, ""),
    "dlsym": (Verdict.RULE, "dlsym"),
    "dead_asm": (Verdict.RULE, "`mul.rn.f32` in an asm statement"),
    "dead_graph": (Verdict.RULE, "`scale_graph` never calls cudaGraphLaunch"),
    "two_kernels": (Verdict.RULE, "the call launched 2 kernels: copy_kernel, scale_kernel; the task asks for one"),
    "first_size_only": (Verdict.RULE, "the call launched no CUDA graph"),
}
AT_BUILD = ("dlsym", "dead_asm", "dead_graph")


def task(*rules: Rule, entries: tuple[str, ...] = ("f",)) -> CudaTask:
    from grader.tasks.spec import Entry

    return CudaTask(
        lab="lab1",
        number="09",
        title="t",
        sources=["09_t.cu"],
        entries=[Entry(e, [], reference=lambda v: {}) for e in entries],
        cases=[],
        make_inputs=lambda p, r: {},
        rules=list(rules),
    )


def kernel(name: str, asm: tuple[str, ...] = (), sass: tuple[str, ...] | None = ("FFMA", "EXIT")) -> KernelFacts:
    return KernelFacts(
        f"{name}(float*, int)", "f.cu", 0, 0, False, False, f"_Z{len(name)}{name}Pfi", list(asm), sass and list(sass)
    )


def judge(rule: Rule, facts: BuildFacts, entries: tuple[str, ...] = ("f",)) -> tuple[Verdict | None, str]:
    out = check_build(task(rule, entries=entries), BuildResult(Path("f.cu"), True, Path("f.so"), facts=facts), {})
    return out.verdict, out.message


# --- the parsers, on canned tool output -------------------------------------------------------

READELF = """
Section Headers:
  [Nr] Name              Type            Address          Off    Size   ES Flg Lk Inf Al
  [ 0]                   NULL            0000000000000000 000000 000000 00      0   0  0
  [ 1] .text.entry       PROGBITS        0000000000000000 000040 000010 00  AX  0   0 16
  [ 2] .rela.text.entry  RELA            0000000000000000 000400 000030 18   I 9   1  8
  [ 3] .text._ZL6helperv PROGBITS        0000000000000000 000050 000010 00  AX  0   0 16
  [ 4] .rela.text._ZL6helperv RELA       0000000000000000 000430 000030 18   I 9   3  8
  [ 5] .text.unused      PROGBITS        0000000000000000 000060 000010 00  AX  0   0 16
  [ 6] .rela.text.unused RELA            0000000000000000 000460 000030 18   I 9   5  8
  [ 7] .text._Z1kPf      PROGBITS        0000000000000000 000070 000010 00  AX  0   0 16

Relocation section '.rela.text.entry' at offset 0x400 contains 2 entries:
    Offset             Info             Type               Symbol's Value  Symbol's Name + Addend
0000000000000004  0000000300000004 R_X86_64_PLT32         0000000000000000 .text._ZL6helperv - 4
000000000000000c  0000000400000004 R_X86_64_PLT32         0000000000000000 cudaGetLastError - 4

Relocation section '.rela.text._ZL6helperv' at offset 0x430 contains 2 entries:
    Offset             Info             Type               Symbol's Value  Symbol's Name + Addend
0000000000000004  0000000500000004 R_X86_64_PLT32         0000000000000000 cudaGraphLaunch - 4
0000000000000008  0000000600000004 R_X86_64_PLT32         0000000000000000 _Z1kPf - 4

Relocation section '.rela.text.unused' at offset 0x460 contains 1 entry:
    Offset             Info             Type               Symbol's Value  Symbol's Name + Addend
0000000000000004  0000000700000004 R_X86_64_PLT32         0000000000000000 dlsym - 4

Symbol table '.symtab' contains 9 entries:
   Num:    Value          Size Type    Bind   Vis      Ndx Name
     0: 0000000000000000     0 NOTYPE  LOCAL  DEFAULT  UND
     1: 0000000000000000     0 FILE    LOCAL  DEFAULT  ABS f.cu
     2: 0000000000000000    16 FUNC    LOCAL  DEFAULT    3 _ZL6helperv
     3: 0000000000000000    16 FUNC    GLOBAL DEFAULT    1 entry
     4: 0000000000000000     0 NOTYPE  GLOBAL DEFAULT  UND cudaGetLastError
     5: 0000000000000000     0 NOTYPE  GLOBAL DEFAULT  UND cudaGraphLaunch
     6: 0000000000000000    16 FUNC    GLOBAL DEFAULT    7 _Z1kPf
     7: 0000000000000000     0 NOTYPE  GLOBAL DEFAULT  UND dlsym
     8: 0000000000000000    16 FUNC    GLOBAL DEFAULT    5 unused
"""


def test_an_entry_point_reaches_what_its_code_refers_to_and_no_more():
    facts = objects.analyse([("f.cu", objects.parse_readelf(READELF))], {"_Z1kPf"})
    assert facts.undefined == {"f.cu": ["cudaGetLastError", "cudaGraphLaunch", "dlsym"]}
    # through the static helper (named by its section symbol) to the graph launch and the kernel;
    # `unused`, another C function, is an entry point of its own
    assert facts.reach["entry"] == EntryReach(["cudaGetLastError", "cudaGraphLaunch"], ["_Z1kPf"])
    assert facts.reach["unused"] == EntryReach(["dlsym"], [])


PTX = """
.func  (.param .b32 func_retval0) _Z6helperf(
\t.param .b32 _Z6helperf_param_0
)
{
\t// begin inline asm
\tfma.rn.f32 %f1, %f2, %f2, %f2;
\t// end inline asm
\tret;
}
.visible .entry _Z1kPf(
\t.param .u64 _Z1kPf_param_0
)
{
\t// begin inline asm
\tmov.u32 %r1, %laneid;
\t// end inline asm
\tcall.uni (retval0),
\t_Z6helperf,
\t(param0);
\tret;
}
.visible .entry _Z6unusedPf(
\t.param .u64 _Z6unusedPf_param_0
)
{
\tfma.rn.f32 %f1, %f2, %f2, %f2;
\tret;
}
"""


def test_inline_ptx_is_read_per_kernel_with_the_functions_it_calls():
    facts = parse_ptx(PTX)
    # the callee's asm counts (nvcc puts a call's target on the next line); fma.rn.f32 outside an
    # asm statement (fmaf, or a * b + c contracted) is not inline PTX
    assert facts["_Z1kPf"].inline_asm == ("mov.u32 %laneid", "fma.rn.f32")
    assert facts["_Z6unusedPf"].inline_asm == ()


SASS = """
Fatbin elf code:
================
arch = sm_90

\tcode for sm_90
\t\tFunction : _Z4wmmaPf
\t.headerflags\t@"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;             /* 0x00000a00ff017b82 */
        /*0090*/                   HMMA.16816.F32 R4, R8, R12, R4 ;   /* 0x0000000c0804723c */
        /*00a0*/               @P0 BRA 0x90 ;                         /* 0x000fc0000383ffff */
        /*00b0*/                   EXIT ;                             /* 0x000000000000794d */
\t\tFunction : _Z4simtPf
        /*0000*/                   FFMA R5, R0, R5, R7 ;              /* 0x0000000500057223 */
        /*0010*/                   EXIT ;                             /* 0x000000000000794d */
"""


def test_sass_opcodes_per_kernel_and_the_tensor_core_ones():
    ops = objects.parse_sass(SASS)
    assert ops["_Z4wmmaPf"] == ["BRA", "EXIT", "HMMA.16816.F32", "LDC"]
    assert objects.tensor_core_opcodes(ops["_Z4wmmaPf"]) == ["HMMA.16816.F32"]
    assert objects.tensor_core_opcodes(ops["_Z4simtPf"]) == []
    assert objects.tensor_core_opcodes(["HGMMA.64x128x16.F32.BF16", "IMAD", "UTCHMMA"]) == [
        "HGMMA.64x128x16.F32.BF16",
        "UTCHMMA",
    ]


# --- the rules on the build's facts -----------------------------------------------------------


def reach(calls_: list[str], kernels: list[str] | None = None) -> dict[str, EntryReach]:
    return {"f": EntryReach(calls_, kernels or [])}


def test_a_run_time_symbol_lookup_is_a_rule_violation_naming_it_and_the_object():
    facts = BuildFacts(undefined={"lab1/09_t.cu": ["cudaGetLastError", "dlsym"]})
    verdict, message = judge(never_calls("x", "x"), facts)
    assert verdict == Verdict.RULE and message.startswith("lab1/09_t.cu:") and "dlsym" in message
    for lookup in ("cuGetProcAddress_v2", "cudaGetDriverEntryPoint", "dlopen"):
        assert judge(never_calls("x", "x"), BuildFacts(undefined={"f.cu": [lookup]}))[0] == Verdict.RULE
    assert judge(allows_symbol_lookup("the lesson is dlopen"), facts)[0] is None
    assert judge(never_calls("x", "x"), BuildFacts(undefined={"f.cu": ["cudaMalloc"]}))[0] is None


def test_nvtx_loading_its_injection_library_is_no_lookup_of_the_students():
    """NVTX (which Thrust and CUB include too) dlopens the profiler's injection library."""
    nvtx = {"f.cu": {"dlsym": ["nvtxRangePushA_impl_init_v3"], "dlopen": ["nvtxMarkA_impl_init_v3"]}}
    headers = ["/usr/local/cuda/include/nvtx3/nvtxDetail/nvtxInit.h"]
    facts = BuildFacts(headers=headers, undefined={"f.cu": ["dlopen", "dlsym"]}, lookups=nvtx)
    assert judge(never_calls("x", "x"), facts)[0] is None
    facts.lookups = {"f.cu": {"dlsym": ["nvtxRangePushA_impl_init_v3", "scale"]}}
    verdict, message = judge(never_calls("x", "x"), facts)
    assert verdict == Verdict.RULE and "dlsym (in nvtxRangePushA_impl_init_v3, scale)" in message
    facts.headers, facts.lookups = [], nvtx  # named like NVTX without NVTX's headers: the student's own
    assert judge(never_calls("x", "x"), facts)[0] == Verdict.RULE


def test_a_call_counts_only_where_the_entry_point_reaches_it():
    rule = calls("cudaGraphLaunch", "replay the graph")
    assert judge(rule, BuildFacts(reach=reach(["cudaGraphLaunch_ptsz"])))[0] is None
    verdict, message = judge(
        rule, BuildFacts(reach=reach(["cudaLaunchKernel"]), undefined={"f.cu": ["cudaGraphLaunch"]})
    )
    assert verdict == Verdict.RULE and "`f` never calls cudaGraphLaunch" in message and "replay the graph" in message
    # no record of the reach (no readelf): every object's symbols stand in
    assert judge(rule, BuildFacts(undefined={"f.cu": ["cudaGraphLaunch"]}))[0] is None


def test_a_forbidden_call_or_library_is_judged_on_the_build():
    assert judge(never_calls(r"cudaStreamBeginCapture\w*", "no capture"), BuildFacts(reach=reach([])))[0] is None
    facts = BuildFacts(undefined={"f.cu": ["cudaStreamBeginCapture"]})
    assert judge(never_calls(r"cudaStreamBeginCapture\w*", "no capture"), facts)[0] == Verdict.RULE
    cublas = no_library(r"cublas\w*", "cuDNN's here")
    assert judge(cublas, BuildFacts(needed=["libcudnn.so.9"], library_symbols=["cudnnBackendExecute"]))[0] is None
    verdict, message = judge(cublas, BuildFacts(needed=["libcublas.so.13"]))
    assert verdict == Verdict.RULE and "libcublas.so.13" in message


def test_inline_ptx_and_tensor_cores_count_only_in_kernels_the_entry_point_reaches():
    used, dead = kernel("used", ("mov.u32 %laneid",)), kernel("dead", ("fma.rn.f32",), ("HMMA.16816.F32",))
    facts = BuildFacts(kernels=[used, dead], reach=reach([], [used.mangled]))
    verdict, message = judge(uses_inline_ptx(r"fma\.rn\.f32", "fma as PTX"), facts)
    assert verdict == Verdict.RULE and "mov.u32 %laneid" in message and "fma as PTX" in message
    assert judge(uses_inline_ptx(r"mov\.u32 %laneid", "lane"), facts)[0] is None
    verdict, message = judge(uses_tensor_cores("tensor cores"), facts)
    assert verdict == Verdict.RULE and "HMMA" in message
    facts.reach = reach([], [dead.mangled])
    assert judge(uses_tensor_cores("tensor cores"), facts)[0] is None
    assert judge(uses_cuda_cores("CUDA cores"), facts)[0] == Verdict.RULE
    # no cuobjdump at the build: the task process judges the kernels that ran
    blind = BuildFacts(kernels=[kernel("k", sass=None)], reach=reach([], ["_Z1kPfi"]))
    assert judge(uses_tensor_cores("tensor cores"), blind)[0] is None


def test_a_kernel_named_like_a_library_type_must_be_reached():
    gemm = kernel("cutlass::Kernel<cutlass::gemm::kernel::Gemm<int>>")
    facts = BuildFacts(kernels=[gemm], reach=reach([], []))
    assert judge(launches_kernel(r"cutlass::gemm::kernel::Gemm\w*<", "CUTLASS"), facts)[0] == Verdict.RULE
    facts.reach = reach([], [gemm.mangled])
    assert judge(launches_kernel(r"cutlass::gemm::kernel::Gemm\w*<", "CUTLASS"), facts)[0] is None


def test_rules_on_the_run_leave_the_build_alone():
    for rule in (launches(1, "x"), no_runtime_calls("cudaMalloc", "x"), library_does_the_product("x")):
        assert judge(rule, BuildFacts(reach=reach([])))[0] is None


# --- the observed call, judged ----------------------------------------------------------------


def facts_with(*kernels: KernelFacts) -> BuildFacts:
    return BuildFacts(kernels=list(kernels))


BIAS, SILU = kernel("bias_kernel"), kernel("silu_inplace_kernel")


def seen(kernels: list[str], api: list[str] = (), copies: list[str] = ()) -> Observation:  # type: ignore[assignment]
    return Observation("f", "n=1000", list(kernels), list(api), list(copies))


def test_profiler_events_are_sorted_into_kernels_copies_and_cuda_calls():
    assert observe.category("kernel", "scale_kernel(float const*, float*, int)", True) == "kernel"
    assert observe.category("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", True) == "gpu_memcpy"
    assert observe.category("cuda_sync", "Stream Wait Event", True) == ""
    assert observe.category("cuda_runtime", "cudaGraphLaunch", False) == "api"
    assert observe.category("cpu_op", "aten::copy_", False) == ""
    # a torch whose events carry no activity type: where it ran, and its name
    assert observe.category(None, "Event Sync", True) == ""
    assert observe.category(None, "Memset (Device)", True) == ""
    assert observe.category(None, "bias_kernel(float*, int)", True) == "kernel"
    assert observe.category(None, "cuLaunchKernel", False) == "api"
    assert observe.category(None, observe.WINDOW, False) == ""
    assert observe.category(None, observe.WINDOW, True) == ""
    assert observe.category("gpu_user_annotation", observe.WINDOW, True) == ""
    assert observe.api_name("cudaMemcpyAsync_ptsz") == "cudaMemcpyAsync"
    assert observe.api_name("cuLaunchKernel_v2") == "cuLaunchKernel"


def test_the_kernel_count_says_what_the_call_launched():
    rule = launches(1, "one fused kernel", "f")
    o = seen(["bias_kernel(float*, int)", "silu_inplace_kernel(float*, int)"], ["cudaLaunchKernel"] * 2)
    message = observe.judge(rule, o, facts_with(BIAS, SILU))
    assert message is not None
    assert "the call launched 2 kernels: bias_kernel, silu_inplace_kernel; the task asks for one" in message
    assert observe.judge(rule, seen(["bias_kernel(float*, int)"]), facts_with(BIAS)) is None


def test_a_graph_replay_launches_a_graph_and_nothing_beside_it():
    rule = replays_graph("replay", "f")
    facts = facts_with(BIAS)
    assert observe.judge(rule, seen(["bias_kernel(float*, int)"], ["cudaGraphLaunch"]), facts) is None
    direct = observe.judge(rule, seen(["bias_kernel(float*, int)"], ["cudaLaunchKernel"]), facts)
    assert direct and "launched no CUDA graph" in direct
    beside = observe.judge(rule, seen(["bias_kernel(float*, int)"] * 2, ["cudaGraphLaunch", "cudaLaunchKernel"]), facts)
    assert beside and "launched 1 kernels directly" in beside
    rebuilt = ["cudaStreamBeginCapture", "cudaLaunchKernel", "cudaStreamEndCapture", "cudaGraphInstantiate"]
    again = observe.judge(rule, seen(["bias_kernel(float*, int)"], [*rebuilt, "cudaGraphLaunch"]), facts)
    assert again and "rebuilt its graph" in again


def test_pinned_copies_and_runtime_calls_in_the_call():
    pinned = pinned_copies("pinned", "f")
    ok = ["Memcpy HtoD (Pinned -> Device)", "Memcpy DtoH (Device -> Pinned)", "Memcpy DtoD (Device -> Device)"]
    assert observe.judge(pinned, seen([], copies=ok), facts_with()) is None
    bad = observe.judge(pinned, seen([], copies=[*ok, "Memcpy HtoD (Pageable -> Device)"]), facts_with())
    assert bad and "1 of the call's 3 host-device copies moved pageable memory" in bad
    assert "copied nothing" in (observe.judge(pinned, seen([]), facts_with()) or "")
    host = no_runtime_calls(r"cuda(?:Malloc\w*|Free\w*|\w*Synchronize)", "no host work", "f")
    made = observe.judge(host, seen([], ["cudaMalloc", "cudaLaunchKernel", "cudaFree"]), facts_with())
    assert made and "cudaFree, cudaMalloc (2 calls)" in made
    async_copies = calls_each_time("cudaMemcpyAsync", "async", "f")
    assert observe.judge(async_copies, seen([], ["cudaMemcpyAsync"]), facts_with()) is None
    assert observe.judge(async_copies, seen([], ["cudaMemcpy"]), facts_with()) is not None


def test_a_kernel_is_the_students_when_their_library_holds_it():
    template = KernelFacts("void k<4>(float*)", "f.cu", 0, 0, False, False, "_Z1kILi4EEvPf")
    facts = facts_with(BIAS, template)
    assert observe.own_kernel(facts, "bias_kernel(float*, int)") is BIAS
    assert observe.own_kernel(facts, "bias_kernel") is BIAS  # a profiler that drops the parameters
    assert observe.own_kernel(facts, "void k<4>(float *)") is template
    assert observe.own_kernel(facts, "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32") is None
    product = library_does_the_product("cuBLAS does the product", "f")
    gemm = "sm90_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x64x8_stage3_warpsize1x2x1_ffma_aligna4_alignc4"
    assert observe.judge(product, seen(["bias_kernel(float*, int)", gemm]), facts) is None
    mine = observe.judge(product, seen(["bias_kernel(float*, int)"]), facts)
    assert mine and "all of them your own" in mine
    only = library_does_the_product("cuDNN alone", "f", only=True)
    beside = observe.judge(only, seen(["bias_kernel(float*, int)", gemm]), facts)
    assert beside and "your own bias_kernel ran beside the library's" in beside


def test_tensor_cores_and_inline_ptx_of_the_kernels_that_ran():
    wmma = kernel("wmma_kernel", ("mov.u32 %laneid",), ("HMMA.16816.F32", "EXIT"))
    simt = kernel("simt_kernel")
    facts = facts_with(wmma, simt)
    tc = uses_tensor_cores("tensor cores", "f")
    assert observe.judge(tc, seen(["wmma_kernel(float*, int)"]), facts) is None
    ran_simt = observe.judge(tc, seen(["simt_kernel(float*, int)"]), facts)
    assert ran_simt and "no kernel the call launched (simt_kernel)" in ran_simt
    assert observe.judge(uses_cuda_cores("CUDA cores", "f"), seen(["wmma_kernel(float*, int)"]), facts)
    asm = uses_inline_ptx(r"mov\.u32 %laneid", "lane", "f")
    assert observe.judge(asm, seen(["wmma_kernel(float*, int)"]), facts) is None
    assert observe.judge(asm, seen(["simt_kernel(float*, int)"]), facts) is not None


# --- the fixture task, built (and, on a GPU, run) -----------------------------------------------


def _need_nvcc() -> None:
    try:
        toolchain.find_nvcc()
    except toolchain.ToolchainError as e:
        pytest.skip(str(e))


def _grade(variant: str):
    t = catalogue.load_task(SPEC)
    override = (
        {} if variant == "pass" else {t.task_id: {"91_rules.cu": FIXTURE / "variants" / f"91_rules.{variant}.cu"}}
    )
    (result,) = runner.grade([t], OPTS, override)
    return result


@pytest.mark.parametrize("variant", AT_BUILD)
def test_the_build_catches_lookups_dead_asm_and_dead_graph_code_without_a_gpu(variant: str) -> None:
    _need_nvcc()
    verdict, words = EXPECTED[variant]
    r = _grade(variant)
    assert r.verdict == verdict and words in r.message, f"{variant}: {r.verdict}: {r.message}"


@pytest.mark.skipif(toolchain.has_gpu(), reason="checks the no-GPU path")
def test_without_a_gpu_the_reference_passes_the_build_rules_and_waits_for_one() -> None:
    _need_nvcc()
    r = _grade("pass")
    assert r.verdict == Verdict.SKIPPED, f"{r.verdict}: {r.message}"


@pytest.mark.gpu
@pytest.mark.parametrize("variant", sorted(EXPECTED))
def test_on_a_gpu_each_variant_gets_its_verdict_from_what_ran(variant: str) -> None:
    if not toolchain.has_gpu():
        pytest.skip("no NVIDIA GPU: the observed rules need one")
    verdict, words = EXPECTED[variant]
    r = _grade(variant)
    assert r.verdict == verdict and words in r.message, f"{variant}: {r.verdict}: {r.message}"
    if variant == "pass":
        said = [n for n in r.notes if n.startswith("observed on case")]
        assert said and "`scale`: launched 1 kernel: scale_kernel" in said[0], r.notes


# --- the observation's plumbing: which case, and "not checked" rather than a silent pass ------------


def fixture_task() -> CudaTask:
    t = catalogue.load_task(SPEC)
    assert isinstance(t, CudaTask)
    return t


def test_the_observed_case_is_the_timing_case_unless_the_cases_ran_it_first():
    from dataclasses import replace

    from grader.records import ChildJob

    t, job = fixture_task(), ChildJob(spec=str(SPEC), sources={})
    assert observe.observed_case(t, job).label == "n=1000"  # type: ignore[union-attr]
    # a graph built for the first call's size alone must not look like one built per size
    assert observe.observed_case(replace(t, timing_case="n=1"), job).label == "n=65537"  # type: ignore[union-attr]


def _check(monkeypatch: pytest.MonkeyPatch, seen: Observation | Exception) -> tuple[list[str], Exception | None]:
    from grader.records import CheckFailure, ChildJob

    def fake(task: CudaTask, ep: object, case: object) -> Observation:
        if isinstance(seen, Exception):
            raise seen
        return Observation(str(ep), "n=1000", seen.kernels, seen.api, seen.copies)

    monkeypatch.setattr(observe, "observe", fake)
    notes: list[str] = []
    facts = facts_with(kernel("scale_kernel", ("mul.rn.f32",)))
    eps: dict[str, Any] = {"scale": "scale", "scale_graph": "scale_graph"}  # the fake observes by name
    try:
        observe.check(fixture_task(), ChildJob(spec="", sources={}), facts, eps, notes)
    except CheckFailure as e:
        return notes, e
    return notes, None


def test_a_profiler_that_cannot_observe_leaves_the_rules_not_checked(monkeypatch):
    notes, failure = _check(monkeypatch, RuntimeError("CUPTI_ERROR_INSUFFICIENT_PRIVILEGES"))
    assert failure is None and any("not checked" in n and "CUPTI_ERROR" in n for n in notes), notes
    notes, failure = _check(monkeypatch, seen([]))
    assert failure is None and any("recorded no CUDA activity" in n for n in notes), notes


def test_an_observed_call_that_breaks_a_rule_is_a_rule_violation(monkeypatch):
    two = seen(["scale_kernel(float*, int)", "scale_kernel(float*, int)"], ["cudaGraphLaunch"])
    notes, failure = _check(monkeypatch, two)
    assert failure is not None and getattr(failure, "verdict", None) == Verdict.RULE
    assert "`scale` on case n=1000: the call launched 2 kernels" in str(failure)
    notes, failure = _check(monkeypatch, seen(["scale_kernel(float*, int)"], ["cudaGraphLaunch"]))
    assert failure is None and any(n.startswith("observed on case n=1000: `scale`: launched 1 kernel") for n in notes)

"""An entry point that runs on some cards only (`Entry.min_cc`, `max_cc`: lab 2's Hopper rung, built
for sm_90a) is skipped elsewhere, with its reason: neither passed nor failed. No rule judges its code
on a build for another target, its performance points count neither way, and the task process
leaves it out of the cases, the timing and the ladder. A task that asks for it (`arch_specific`) is
built for the card's architecture-specific target, sm_90a on a 9.0 card. On the CPU: specs, build
records and results are made up here; one pair of builds (where nvcc is) shows sm_90a's code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grader import paths, toolchain
from grader.build import nvcc, objects
from grader.build.nvcc import BuildFacts, BuildResult, BuildUnit, KernelFacts
from grader.build.objects import EntryReach
from grader.child.cudalib import skip_notes
from grader.parent.scoring import perf_report, score
from grader.parent.static_checks import check_build
from grader.records import ChildReport, TaskResult, Timing, Verdict, to_jsonable
from grader.report.files import markdown
from grader.report.terminal import table
from grader.tasks.rules import NO_LIBRARIES, uses_inline_ptx, uses_tensor_cores
from grader.tasks.spec import CudaTask, Entry, In, Int, Out, PerfTarget, Rule

ARGS = [In("x"), Out("y"), Int("n")]
HOPPER = {"min_cc": (9, 0), "max_cc": (9, 0), "needs": "Hopper: wgmma"}


def entry(symbol: str, **only: object) -> Entry:
    return Entry(symbol, ARGS, reference=lambda v: {"y": v["x"]}, **only)  # type: ignore[arg-type]


def task(*rules: Rule, perf: tuple[PerfTarget, ...] = (), entries: tuple[Entry, ...] = ()) -> CudaTask:
    return CudaTask(
        lab="lab1",
        number="09",
        title="t",
        sources=["09_t.cu"],
        entries=list(entries or (entry("plain"), entry("hopper", **HOPPER))),
        cases=[],
        make_inputs=lambda p, r: {},
        rules=list(rules),
        perf=list(perf),
        arch_specific=True,
    )


# --- the reason -----------------------------------------------------------------------------------


def test_the_reason_names_the_entry_what_it_needs_and_the_card():
    t = task()
    assert t.skipped((9, 0)) == {}
    assert t.skipped((8, 9)) == {"hopper": "hopper needs an sm_90 card (Hopper: wgmma); this card is sm_89"}
    assert t.skipped((10, 0))["hopper"].endswith("this card is sm_100")
    newer = entry("x", min_cc=(8, 0))
    assert newer.unsupported((7, 5)) == "x needs an sm_80 or newer card; this card is sm_75"
    assert newer.unsupported((8, 0)) == newer.unsupported((12, 0)) == ""
    assert entry("x", max_cc=(8, 9)).unsupported((9, 0)) == "x needs an sm_89 or older card; this card is sm_90"
    assert "an sm_80 to sm_90 card" in entry("x", min_cc=(8, 0), max_cc=(9, 0)).unsupported((10, 0))
    assert entry("x").unsupported((5, 0)) == ""


def test_a_spec_whose_lowest_card_is_past_its_highest_is_refused():
    with pytest.raises(ValueError, match="min_cc"):
        task(entries=(entry("x", min_cc=(9, 0), max_cc=(8, 0)),))


def test_the_architecture_specific_target_of_a_card():
    assert [toolchain.specific_arch(a) for a in ("sm_90", "9.0", "sm_100", "sm_120")] == [
        "sm_90a",
        "sm_90a",
        "sm_100a",
        "sm_120a",
    ]
    # none before 9.0; an already specific target stays
    assert [toolchain.specific_arch(a) for a in ("sm_89", "sm_80", "sm_90a", "sm_100f")] == [
        "sm_89",
        "sm_80",
        "sm_90a",
        "sm_100f",
    ]
    assert [toolchain.compute_capability(a) for a in ("sm_90a", "sm_120", "8.6", "sm_75")] == [
        (9, 0),
        (12, 0),
        (8, 6),
        (7, 5),
    ]


def test_the_task_process_notes_each_skipped_entry_with_its_reason():
    notes = skip_notes(task().skipped((8, 0)))
    assert notes == [
        "hopper needs an sm_90 card (Hopper: wgmma); this card is sm_80: `hopper` is skipped here "
        "(neither checked, timed nor scored)"
    ]


# --- the rules on the build -------------------------------------------------------------------------


def kernel(name: str, asm: list[str], sass: list[str]) -> KernelFacts:
    return KernelFacts(f"{name}(float*)", "f.cu", 0, 0, False, False, mangled=name, inline_asm=asm, sass=sass)


def facts(hopper_asm: list[str], hopper_sass: list[str]) -> BuildFacts:
    """`plain` reaches an mma.sync kernel; `hopper` its own, whose code depends on the target."""
    return BuildFacts(
        kernels=[
            kernel("plain_k", ["mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"], ["HMMA.16816.F32", "EXIT"]),
            kernel("hopper_k", hopper_asm, hopper_sass),
        ],
        reach={"plain": EntryReach([], ["plain_k"]), "hopper": EntryReach([], ["hopper_k"])},
    )


EMPTY = facts([], ["EXIT"])  # an sm_89 (or sm_90) build: the kernel's body is compiled away
HOPPER_BUILD = facts(["wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16"], ["HGMMA.64x256x16.F32", "EXIT"])
WGMMA = uses_inline_ptx(r"wgmma\.mma_async", "rung 4 multiplies with wgmma", "hopper")
TENSOR_CORES = uses_tensor_cores("every rung multiplies on the tensor cores")


def judged(t: CudaTask, f: BuildFacts, arch: str) -> tuple[Verdict | None, str]:
    out = check_build(t, BuildResult(Path("f.cu"), True, Path("f.so"), facts=f, arch=arch), {})
    return out.verdict, out.message


def test_a_build_for_another_card_leaves_the_entry_out_of_the_rules():
    t = task(WGMMA, TENSOR_CORES)
    assert judged(t, EMPTY, "sm_89") == (None, "")  # neither the rule naming it nor the one on every entry
    assert judged(t, HOPPER_BUILD, "sm_90a") == (None, "")
    verdict, message = judged(t, EMPTY, "sm_90a")  # where it runs, its empty kernel is judged
    assert verdict == Verdict.RULE and "hopper" in message and "wgmma" in message
    verdict, message = judged(task(TENSOR_CORES), EMPTY, "sm_90a")
    assert verdict == Verdict.RULE and "hopper_k" in message and "no HMMA or HGMMA" in message
    # the other entries are still judged there
    no_tc = facts([], ["EXIT"])
    no_tc.kernels[0].sass = ["FFMA", "EXIT"]
    verdict, message = judged(task(TENSOR_CORES), no_tc, "sm_89")
    assert verdict == Verdict.RULE and "plain_k" in message


def test_a_rule_naming_a_skipped_and_a_running_entry_judges_the_running_one():
    both = uses_inline_ptx(r"mma\.sync", "mma.sync", ("plain", "hopper"))
    assert judged(task(both), EMPTY, "sm_89") == (None, "")
    verdict, message = judged(task(both), EMPTY, "sm_90a")
    assert verdict == Verdict.RULE and "`hopper`" in message


def test_where_no_entry_runs_only_the_library_rules_are_judged():
    only = task(TENSOR_CORES, NO_LIBRARIES, entries=(entry("hopper", **HOPPER),))
    assert judged(only, EMPTY, "sm_89") == (None, "")
    with_cublas = facts([], ["EXIT"])
    with_cublas.library_headers = {"/usr/local/cuda/include/cublas_v2.h": ""}
    verdict, message = judged(only, with_cublas, "sm_89")
    assert verdict == Verdict.RULE and "cublas_v2.h" in message


def test_a_build_that_names_no_target_judges_every_entry():
    assert judged(task(WGMMA), EMPTY, "")[0] == Verdict.RULE


# --- points and records -----------------------------------------------------------------------------


def result(skipped: dict[str, str]) -> TaskResult:
    row = Timing("plain", "n=1", 1.0, 0.9, 1.1, 0.8, 10, speedup=0.6)
    return TaskResult("lab1", "09", "t", "lab1/09_t.cu", Verdict.PASS, timings=[row], skipped=skipped)


def test_a_skipped_entry_s_targets_count_neither_way():
    t = task(perf=(PerfTarget("plain", "speedup", 0.5, 2), PerfTarget("hopper", "speedup", 0.9, 2)))
    assert score(t, result({})) == (12, 14)  # where it runs, an untimed target is a target missed
    r = result(t.skipped((8, 9)))
    assert score(t, r) == (12, 12)
    assert perf_report(t, r) == ["performance: plain reached 0.6× the speed of torch (target 0.5×): +2 points"]


def test_the_reports_list_a_skipped_entry_under_its_task():
    r = result(task().skipped((8, 9)))
    r.points, r.max_points = 12, 12
    text = table([r])
    assert "✓ pass" in text and "└ hopper" in text and "- skipped" in text
    md = markdown([r], {"gpus": [], "nvcc": "13.0", "torch": "x", "arch": "sm_89"})
    assert "| ↳ (`hopper`) | skipped |" in md


def test_the_skipped_entries_travel_from_the_task_process_to_the_result():
    from grader.parent.isolation import ChildRun
    from grader.parent.runner import from_child

    t = task()
    report = ChildReport(verdict=Verdict.PASS, skipped=t.skipped((8, 9)))
    again = ChildReport.from_json(json.dumps(to_jsonable(report)))
    assert again.skipped == {"hopper": "hopper needs an sm_90 card (Hopper: wgmma); this card is sm_89"}
    run = ChildRun(returncode=0, timed_out=False, stdout="", stderr="", result=again, seconds=1.0)
    r = from_child(t, Path("lab1/09_t.cu"), run, 60)
    assert r.verdict == Verdict.PASS and r.skipped == again.skipped


# --- the build --------------------------------------------------------------------------------------

KERNEL = """
__global__ void k(unsigned* out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    unsigned rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    out[0] = rank;
#endif
}
extern "C" void launch(unsigned* out) { k<<<1, 1>>>(out); }
"""


def test_an_arch_specific_unit_is_built_for_sm_90a_and_keyed_apart(tmp_path: Path):
    try:
        toolchain.find_nvcc()
    except toolchain.ToolchainError as e:
        pytest.skip(str(e))
    src = tmp_path / "k.cu"
    src.write_text(KERNEL)
    plain = BuildUnit("t/1", (src,), "t", "k.student", include_dirs=(tmp_path,), sass=False)
    specific = BuildUnit("t/1", (src,), "t", "k.student", include_dirs=(tmp_path,), sass=False, arch_specific=True)
    built = nvcc.build_all([plain, specific], arch="sm_90")
    assert built[plain].ok and built[specific].ok, built[plain].error or built[specific].error
    assert (built[plain].arch, built[specific].arch) == ("sm_90", "sm_90a")
    assert built[plain].lib != built[specific].lib  # the target is part of the key
    asm = {u: [i for k in built[u].facts.kernels for i in k.inline_asm] for u in (plain, specific)}  # type: ignore[union-attr]
    assert asm[plain] == [] and asm[specific] == ["mov.u32 %cluster_ctarank"]
    assert nvcc.build_all([specific], arch="sm_89")[specific].arch == "sm_89"  # no sm_89a: the plain target


# --- the course's one driver entry point --------------------------------------------------------------

ENCODER = "_Z20course_tensor_map_2dP14CUtensorMap_st24CUtensorMapDataType_enumPKvmmmjj23CUtensorMapSwizzle_enum"


def test_the_course_tensor_map_helper_is_the_one_driver_lookup_a_task_may_make():
    header = str(paths.INCLUDE / "course_mma.h")
    lookup = "cudaGetDriverEntryPointByVersion"
    assert objects.library_lookup(lookup, [ENCODER], [header])
    assert not objects.library_lookup(lookup, [ENCODER, "hgemm_4"], [header])  # a call of the student's own
    assert not objects.library_lookup(lookup, ["_Z20course_tensor_map_2di"], [header])  # an overload of theirs
    assert not objects.library_lookup(lookup, [ENCODER], ["/home/s/lab2/course_mma.h"])  # a header of theirs
    assert not objects.library_lookup("dlsym", [ENCODER], [header])


# --- broken variants of such an entry -----------------------------------------------------------------


@pytest.mark.skipif(not (paths.ROOT / "lab2" / "solutions" / "broken.py").exists(), reason="no broken variants here")
def test_a_variant_of_an_entry_this_card_skips_is_not_graded_here(monkeypatch):
    from grader.instructor import broken

    def card(cc: str) -> tuple[toolchain.Gpu, ...]:
        return (toolchain.Gpu("GPU", cc, "580", 81559, "1980", "2619", "1980"),)

    name = "15_tensor_core.b_read_k_major"  # breaks hgemm_4, which runs on sm_90 alone
    monkeypatch.setattr(toolchain, "gpus", lambda: card("8.9"))
    assert "hgemm_4 needs an sm_90 card" in broken.unsupported_here("lab2", name)
    assert broken.unsupported_here("lab2", "15_tensor_core.b_without_trans") == ""  # rung 3's: every card
    monkeypatch.setattr(toolchain, "gpus", lambda: card("9.0"))
    assert broken.unsupported_here("lab2", name) == ""
    monkeypatch.setattr(toolchain, "gpus", lambda: ())
    assert broken.unsupported_here("lab2", name) == ""  # no GPU: needs_gpu says it is not graded

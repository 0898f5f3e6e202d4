from grader.parent.static_checks import check_source
from grader.records import Verdict
from grader.tasks.rules import NO_LIBRARIES, uses_shared_memory
from grader.tasks.spec import CudaTask


def task(*rules):
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


def test_library_include_is_a_rule_violation_with_its_line():
    out = check_source(task(NO_LIBRARIES), "int x;\n#include <cublas_v2.h>\n", "f.cu")
    assert out.verdict == Verdict.RULE and "f.cu:2" in out.message


def test_thrust_call_is_caught_but_a_mention_in_a_comment_is_not():
    assert check_source(task(NO_LIBRARIES), "void f() { thrust::sort(a, b); }", "f.cu").verdict == Verdict.RULE
    assert check_source(task(NO_LIBRARIES), "// unlike thrust::sort, we...\n/* cublasSgemm( */", "f.cu").verdict is None


def test_required_construct_missing():
    out = check_source(task(uses_shared_memory("use shared memory")), "__global__ void k() {}", "f.cu")
    assert out.verdict == Verdict.RULE and "use shared memory" in out.message
    assert check_source(task(uses_shared_memory("x")), "__shared__ float t[4];", "f.cu").verdict is None


def test_untouched_skeleton_is_not_started_before_rules_apply():
    src = "// TODO(lab1/09) begin: x\n// TODO(lab1/09) end\n"
    assert check_source(task(uses_shared_memory("x")), src, "f.cu").verdict == Verdict.NOT_STARTED

import sys

from grader.parent.isolation import ChildRun, SpawnedChild
from grader.parent.runner import from_child
from grader.records import ChildJob, ChildReport, Phase, Stage, Verdict
from grader.tasks.spec import CudaTask


def task():
    return CudaTask(
        lab="lab1", number="09", title="t", sources=["09_t.cu"], entries=[], cases=[], make_inputs=lambda p, r: {}
    )


def test_a_hung_child_is_killed_and_reported(tmp_path):
    # the wrapper replaces the real child with one that never ends
    job = ChildJob(spec=str(tmp_path / "spec.py"), sources={}, lib=str(tmp_path / "x.so"), timing="off")
    child = SpawnedChild(tmp_path / "r.json", job=job, wrapper=[sys.executable, "-c", "import time; time.sleep(60)"])
    run = child.wait(1.0)
    assert run.timed_out
    r = from_child(task(), tmp_path / "t.cu", run, 1.0)
    assert r.verdict == Verdict.TIMEOUT and "never finishes" in r.message


def test_a_child_killed_by_a_signal_is_a_crash(tmp_path):
    run = ChildRun(
        -11,
        False,
        "",
        "t.cu:12: CUDA error cudaErrorInvalidValue",
        ChildReport(phase=Phase(Stage.CHECKING, "silu, case n=33")),
        0.1,
    )
    r = from_child(task(), tmp_path / "t.cu", run, 60)
    assert r.verdict == Verdict.CRASH and "SIGSEGV" in r.message and "n=33" in r.message and "t.cu:12" in r.message


def test_child_verdicts_pass_through(tmp_path):
    run = ChildRun(0, False, "", "", ChildReport(verdict=Verdict.WRONG, message="`c`: 3 of 4 wrong"), 0.1)
    r = from_child(task(), tmp_path / "t.cu", run, 60)
    assert r.verdict == Verdict.WRONG and r.message.startswith("`c`")

import sys

from grader.isolation import Child, ChildRun
from grader.runner import _from_child
from grader.spec import Task
from grader.verdict import Verdict


def task():
    return Task("lab1", "09", "t", "09_t.cu", [], [], lambda p, r: {}, lambda v: {})


def test_a_hung_child_is_killed_and_reported(tmp_path):
    # the wrapper replaces the real child with one that never ends
    child = Child(
        tmp_path / "spec.py",
        tmp_path / "r.json",
        "off",
        wrapper=[sys.executable, "-c", "import time; time.sleep(60)"],
        lib=tmp_path / "x.so",
    )
    run = child.wait(1.0)
    assert run.timed_out
    r = _from_child(task(), tmp_path / "t.cu", run, 1.0)
    assert r.verdict == Verdict.TIMEOUT and "never finishes" in r.message


def test_a_child_killed_by_a_signal_is_a_crash(tmp_path):
    run = ChildRun(-11, False, "", "t.cu:12: CUDA error cudaErrorInvalidValue", {"phase": "silu, case n=33"}, 0.1)
    r = _from_child(task(), tmp_path / "t.cu", run, 60)
    assert r.verdict == Verdict.CRASH and "SIGSEGV" in r.message and "n=33" in r.message and "t.cu:12" in r.message


def test_child_verdicts_pass_through(tmp_path):
    run = ChildRun(0, False, "", "", {"verdict": "wrong", "message": "`c`: 3 of 4 wrong", "timings": []}, 0.1)
    r = _from_child(task(), tmp_path / "t.cu", run, 60)
    assert r.verdict == Verdict.WRONG and r.message.startswith("`c`")

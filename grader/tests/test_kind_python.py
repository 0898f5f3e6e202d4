"""The Python-module kind, graded for real on any machine (CPU-only included): its fixture task
(grader/tests/fixtures/python, a task that needs no GPU) through the runner, in a task process,
with the reference solution and variants that are wrong, crash (SIGSEGV through ctypes) and
hang; and the student's own pytest session, which runs only the spec's grading test.

The fixture's reference is its `pass` variant, not a `solutions/` folder: a student release
(`make release`) drops every `solutions/` folder, and these tests must pass there too."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from grader import paths
from grader.child.pytests import points_of
from grader.instructor.broken import materialize
from grader.parent import runner
from grader.parent.static_checks import check_source
from grader.records import TaskResult, Verdict
from grader.tasks.catalogue import load_task
from grader.tasks.python import PythonTask
from grader.tasks.regions import find_regions, make_skeleton, not_started
from grader.tasks.spec import Rule

FIXTURE = Path(__file__).parent / "fixtures" / "python"
SPEC = FIXTURE / "tests" / "test_92_tinystats.py"
SOURCE = "tinystats/stats.py"
TIMEOUT = 60.0  # generous: a busy machine still starts torch and pytest in time
HANG_TIMEOUT = 10.0  # what the hanging variant costs


@pytest.fixture(scope="module")
def task() -> PythonTask:
    t = load_task(SPEC)
    assert isinstance(t, PythonTask)
    return t


@pytest.fixture(scope="module", autouse=True)
def no_forkserver() -> Iterator[None]:
    """A fresh task process per run: nothing is left running after the tests."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRADER_FORKSERVER", "0")
        yield


REFERENCE = FIXTURE / "variants" / "pass.py"  # the reference: not under solutions/, so a student release keeps it
VARIANTS = {  # broken on purpose: edits of the reference (grader/instructor/broken.py)
    "wrong": [("    m = mean(xs)\n    return sum((x - m) ** 2", "    return sum(x**2")],  # forgets the mean
    "crash": [
        (
            "    m = mean(xs)\n    return sum((x - m) ** 2 for x in xs) / len(xs)",
            "    __import__('ctypes').string_at(0)\n    return 0.0",
        )
    ],  # SIGSEGV
    "timeout": [
        (
            "    for i, x in enumerate(xs):\n        if x > xs[best]:\n            best = i",
            "    i = 0\n    while i < len(xs):\n        if xs[i] > xs[best]:\n            best = i",
        )
    ],  # never leaves its loop
}


def variant_file(name: str) -> Path:
    if name == "pass":
        return REFERENCE
    return materialize(REFERENCE, VARIANTS[name], f"python-{name}", f"grader fixture variant `{name}`")


def grade(task: PythonTask, variant: str | None, timeout: float = TIMEOUT) -> TaskResult:
    overrides = {task.task_id: {SOURCE: variant_file(variant)}} if variant else None
    (result,) = runner.grade([task], runner.Options(timing="off", timeout=timeout), overrides)
    return result


@pytest.fixture(scope="module")
def outer(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], dict]:
    """The student's session on the fixture's spec (`make test-labN` in small), its module untouched."""
    out_dir = tmp_path_factory.mktemp("grade")
    env = {**os.environ, "GRADER_FORKSERVER": "0", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    cmd = [sys.executable, "-m", "pytest", str(SPEC), "-v", "-p", "no:cacheprovider", f"--grade-dir={out_dir}"]
    proc = subprocess.run(cmd, cwd=paths.ROOT, env=env, capture_output=True, text=True, timeout=300)
    results = json.loads((out_dir / "results.json").read_text()) if (out_dir / "results.json").exists() else {}
    return proc, results


def test_the_students_session_runs_only_the_grading_test(outer):
    proc, results = outer
    last = proc.stdout.strip().splitlines()[-1]
    assert proc.returncode == 1 and "1 failed" in last and "deselected" not in last, proc.stdout + proc.stderr
    assert "test_92_tinystats.py::test_tinystats FAILED" in proc.stdout
    assert "::test_mean" not in proc.stdout and "::test_variance" not in proc.stdout  # dropped, silently
    (r,) = results["tasks"]
    assert r["verdict"] == "not started" and "tinystats/stats.py" in r["message"] and r["tests"] == []


def test_the_reference_passes_with_every_test_and_its_points(task):
    r = grade(task, "pass")
    assert r.verdict == Verdict.PASS, r.message
    assert (r.points, r.max_points) == (10, 10)
    assert [(t.name, t.outcome, t.points) for t in r.tests] == [
        ("test_mean", "passed", 2.0),
        ("test_variance", "passed", 3.0),
        ("test_argmax", "passed", 1.0),
        ("test_empty_input_is_rejected", "passed", 1.0),  # unmarked: 1 point
    ]


def test_the_inner_session_keeps_the_point_tests_and_drops_the_grading_test():
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        str(SPEC),
        "--grader-inner",
        "--collect-only",
        "-q",
        "-p",
        "no:cacheprovider",
    ]
    proc = subprocess.run(cmd, cwd=paths.ROOT, env=env, capture_output=True, text=True, timeout=120)
    names = [ln.rsplit("::", 1)[-1] for ln in proc.stdout.splitlines() if "::" in ln]
    assert names == ["test_mean", "test_variance", "test_argmax", "test_empty_input_is_rejected"], proc.stdout


def test_a_wrong_module_gets_partial_credit_and_the_failing_assertion(task):
    r = grade(task, "wrong")
    assert r.verdict == Verdict.WRONG, r.message
    assert r.points == pytest.approx(10 * 4 / 7, abs=0.01) and r.max_points == 10
    assert {t.name: t.outcome for t in r.tests} == {
        "test_mean": "passed",
        "test_variance": "failed",
        "test_argmax": "passed",
        "test_empty_input_is_rejected": "passed",
    }
    assert "1 of 4 tests did not pass" in r.message and "test_variance: assert 25.0 == 0.0" in r.message
    assert "variance([5.0, 5.0])" in r.message and "0x" not in r.message  # no `<function ... at 0x...>`


def test_a_segfault_in_student_code_is_a_crash_that_names_its_test(task):
    r = grade(task, "crash")
    assert r.verdict == Verdict.CRASH, r.message
    assert "SIGSEGV" in r.message and "in test test_variance" in r.message
    assert [(t.name, t.outcome) for t in r.tests] == [("test_mean", "passed")]  # what ran before the crash
    assert r.points == 0


def test_a_hang_is_a_timeout_that_names_its_test(task):
    r = grade(task, "timeout", timeout=HANG_TIMEOUT)
    assert r.verdict == Verdict.TIMEOUT, r.message
    assert "in test test_argmax" in r.message
    assert [t.name for t in r.tests] == ["test_mean", "test_variance"] and r.points == 0


def test_a_task_that_needs_a_gpu_is_skipped_without_one(task, monkeypatch):
    monkeypatch.setattr(runner.toolchain, "has_gpu", lambda: False)
    r = grade(dataclasses.replace(task, gpu=True), "pass")
    assert r.verdict == Verdict.SKIPPED and "no NVIDIA GPU" in r.message


def test_this_kind_needs_no_gpu_unless_it_says_so(task):
    assert task.gpu is False and task.point_tests and not task.builds_library
    with pytest.raises(ValueError, match=r"sources are \.py files"):
        PythonTask(lab="lab4", number="01", title="t", sources=["01_t.ipynb"])
    with pytest.raises(ValueError, match=r"sources are \.py files"):
        PythonTask(lab="lab4", number="01", title="t", sources=["01_t.h"])  # a header alone builds nothing
    lib = PythonTask(lab="lab4", number="01", title="t", sources=["01_t.cu", "01_t.h", "pkg/x.py"])
    assert lib.builds_library and lib.library_sources == ["01_t.cu", "01_t.h"]


# --- a Python task whose sources build a library (grader/tests/fixtures/python_cu) ------------------

LIB_FIXTURE = Path(__file__).parent / "fixtures" / "python_cu"
LIB_SPEC = LIB_FIXTURE / "tests" / "test_93_twice.py"
LIB_SOURCE = "93_twice.cu"
LIB_REFERENCE = LIB_FIXTURE / "variants" / "pass.cu"
LIB_VARIANTS = {
    "wrong": [("    return 2 * x;\n", "    return x + x + 1;\n")],
    "compile": [("    return 2 * x;\n", "    return 2 * y;\n")],  # no y: nvcc's error, not a test's
}


@pytest.fixture(scope="module")
def lib_task() -> PythonTask:
    from grader import toolchain

    try:
        toolchain.find_nvcc()
    except toolchain.ToolchainError as e:
        pytest.skip(f"the library of a Python task is built with nvcc: {e}")
    t = load_task(LIB_SPEC)
    assert isinstance(t, PythonTask) and t.builds_library and not t.gpu
    return t


def grade_lib(task: PythonTask, variant: str | None, **opts: object) -> TaskResult:
    if variant is None:
        overrides = None
    else:
        path = LIB_REFERENCE
        if variant != "pass":
            path = materialize(LIB_REFERENCE, LIB_VARIANTS[variant], f"python-cu-{variant}", f"fixture `{variant}`")
        overrides = {task.task_id: {LIB_SOURCE: path}}
    (result,) = runner.grade([task], runner.Options(timing="off", timeout=TIMEOUT, **opts), overrides)  # type: ignore[arg-type]
    return result


def test_a_python_task_loads_the_library_the_grader_built_from_its_cu_sources(lib_task):
    """Built by the grading process with nvcc, named to the task process (GRADER_TASK_LIB), loaded by
    the point tests with task_library(): host functions only, so any machine with nvcc runs it."""
    r = grade_lib(lib_task, "pass")
    assert r.verdict == Verdict.PASS, r.message
    assert [(t.name, t.outcome) for t in r.tests] == [("test_twice", "passed"), ("test_clamp_sum", "passed")]
    w = grade_lib(lib_task, "wrong")
    assert w.verdict == Verdict.WRONG and "test_twice" in w.message, w.message
    assert [(t.name, t.outcome) for t in w.tests] == [("test_twice", "failed"), ("test_clamp_sum", "passed")]


def test_a_python_tasks_compile_error_is_its_verdict_before_any_test(lib_task):
    r = grade_lib(lib_task, "compile")
    # nvcc's first error, at the graded file's line
    assert r.verdict == Verdict.COMPILE_ERROR and '"y" is undefined' in r.message and r.tests == [], r.message


def test_the_library_is_built_even_where_the_task_is_skipped(lib_task, monkeypatch):
    """A GPU task on a machine without one: the build still runs (its error is the verdict), then
    the task is skipped, saying the code compiled."""
    monkeypatch.setattr(runner.toolchain, "has_gpu", lambda: False)
    gpu_task = dataclasses.replace(lib_task, gpu=True)
    r = grade_lib(gpu_task, "pass")
    assert r.verdict == Verdict.SKIPPED and "compiled" in r.message and "no NVIDIA GPU" in r.message, r.message
    assert grade_lib(gpu_task, "compile").verdict == Verdict.COMPILE_ERROR


def test_the_untouched_library_skeleton_is_not_started(lib_task):
    r = grade_lib(lib_task, None)
    assert r.verdict == Verdict.NOT_STARTED and LIB_SOURCE in r.message, r.message
    forced = grade_lib(lib_task, None, force_run=True)  # make verify's run of a skeleton: built, and wrong
    assert forced.verdict == Verdict.WRONG, forced.message


def test_task_library_says_where_it_comes_from(monkeypatch, tmp_path):
    from grader.tasks.python import LIBRARY_ENV, task_library

    monkeypatch.delenv(LIBRARY_ENV, raising=False)
    with pytest.raises(RuntimeError, match="built by the grader"):
        task_library()
    monkeypatch.setenv(LIBRARY_ENV, str(tmp_path / "x.so"))
    assert task_library() == tmp_path / "x.so"


def test_the_library_fixture_follows_the_task_file_conventions():
    student = LIB_FIXTURE / LIB_SOURCE
    assert student.read_text() == make_skeleton(LIB_REFERENCE.read_text(), LIB_SOURCE)
    assert not_started(student.read_text(), LIB_SOURCE) and not not_started(LIB_REFERENCE.read_text(), LIB_SOURCE)
    assert {r.tag for r in find_regions(student.read_text(), LIB_SOURCE)} == {"fixtures/93"}


def test_points_marks():
    class Item:
        nodeid = "t.py::test_x"

        def __init__(self, mark: object) -> None:
            self.mark = mark

        def get_closest_marker(self, name: str) -> object:
            return self.mark

    assert points_of(Item(None)) == 1.0
    assert points_of(Item(pytest.mark.points(3).mark)) == 3.0
    assert points_of(Item(pytest.mark.points(n=0.5).mark)) == 0.5
    with pytest.raises(ValueError, match="takes a number"):
        points_of(Item(pytest.mark.points("three").mark))


def test_the_fixture_follows_the_task_file_conventions():
    solution = REFERENCE
    student = FIXTURE / SOURCE
    assert student.read_text() == make_skeleton(solution.read_text(), SOURCE)
    assert not_started(student.read_text(), SOURCE) and not not_started(solution.read_text(), SOURCE)
    assert {r.tag for r in find_regions(student.read_text(), SOURCE)} == {"fixtures/92"}
    compile(student.read_text(), str(student), "exec")  # the skeleton is valid Python: stubs keep bodies
    for f in (student, REFERENCE):
        head = f.read_text().split('"""')[1]
        assert all(field in head for field in ("Implement:", "Contract:", "Test:")), f


def test_a_task_process_forked_by_the_fork_server_grades_it_too(task, forkserver_on):
    r = grade(task, "pass")
    assert r.verdict == Verdict.PASS and len(r.tests) == 4, r.message
    assert len(forkserver_on) == 1  # it came from the fork server


def test_rules_read_python_without_its_comments_and_strings(task):
    rule = Rule("forbid", r"\bnumpy\b", "plain Python here")
    ruled = dataclasses.replace(task, rules=[rule])
    prose = '"""Unlike numpy, ..."""\nx = "numpy"  # numpy would do it\n'
    assert check_source(ruled, prose, "tinystats/stats.py").verdict is None
    out = check_source(ruled, prose + "import numpy\n", "tinystats/stats.py")
    assert out.verdict == Verdict.RULE and out.message.startswith("tinystats/stats.py:3: `numpy`")


PREPARED: list[str] = []


def record_prepare() -> None:
    """A prepare step for the tests below: it only notes that it ran."""
    PREPARED.append("ran")


def failing_prepare() -> None:
    raise FileNotFoundError("lab3/models/mlp.safetensors: run make train-lab3")


def test_a_prepare_step_runs_once_per_run_before_its_tasks(task):
    """Two tasks that share a prepare step: it runs once, in the grading process, and both pass."""
    PREPARED.clear()
    prepared = dataclasses.replace(task, prepare=f"{__name__}:record_prepare")
    second = dataclasses.replace(prepared, number="95")
    results = list(
        runner.grade(
            [prepared, second],
            runner.Options(timing="off", timeout=TIMEOUT),
            {prepared.task_id: REFERENCE, second.task_id: REFERENCE},
        )
    )
    assert PREPARED == ["ran"]
    assert [r.verdict for r in results] == [Verdict.PASS, Verdict.PASS], [r.message for r in results]


def test_a_failing_prepare_step_is_the_tasks_environment_verdict(task):
    broken = dataclasses.replace(task, prepare=f"{__name__}:failing_prepare")
    (result,) = runner.grade([broken], runner.Options(timing="off", timeout=TIMEOUT), {broken.task_id: REFERENCE})
    assert result.verdict == Verdict.ENVIRONMENT
    assert "make train-lab3" in result.message and "FileNotFoundError" in result.message


def test_builds_on_stages_earlier_tasks_files_as_the_run_grades_them(task, tmp_path):
    """A task that runs another task's file (lab 4's executor runs the kernels of tasks 03-05) gets
    the reference of that file with --solutions and the student's own otherwise."""
    lab = tmp_path / "lab"
    shutil.copytree(FIXTURE, lab)
    solutions = lab / "solutions" / "tinystats"
    solutions.mkdir(parents=True)
    shutil.copyfile(REFERENCE, solutions / "stats.py")
    # the "reference" of the earlier file lets an empty list through: only its staging can fail the task
    (solutions / "checks.py").write_text("def require_nonempty(xs):\n    return None\n")
    later = dataclasses.replace(task, spec_file=str(lab / "tests" / SPEC.name), builds_on=["tinystats/checks.py"])
    (solved,) = runner.grade([later], runner.Options(solutions=True, timing="off", timeout=TIMEOUT))
    assert solved.verdict == Verdict.WRONG and "test_empty_input_is_rejected" in solved.message, solved.message
    (own,) = runner.grade([later], runner.Options(timing="off", timeout=TIMEOUT), {later.task_id: REFERENCE})
    assert own.verdict == Verdict.PASS, own.message


def test_another_labs_files_are_named_from_the_lab_and_staged_at_the_top(task, tmp_path):
    """Lab 5 runs lab 4's compiler: `../lab4/kiln/...` resolves in lab 4 (its solutions under
    --solutions) and is staged as the top-level package `kiln`, the graded file put over it."""
    from grader.child.pytests import stage

    lab5 = paths.ROOT / "lab5"
    assert paths.lab_file(lab5, "kiln_llm/cpu.py") == (lab5, "kiln_llm/cpu.py")
    assert paths.lab_file(lab5, "../lab4/kiln/cpu.py") == (paths.ROOT / "lab4", "kiln/cpu.py")
    assert paths.solution_source(lab5, "../lab4/kiln/cpu.py") == paths.ROOT / "lab4/solutions/kiln/cpu.py"
    with pytest.raises(ValueError, match="labN"):
        paths.lab_file(lab5, "../elsewhere/x.py")
    later = dataclasses.replace(task, sources=[SOURCE], packages=["../lab4/kiln"])
    assert later.staged() == ["tinystats", "../lab4/kiln"]
    graded = tmp_path / "cpu.py"
    graded.write_text("GRADED = True\n")
    dest = tmp_path / "stage"
    stage(later, {"../lab4/kiln/cpu.py": str(graded)}, dest)
    assert (dest / "kiln" / "ir.py").is_file() and (dest / "kiln" / "cpu.py").read_text() == "GRADED = True\n"


def grade_with_test(task: PythonTask, tmp_path: Path, test: str) -> TaskResult:
    """The reference graded against a copy of the fixture's spec with one more point test; it passes."""
    lab = tmp_path / "lab"
    shutil.copytree(FIXTURE, lab)
    spec = lab / "tests" / SPEC.name
    spec.write_text(spec.read_text() + "\n\n" + test)
    later = dataclasses.replace(task, spec_file=str(spec))
    (r,) = runner.grade([later], runner.Options(timing="off", timeout=TIMEOUT), {later.task_id: REFERENCE})
    assert r.verdict == Verdict.PASS, r.message
    return r


def test_gpu_checks_of_a_cpu_task_are_left_out_without_a_gpu(task, tmp_path):
    """A task graded on the CPU may carry checks marked `gpu` (lab 5's generation runs on either):
    without a GPU they are deselected, neither passed nor failed, and the verdict says so."""
    from grader import toolchain

    r = grade_with_test(
        task,
        tmp_path,
        "@pytest.mark.gpu\n@pytest.mark.points(5)\ndef test_on_the_gpu():\n"
        "    import torch\n\n    assert torch.cuda.is_available()\n",
    )
    ran = [t.name for t in r.tests]
    if toolchain.has_gpu():
        assert "test_on_the_gpu" in ran
    else:
        assert "test_on_the_gpu" not in ran and len(ran) == 4
        assert any("1 GPU check not run" in n and "test_on_the_gpu" in n for n in r.notes), r.notes


def test_a_passing_check_may_leave_a_note_in_the_report(task, tmp_path):
    """record_property("note", ...) in a point test becomes one of the task's notes, named by its
    test (lab 7's loss curve says how close it came); other properties stay out of the report."""
    r = grade_with_test(
        task,
        tmp_path,
        "@pytest.mark.points(1)\ndef test_with_a_note(record_property):\n"
        "    record_property('note', 'worst step 7, 0.2% off')\n    record_property('other', 'x')\n",
    )
    assert "test_with_a_note: worst step 7, 0.2% off" in r.notes, r.notes
    assert not any("'x'" in n or n.endswith(": x") for n in r.notes), r.notes

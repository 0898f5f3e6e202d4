"""The notebook kind, graded for real on any machine that has nbformat, nbclient and ipykernel
(CPU-only included): its fixture task (grader/tests/fixtures/notebook) through the runner, in a
task process, with the reference solution and variants that are wrong, raise, are not valid
notebooks, kill their kernel and hang. Where those packages are missing (the GPU runner), the
verdict must say so and name the pip command; the rest is skipped with that reason."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from grader.child.__main__ import Recorder
from grader.child.notebook import run as run_notebook
from grader.parent import runner
from grader.parent.static_checks import check_source
from grader.records import ChildJob, TaskResult, Verdict
from grader.tasks.catalogue import load_task
from grader.tasks.notebook import NotebookTask
from grader.tasks.regions import find_regions, make_skeleton, not_started, untouched_regions
from grader.tasks.spec import Rule

FIXTURE = Path(__file__).parent / "fixtures" / "notebook"
SPEC = FIXTURE / "tests" / "test_93_running_mean.py"
SOURCE = "93_running_mean.ipynb"
TIMEOUT = 60.0  # the process; the fixture's cells stop after its cell_timeout (5 s)

MISSING = [m for m in ("nbformat", "nbclient", "ipykernel") if importlib.util.find_spec(m) is None]
needs_jupyter = pytest.mark.skipif(bool(MISSING), reason=f"{', '.join(MISSING)} not installed: notebooks not run here")


@pytest.fixture(scope="module")
def task() -> NotebookTask:
    t = load_task(SPEC)
    assert isinstance(t, NotebookTask)
    return t


@pytest.fixture(scope="module", autouse=True)
def no_forkserver() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRADER_FORKSERVER", "0")
        yield


def grade(task: NotebookTask, notebook: Path | None) -> TaskResult:
    overrides = {task.task_id: {SOURCE: notebook}} if notebook else None
    (result,) = runner.grade([task], runner.Options(timing="off", timeout=TIMEOUT), overrides)
    return result


def variant(name: str) -> Path:
    return FIXTURE / "variants" / f"{name}.ipynb"


@needs_jupyter
def test_the_reference_passes_every_check(task):
    r = grade(task, variant("pass"))
    assert r.verdict == Verdict.PASS, r.message
    assert (r.points, r.max_points) == (10, 10)
    assert [(t.name, t.outcome, t.points) for t in r.tests] == [
        ("running_mean of 1, 2, 3", "passed", 2.0),
        ("result", "passed", 1.0),
        ("check 3", "passed", 1.0),  # a check given as a plain string
    ]


@needs_jupyter
def test_failing_checks_are_wrong_with_partial_credit_and_their_messages(task):
    r = grade(task, variant("wrong"))
    assert r.verdict == Verdict.WRONG, r.message
    assert r.points == pytest.approx(2.5) and r.max_points == 10  # only `check 3` (1 of 4 points) passes
    assert "2 of 3 checks failed" in r.message
    assert "running_mean of 1, 2, 3: AssertionError: running_mean([1, 2, 3]) is [0.333" in r.message
    assert "at: ----> 1 assert result ==" in r.message  # the failing line, without terminal colours
    assert "\x1b[" not in r.message


@needs_jupyter
def test_a_cell_that_raises_is_wrong_and_named(task):
    r = grade(task, variant("raises"))
    assert r.verdict == Verdict.WRONG and r.points == 0
    assert r.message.startswith("cell 4 raised IndexError: list index out of range"), r.message
    assert "running_mean(data)[len(data)]" in r.message


@needs_jupyter
def test_a_dead_kernel_is_a_crash(task):
    r = grade(task, variant("crash"))
    assert r.verdict == Verdict.CRASH, r.message
    assert "kernel died (exit code 1) in cell 4" in r.message and "without encryption" not in r.message


@needs_jupyter
def test_a_cell_past_its_timeout_is_a_timeout_with_its_cell(task):
    r = grade(task, variant("timeout"))
    assert r.verdict == Verdict.TIMEOUT, r.message
    assert "cell 4 ran longer than 5 s" in r.message and r.points == 0


@needs_jupyter
def test_invalid_notebooks_are_wrong_with_nbformats_message(task, tmp_path):
    nb = json.loads(variant("pass").read_text())
    del nb["cells"][2]["outputs"]
    invalid = tmp_path / "invalid.ipynb"
    invalid.write_text(json.dumps(nb))
    truncated = tmp_path / "truncated.ipynb"
    truncated.write_text(variant("pass").read_text()[:300])
    (r,) = runner.grade([task], runner.Options(timing="off", timeout=TIMEOUT), {task.task_id: {SOURCE: invalid}})
    assert r.verdict == Verdict.WRONG and "not a valid notebook" in r.message and "'outputs'" in r.message, r.message
    (r,) = runner.grade([task], runner.Options(timing="off", timeout=TIMEOUT), {task.task_id: {SOURCE: truncated}})
    assert r.verdict == Verdict.WRONG and "not a valid notebook" in r.message, r.message


def test_the_untouched_skeleton_is_not_started(task):
    r = grade(task, None)
    assert r.verdict == Verdict.NOT_STARTED and SOURCE in r.message


def test_without_the_jupyter_packages_the_verdict_is_environment(task, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "nbformat", None)  # `import nbformat` now fails
    rec = Recorder(tmp_path, path=tmp_path / "r.json")
    job = ChildJob(spec=str(SPEC), sources={SOURCE: str(variant("pass"))}, timing="off")
    run_notebook(task, job, rec)
    assert rec.report.verdict == Verdict.ENVIRONMENT
    assert "pip install nbformat nbclient ipykernel" in rec.report.message


def test_the_fixture_skeleton_is_made_cell_by_cell():
    solution = variant("pass").read_text()  # the reference: kept by a student release
    student = (FIXTURE / SOURCE).read_text()
    assert student == make_skeleton(solution, SOURCE)
    regions = find_regions(student, SOURCE)
    assert [(r.cell, r.begin_line, r.tag) for r in regions] == [(3, 3, "fixtures/93"), (4, 2, "fixtures/93")]
    assert not_started(student, SOURCE) and not not_started(solution, SOURCE)
    cells = [c for c in json.loads(student)["cells"] if c["cell_type"] == "code"]
    assert all(c["outputs"] == [] and c["execution_count"] is None for c in cells)
    assert "result = None  # ~\n" in cells[1]["source"]
    first = json.loads(student)["cells"][0]
    assert first["cell_type"] == "markdown"
    assert all(field in "".join(first["source"]) for field in ("Implement:", "Contract:", "Test:"))


def test_one_cell_done_is_started_and_the_other_is_named():
    nb = json.loads((FIXTURE / SOURCE).read_text())
    nb["cells"][3]["source"] = [ln.replace("result = None  # ~", "result = [2.0]") for ln in nb["cells"][3]["source"]]
    text = json.dumps(nb)
    assert not not_started(text, SOURCE)
    (left,) = untouched_regions(text, SOURCE)
    assert left.cell == 3 and left.at(SOURCE) == f"{SOURCE}, cell 3, line 3"


def test_a_notebook_task_has_one_notebook():
    with pytest.raises(ValueError, match=r"one \.ipynb source"):
        NotebookTask(lab="lab5", number="01", title="t", sources=["01_t.py"])


@needs_jupyter
def test_a_task_process_forked_by_the_fork_server_runs_notebooks_too(task, forkserver_on):
    r = grade(task, variant("pass"))
    assert r.verdict == Verdict.PASS and len(r.tests) == 3, r.message
    assert len(forkserver_on) == 1  # it came from the fork server


def test_rules_read_a_notebooks_code_cells_and_name_the_cell(task):
    ruled = dataclasses.replace(task, rules=[Rule("forbid", r"\bstatistics\b", "no library for this")])
    text = (FIXTURE / SOURCE).read_text()
    assert check_source(ruled, text, SOURCE).verdict == Verdict.NOT_STARTED  # before any rule
    done = json.loads(variant("pass").read_text())
    assert check_source(ruled, json.dumps(done), SOURCE).verdict is None  # markdown cells are not code
    done["cells"][3]["source"] = ["# statistics.fmean would do\n", "import statistics\n", *done["cells"][3]["source"]]
    out = check_source(ruled, json.dumps(done), SOURCE)
    assert out.verdict == Verdict.RULE and out.message.startswith(f"{SOURCE}, cell 4, line 2: `statistics`")

"""Every notebook in the labs is a valid notebook, and those that need no GPU run headless.

Part of `make check`, which passes on any machine, CPU-only included:
  - every `lab*/**/*.ipynb` is validated with nbformat;
  - a notebook task's reference solution runs through the grader, its checks included, as
    `make test-labN SOLUTIONS=1` would grade it; the student's copy is an untouched skeleton,
    meant to fail, so it is only validated;
  - a notebook that is no task's (a demo, a walkthrough) runs as it stands, with nbclient;
  - a task that says `gpu=True`, or a notebook whose metadata says `"course": {"gpu": true}`, runs
    only where there is a GPU; where nbformat or nbclient is missing (the GPU runner lacks both),
    everything here is skipped with that reason. Nothing passes without having been checked.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from grader import paths, toolchain
from grader.parent import runner
from grader.records import Verdict
from grader.tasks import catalogue
from grader.tasks.notebook import NotebookTask

CELL_TIMEOUT = 600  # a demo notebook's cell, in seconds
NO_NOTEBOOKS = (
    "no notebooks in the labs yet (lab*/**/*.ipynb finds none): the notebook kind is tested on its fixture "
    "by grader/tests/test_kind_notebook.py"
)


@dataclass(frozen=True)
class Plan:
    path: Path
    task: NotebookTask | None  # the task this notebook belongs to, if any
    run: bool  # executed here; False: only validated (a student's skeleton)
    gpu: bool


def _metadata_gpu(path: Path) -> bool:
    """A demo notebook runs on the CPU unless its metadata says `"course": {"gpu": true}`."""
    try:
        return bool(json.loads(path.read_text()).get("metadata", {}).get("course", {}).get("gpu", False))
    except (ValueError, AttributeError):
        return False  # not a notebook: validation says so


def plan(labs: list[Path]) -> list[Plan]:
    roles: dict[Path, tuple[NotebookTask, bool]] = {}
    for lab in labs:
        for t in catalogue.lab_tasks(lab):
            if isinstance(t, NotebookTask):
                roles[paths.student_source(lab, t.source)] = (t, False)
                roles[paths.solution_source(lab, t.source)] = (t, True)
    out = []
    for lab in labs:
        for p in sorted(lab.rglob("*.ipynb")):
            if ".ipynb_checkpoints" in p.parts:
                continue
            if p in roles:
                task, is_solution = roles[p]
                out.append(Plan(p, task, is_solution, task.gpu))
            else:
                out.append(Plan(p, None, True, _metadata_gpu(p)))
    return out


PLANS = plan(paths.labs())


def _params(plans: list[Plan]) -> list[object]:
    if not plans:
        return [pytest.param(None, marks=pytest.mark.skip(reason=NO_NOTEBOOKS), id="none")]
    return [pytest.param(p, id=paths.rel(p.path)) for p in plans]


def _needs(*modules: str) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed: pip install nbformat nbclient ipykernel")


def validate(path: Path) -> None:
    import nbformat

    nbformat.validate(nbformat.read(path, as_version=4))


def execute(path: Path) -> None:
    """Runs a notebook as it stands, headless, in its own folder; raises on the first error."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3", shutdown_kernel="immediate")
    client.execute(cwd=str(path.parent))


def run_plan(p: Plan) -> None:
    if p.gpu and not toolchain.has_gpu():
        pytest.skip("needs a GPU (its task or its metadata says so)")
    if p.task is None:
        execute(p.path)
        return
    (r,) = runner.grade([p.task], runner.Options(solutions=True, timing="off"))
    assert r.verdict == Verdict.PASS, f"{r.verdict}: {r.message}"


@pytest.mark.parametrize("p", _params(PLANS))
def test_notebook_is_valid(p: Plan) -> None:
    _needs("nbformat")
    validate(p.path)


@pytest.mark.parametrize("p", _params([p for p in PLANS if p.run]))
def test_notebook_runs_headless(p: Plan) -> None:
    _needs("nbformat", "nbclient", "ipykernel")
    run_plan(p)


def _notebook(path: Path, code: str, metadata: dict[str, object] | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    cell = {"cell_type": "code", "execution_count": None, "id": "c", "metadata": {}, "outputs": [], "source": code}
    nb = {"cells": [cell], "metadata": metadata or {}, "nbformat": 4, "nbformat_minor": 5}
    path.write_text(json.dumps(nb))


def test_what_runs_where(tmp_path: Path) -> None:
    """The plan on a made-up lab: a task's skeleton is validated, its solution and demos run, a GPU
    demo only with a GPU; and a demo really runs headless here."""
    lab = tmp_path / "lab97"
    (lab / "tests").mkdir(parents=True)
    (lab / "tests" / "test_01_walk.py").write_text(
        "from grader.tasks import NotebookTask\n\n"
        "TASK = NotebookTask(lab='lab97', number='01', title='t', sources=['01_walk.ipynb'])\n"
    )
    _notebook(lab / "01_walk.ipynb", "x = 1")
    _notebook(lab / "solutions" / "01_walk.ipynb", "x = 2")
    _notebook(lab / "demo" / "on_gpu.ipynb", "import torch", {"course": {"gpu": True}})
    _notebook(lab / "demo" / "on_cpu.ipynb", "assert sum(range(4)) == 6")
    got = {paths.rel(p.path).removeprefix(str(lab) + "/"): (p.task is not None, p.run, p.gpu) for p in plan([lab])}
    assert got == {
        "01_walk.ipynb": (True, False, False),
        "solutions/01_walk.ipynb": (True, True, False),
        "demo/on_gpu.ipynb": (False, True, True),
        "demo/on_cpu.ipynb": (False, True, False),
    }
    _needs("nbformat", "nbclient", "ipykernel")
    for p in plan([lab]):
        validate(p.path)
    execute(lab / "demo" / "on_cpu.ipynb")
    _notebook(lab / "demo" / "broken.ipynb", "assert False, 'demo fails'")
    with pytest.raises(Exception, match="demo fails"):
        execute(lab / "demo" / "broken.ipynb")

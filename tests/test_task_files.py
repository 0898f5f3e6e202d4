"""Task files follow the course's conventions, and skeletons never drift from their solutions.

Every file a task names in `sources` is covered, whatever its kind: a CUDA file (`//` regions),
a module of a Python package (`#` regions) or a notebook (`#` regions in its code cells). The
file's name picks how it is read (grader/tasks/regions.py).
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from grader import paths
from grader.instructor import skeletons
from grader.tasks import catalogue
from grader.tasks.regions import find_regions, has_code, is_notebook, not_started
from grader.tasks.spec import Task

TASKS = catalogue.all_tasks()
PAIRS = skeletons.pairs()
HAS_SOLUTIONS = bool(PAIRS)
needs_solutions = pytest.mark.skipif(not HAS_SOLUTIONS, reason="no reference solutions here (a student release)")
# a file at the top of a lab named like a task (`03_saxpy.cu`, `02_attention.ipynb`) must be one
TASK_FILE = re.compile(r"^\d\d_.+\.(cu|cuh|cpp|py|ipynb)$")


def _task_files() -> list[tuple[Task, Path]]:
    return [(t, paths.student_source(t.lab_dir(), rel)) for t in TASKS for rel in t.sources]


def _ids(item: tuple[Task, Path]) -> str:
    return paths.rel(item[1])


def header(path: Path) -> str:
    """What introduces a task file: the comments before `#include`, a module's docstring and
    leading comments, or a notebook's first cell."""
    text = path.read_text()
    if is_notebook(path.name):
        cells = json.loads(text).get("cells", [])
        src = cells[0].get("source", "") if cells else ""
        return "".join(src) if isinstance(src, list) else src
    if path.suffix == ".py":
        comments = "\n".join(ln for ln in text.splitlines() if ln.startswith("#"))
        return (ast.get_docstring(ast.parse(text)) or "") + "\n" + comments.split("TODO(")[0]
    return text.split("#include")[0]


@needs_solutions
def test_skeletons_match_their_solutions():
    assert skeletons.drifted() == [], "run `make skeletons`"


@pytest.mark.parametrize("item", _task_files(), ids=_ids)
def test_task_file_header_and_todo_tags(item):
    task, student = item
    where = paths.rel(student)
    assert student.exists(), f"{task.task_id} names {where}, which does not exist"
    head = header(student)
    for field in ("Implement:", "Contract:", "Test:"):
        assert field in head, f"{where}: the header lacks `{field}`"
    assert f"make test-{task.lab} TASK={task.number}" in head
    regions = find_regions(student.read_text(), where)
    assert regions, "a task file needs at least one TODO region"
    assert {r.tag for r in regions} == {task.task_id}, "TODO tags must name this task"
    assert all(r.hint for r in regions), "every TODO begin line carries a hint"


def test_python_skeletons_are_valid_python():
    """A region that is a whole body must keep a stub line (`#~ raise NotImplementedError`)."""
    students = [student for _, student in _task_files() if student.suffix == ".py"]
    if not students:
        pytest.skip("no Python task files in the labs yet (the kind is tested on its fixture)")
    for student in students:
        compile(student.read_text(), paths.rel(student), "exec")


@pytest.mark.parametrize("item", _task_files(), ids=_ids)
def test_student_file_reads_as_not_started(item):
    _, student = item
    if HAS_SOLUTIONS:
        assert not_started(student.read_text(), paths.rel(student))


@needs_solutions
@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: paths.rel(p[0]))
def test_solution_fills_every_region(pair):
    solution, _ = pair
    where = paths.rel(solution)
    text = solution.read_text()
    assert not not_started(text, where)
    for r in find_regions(text, where):
        assert has_code(r), f"{r.at(where)}: empty region in a solution"


def test_every_task_file_has_a_spec_and_back():
    for lab in paths.labs():
        tasks = catalogue.lab_tasks(lab)
        # a torch extension's course_sources (its binding) sit beside the student's files, owned by the spec
        claimed = {
            paths.student_source(lab, rel): t for t in tasks for rel in [*t.sources, *getattr(t, "course_sources", ())]
        }
        missing = sorted(paths.rel(p) for p in claimed if not p.exists())
        assert not missing, f"{lab.name}: specs name files that do not exist: {missing}"
        files = {p for p in lab.iterdir() if p.is_file() and TASK_FILE.match(p.name)}
        orphans = sorted(p.name for p in files if p not in claimed)
        assert not orphans, f"{lab.name}: task files without a spec: {orphans}"
        students = {paths.student_source(lab, rel) for t in tasks for rel in t.sources}
        misnamed = sorted(p.name for p in files & students if Path(claimed[p].spec_file).name != f"test_{p.stem}.py")
        assert not misnamed, f"{lab.name}: task files whose spec is not tests/test_<their name>.py: {misnamed}"


SECTION_HINT = re.compile(r"""the chapter's section ["“]([^"”]+)["”]""")


def test_every_section_a_todo_names_is_in_its_chapter():
    """A TODO's hint `see the chapter's section "X"` names a heading of its lab's chapter: its README.md
    and the Markdown files beside it (lab 2's chapter is three files)."""
    for lab in paths.labs():
        headings = {
            line.lstrip("#").strip()
            for doc in lab.glob("*.md")
            for line in doc.read_text().splitlines()
            if line.startswith("#")
        }
        missing = []
        for task in catalogue.lab_tasks(lab):
            for rel in task.sources:
                sol = paths.solution_source(lab, rel)
                if not sol.exists():
                    continue
                for name in SECTION_HINT.findall(sol.read_text()):
                    # a heading may number itself or name its task: "7. Pinned memory ... (task 06)"
                    if not any(name == h or name in h for h in headings):
                        missing.append(f"{paths.rel(sol)}: {name!r}")
        assert not missing, f"{lab.name}: TODO hints name sections the chapter does not have: {sorted(set(missing))}"


@pytest.mark.parametrize(
    "task",
    [t for t in catalogue.all_tasks() if t.kind == "torch_ext"],
    ids=lambda t: t.task_id,
)
def test_an_extensions_student_files_include_no_torch_header(task):
    """The files a student edits in a PyTorch-extension task leave torch's headers to the course's
    binding: through nvcc or g++ they cost tens of seconds a build, and ninja recompiles an edited
    file on every run (grader/tasks/torch_ext.py says so too)."""
    heavy = re.compile(r'^\s*#\s*include\s*[<"](torch/|ATen/|c10/|pybind11/)', re.M)
    for rel in task.sources:
        if rel.endswith((".cu", ".cpp", ".cc", ".cxx")):
            text = (task.lab_dir() / rel).read_text(encoding="utf-8")
            assert not heavy.search(text), f"{task.task_id}: {rel} includes a torch header: move it to a course file"

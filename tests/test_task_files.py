"""Task files follow the course's conventions, and skeletons never drift from their solutions."""

from __future__ import annotations

import re

import pytest

from grader import paths
from grader.instructor import skeletons
from grader.tasks import catalogue
from grader.tasks.regions import find_regions, not_started

PAIRS = skeletons.pairs()
HAS_SOLUTIONS = bool(PAIRS)
needs_solutions = pytest.mark.skipif(not HAS_SOLUTIONS, reason="no reference solutions here (a student release)")


def _task_files():
    return sorted(p for lab in paths.labs() for p in lab.glob("[0-9][0-9]_*.cu"))


@needs_solutions
def test_skeletons_match_their_solutions():
    assert skeletons.drifted() == [], "run `make skeletons`"


@pytest.mark.parametrize("student", _task_files(), ids=lambda p: paths.rel(p))
def test_task_file_header_and_todo_tags(student):
    text = student.read_text()
    lab, number = student.parent.name, student.name[:2]
    head = text.split("#include")[0]
    for field in ("Implement:", "Contract:", "Test:"):
        assert field in head, f"{paths.rel(student)}: the header lacks `{field}`"
    assert f"make test-{lab} TASK={number}" in head
    regions = find_regions(text, paths.rel(student))
    assert regions, "a task file needs at least one TODO region"
    assert {r.tag for r in regions} == {f"{lab}/{number}"}, "TODO tags must name this task"
    assert all(r.hint for r in regions), "every TODO begin line carries a hint"


@pytest.mark.parametrize("student", _task_files(), ids=lambda p: paths.rel(p))
def test_student_file_reads_as_not_started(student):
    if HAS_SOLUTIONS:
        assert not_started(student.read_text())


@needs_solutions
@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: paths.rel(p[0]))
def test_solution_fills_every_region(pair):
    solution, _ = pair
    assert not not_started(solution.read_text())
    for r in find_regions(solution.read_text()):
        assert any(line.strip() and not line.strip().startswith("//") for line in r.body), (
            f"{paths.rel(solution)}:{r.begin_line}: empty region in a solution"
        )


def test_every_task_file_has_a_spec_and_back():
    for lab in paths.labs():
        specs = {re.sub(r"^test_", "", p.stem) for p in catalogue.spec_files(lab)}
        files = {p.stem for p in lab.glob("[0-9][0-9]_*.cu")}
        assert specs == files, f"{lab.name}: task files {sorted(files)} vs specs {sorted(specs)}"

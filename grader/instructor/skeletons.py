"""Keeps the student files in step with the reference solutions they are generated from.

The pairs come from the task catalogue, not from a glob of `solutions/`: a task's `sources`
(relative to its lab) name both the student file, `labN/<rel>`, and its solution,
`labN/solutions/<rel>`, whatever the kind (a `.cu`, a module inside a Python package, a
notebook). Files under `solutions/` that no task names (lab 1's `broken.py`, helpers) are not
task files and are left alone. The file name picks the TODO comment style (regions.py).
"""

from __future__ import annotations

from pathlib import Path

from grader import paths
from grader.tasks import catalogue
from grader.tasks.regions import make_skeleton


def pairs() -> list[tuple[Path, Path]]:
    """(solution, student file) for every task source that has a reference solution in this tree."""
    found: list[tuple[Path, Path]] = []
    for task in catalogue.all_tasks():
        lab = task.lab_dir()
        for rel in task.sources:
            sol = paths.solution_source(lab, rel)
            if sol.exists() and (sol, lab / rel) not in found:
                found.append((sol, paths.student_source(lab, rel)))
    return found


def skeleton_of(solution: Path) -> str:
    return make_skeleton(solution.read_text(), paths.rel(solution))


def _stale() -> list[tuple[Path, str]]:
    """(student file, the text it should have) for every student file that differs."""
    out = []
    for sol, student in pairs():
        want = skeleton_of(sol)
        if not student.exists() or student.read_text() != want:
            out.append((student, want))
    return out


def drifted() -> list[str]:
    """Student files that differ from what their solution generates."""
    return [paths.rel(student) for student, _ in _stale()]


def write_all() -> list[str]:
    """Regenerates the stale student files; returns their names."""
    stale = _stale()
    for student, want in stale:
        student.parent.mkdir(parents=True, exist_ok=True)
        student.write_text(want)
    return [paths.rel(student) for student, _ in stale]

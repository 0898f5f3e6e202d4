"""Keeps the student files in step with the reference solutions they are generated from."""

from __future__ import annotations

from pathlib import Path

from grader import paths
from grader.regions import make_skeleton


def pairs() -> list[tuple[Path, Path]]:
    """(solution, student file) for every task that has a reference solution in this tree."""
    found = []
    for lab in paths.labs():
        for sol in sorted((lab / "solutions").glob("*.cu")):
            found.append((sol, lab / sol.name))
    return found


def drifted() -> list[str]:
    """Student files that differ from what their solution generates."""
    out = []
    for sol, student in pairs():
        want = make_skeleton(sol.read_text(), paths.rel(sol))
        if not student.exists() or student.read_text() != want:
            out.append(paths.rel(student))
    return out


def write_all() -> list[str]:
    written = []
    for sol, student in pairs():
        want = make_skeleton(sol.read_text(), paths.rel(sol))
        if not student.exists() or student.read_text() != want:
            student.write_text(want)
            written.append(paths.rel(student))
    return written

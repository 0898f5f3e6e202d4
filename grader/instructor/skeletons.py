"""Keeps the student files in step with the reference solutions they are generated from."""

from __future__ import annotations

from pathlib import Path

from grader import paths
from grader.tasks.regions import make_skeleton


def pairs() -> list[tuple[Path, Path]]:
    """(solution, student file) for every task that has a reference solution in this tree."""
    found = []
    for lab in paths.labs():
        for sol in sorted((lab / "solutions").glob("*.cu")):
            found.append((sol, lab / sol.name))
    return found


def _stale() -> list[tuple[Path, str]]:
    """(student file, the text it should have) for every student file that differs."""
    out = []
    for sol, student in pairs():
        want = make_skeleton(sol.read_text(), paths.rel(sol))
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
        student.write_text(want)
    return [paths.rel(student) for student, _ in stale]

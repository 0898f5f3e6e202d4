"""Scripts that run a lab's packages outside the grader (benchmarks, `make generate`) import them
from here: the lab's own files, or with `solutions` the reference solutions put over them.

    from grader.staging import use_packages
    use_packages(LAB, ["../lab4/kiln", "kiln_llm", "llama"], solutions=args.solutions)
    import kiln, llama            # the staged copies

Names are relative to the lab folder, `../labN/<path>` for another lab's (grader.paths.lab_file),
as a PythonTask names them; each is importable by its last path component.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from grader import paths

_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc")


def stage_packages(lab: Path, packages: Sequence[str], dest: Path, *, solutions: bool) -> None:
    """Copies each package into `dest`, with its reference solutions over it when `solutions`."""
    for name in packages:
        home, inner = paths.lab_file(lab, name)
        target = dest / Path(inner).name
        shutil.copytree(home / inner, target, ignore=_IGNORE, dirs_exist_ok=True)
        solved = home / "solutions" / inner
        if solutions and solved.is_dir():
            shutil.copytree(solved, target, ignore=_IGNORE, dirs_exist_ok=True)


def use_packages(lab: Path, packages: Sequence[str], *, solutions: bool) -> Path | None:
    """Makes `packages` and the grader importable, first on sys.path. The student's files are
    imported in place; the solutions from a staged copy in a temporary folder (returned)."""
    for entry in (str(paths.ROOT), *(str(paths.lab_file(lab, p)[0]) for p in reversed(packages))):
        if entry in sys.path:
            sys.path.remove(entry)
        sys.path.insert(0, entry)
    if not solutions:
        return None
    staged = Path(tempfile.mkdtemp(prefix=f"{lab.name}-solutions-"))
    stage_packages(lab, packages, staged, solutions=True)
    sys.path.insert(0, str(staged))
    return staged

"""Scripts that run a lab's packages outside the grader (benchmarks, `make generate`) import them
from here: the lab's own files, or with `solutions` the reference solutions put over them.

    from grader.staging import use_packages
    use_packages(LAB, ["../lab4/kiln", "kiln_llm", "llama"], solutions=args.solutions)
    import kiln, llama            # the staged copies

Names are relative to the lab folder, `../labN/<path>` for another lab's (grader.paths.lab_file),
as a PythonTask names them; each is importable by its last path component.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from grader import paths

_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc")


def stage_packages(lab: Path, packages: Sequence[str], dest: Path, *, solutions: bool) -> None:
    """Copies each package (or single file: lab 7's kernels beside its package) into `dest`, with
    its reference solutions over it when `solutions`."""
    for name in packages:
        home, inner = paths.lab_file(lab, name)
        target = dest / Path(inner).name
        solved = home / "solutions" / inner
        if (home / inner).is_file():
            shutil.copyfile(solved if solutions and solved.is_file() else home / inner, target)
            continue
        shutil.copytree(home / inner, target, ignore=_IGNORE, dirs_exist_ok=True)
        if solutions and solved.is_dir():
            shutil.copytree(solved, target, ignore=_IGNORE, dirs_exist_ok=True)


def _files(folder: Path) -> dict[Path, bytes]:
    return {
        p.relative_to(folder): p.read_bytes()
        for p in folder.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }


def sync_staged(lab: Path, packages: Sequence[str], dest: Path) -> None:
    """`dest` made to hold the staged solutions (stage_packages), writing only the files that
    changed and removing those that went: a file that stays the same keeps its path and bytes, so
    the kernels built from it last time are found in the build cache (grader/build/nvcc.py)."""
    with tempfile.TemporaryDirectory(prefix=f"{lab.name}-staging-") as tmp:
        stage_packages(lab, packages, Path(tmp), solutions=True)
        want = _files(Path(tmp))
    have = _files(dest) if dest.is_dir() else {}
    for rel, data in want.items():
        if have.get(rel) != data:
            out = dest / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            part = out.with_name(f".{out.name}.{os.getpid()}")
            part.write_bytes(data)
            part.replace(out)  # whole or not at all, for a process importing it at the same time
    for rel in have.keys() - want.keys():
        (dest / rel).unlink(missing_ok=True)


def use_packages(lab: Path, packages: Sequence[str], *, solutions: bool) -> Path | None:
    """Makes `packages` and the grader importable, first on sys.path. The student's files are
    imported in place; the solutions from a staged copy (returned) in .build/staged/<lab>-solutions,
    the same folder every run, so that a second run finds the first one's kernels built."""
    for entry in (str(paths.ROOT), *(str(paths.lab_file(lab, p)[0]) for p in reversed(packages))):
        if entry in sys.path:
            sys.path.remove(entry)
        sys.path.insert(0, entry)
    if not solutions:
        return None
    staged = paths.BUILD / "staged" / f"{lab.name}-solutions"
    sync_staged(lab, packages, staged)
    sys.path.insert(0, str(staged))
    return staged

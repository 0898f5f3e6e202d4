"""`make release DEST=dir`: the student tree, without reference solutions."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from grader import paths

# instructor-only: the labs' solutions, the benchmark that edits them, and CI that grades them.
# The grader's own fixture tasks (grader/tests/fixtures) stay: they are not course content.
EXCLUDE_FILES = {".github/workflows/gpu.yml"}


def instructor_only(rel: Path) -> bool:
    lab_solution = rel.parts[0].startswith("lab") and "solutions" in rel.parts
    return lab_solution or rel.parts[0] == "benchmarks" or str(rel) in EXCLUDE_FILES


def tracked_files() -> list[Path]:
    """Files git tracks, plus new ones it does not ignore."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=paths.ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return [Path(p) for p in out.stdout.split("\0") if p]


def release(dest: Path) -> list[Path]:
    dest = dest.resolve()
    if dest == paths.ROOT or paths.ROOT in dest.parents:
        raise ValueError(f"DEST must be outside the repository, not {dest}")
    if dest.exists() and any(dest.iterdir()):
        raise ValueError(f"{dest} exists and is not empty: choose a new folder")
    copied = []
    for rel in tracked_files():
        if instructor_only(rel):
            continue
        src = paths.ROOT / rel
        if not src.exists():
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
        copied.append(rel)
    return copied

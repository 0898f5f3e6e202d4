"""`make release` exports a student tree without solutions, and that tree's own checks pass."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from grader import paths
from grader.instructor import skeletons


@pytest.mark.skipif(
    not skeletons.pairs() or not (paths.ROOT / ".git").exists(),
    reason="needs the instructor repository (git checkout with solutions)",
)
def test_release_has_no_solutions_and_passes_its_checks(tmp_path):
    dest = tmp_path / "student"
    out = subprocess.run(
        [sys.executable, "-m", "grader", "release", str(dest)], cwd=paths.ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert not list(dest.glob("lab*/**/solutions")), "solutions leaked into the release"
    assert not (dest / "benchmarks").exists()
    assert (dest / "lab1" / "01_vector_add.cu").exists() and (dest / "Makefile").exists()
    shutil.copytree(paths.ROOT / ".build", dest / ".build", dirs_exist_ok=True) if (
        paths.ROOT / ".build"
    ).exists() else None
    env = {**os.environ, "GRADER_NO_GPU": "1"}
    check = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "grader/tests",
            "tests",
            "-q",
            "-p",
            "no:cacheprovider",
            "-k",
            "not release and not forkserver",
        ],
        cwd=dest,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert check.returncode == 0, check.stdout[-3000:]

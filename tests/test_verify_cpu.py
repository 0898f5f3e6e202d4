"""`make verify` without a GPU: everything compiles, skeletons read as not started, checks can fail."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from grader import paths
from grader.instructor import broken, skeletons
from tests.conftest import build_everything

needs_solutions = pytest.mark.skipif(not skeletons.pairs(), reason="no reference solutions here (a student release)")


def verify(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """`python -m grader verify ARGS` from the repository root, as on a machine without a GPU."""
    return subprocess.run(
        [sys.executable, "-m", "grader", "verify", *args],
        cwd=paths.ROOT,
        env={**os.environ, "GRADER_NO_GPU": "1"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@needs_solutions
def test_verify_on_the_cpu_passes():
    # --no-variants and --no-calibration: tests/test_broken_variants.py grades every variant a CPU can
    # grade and tests/test_calibration.py calibrates every task, one test each (verify's own passes
    # would do both a second time in the same CI run)
    out = verify("--no-variants", "--no-calibration", timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "compiles, not started" in out.stdout
    assert not (build_everything() and "not built" in out.stdout), out.stdout


@needs_solutions
def test_verify_one_task_grades_only_its_variants():
    # --task splits a lab over GPUs: the selected task alone, its own variants and classes, no others'
    out = verify("lab4", "--task", "01", "--jobs", "1", timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "verifying 1 tasks" in out.stdout and "lab4/01" in out.stdout and "lab4/02" not in out.stdout
    mine = [n for n in broken.catalogue_of("lab4").VARIANTS if n.startswith("01_")]
    assert f"lab4: the grader catches {len(mine)} of {len(mine)} broken variants graded" in out.stdout
    none = verify("lab4", "--task", "99", timeout=120)
    assert none.returncode == 2 and "no task matches '99'" in none.stdout

"""`make verify` without a GPU: everything compiles, skeletons read as not started, checks can fail."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from grader import paths
from grader.instructor import skeletons


@pytest.mark.skipif(not skeletons.pairs(), reason="no reference solutions here (a student release)")
def test_verify_on_the_cpu_passes():
    env = {**os.environ, "GRADER_NO_GPU": "1"}
    # --no-variants: tests/test_broken_variants.py grades every variant a CPU can grade, one test each
    # (verify's variant pass would grade them all a second time in the same CI run)
    out = subprocess.run(
        [sys.executable, "-m", "grader", "verify", "--no-variants"],
        cwd=paths.ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "compiles, not started" in out.stdout


@pytest.mark.skipif(not skeletons.pairs(), reason="no reference solutions here (a student release)")
def test_verify_one_task_grades_only_its_variants():
    # --task splits a lab over GPUs: the selected task alone, its own variants and classes, no others'
    env = {**os.environ, "GRADER_NO_GPU": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "grader", "verify", "lab4", "--task", "01", "--jobs", "1"],
        cwd=paths.ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "verifying 1 tasks" in out.stdout and "lab4/01" in out.stdout and "lab4/02" not in out.stdout
    from grader.instructor import broken

    mine = [n for n in broken.catalogue_of("lab4").VARIANTS if n.startswith("01_")]
    assert f"lab4: the grader catches {len(mine)} of {len(mine)} broken variants graded" in out.stdout
    none = subprocess.run(
        [sys.executable, "-m", "grader", "verify", "lab4", "--task", "99"],
        cwd=paths.ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert none.returncode == 2 and "no task matches '99'" in none.stdout

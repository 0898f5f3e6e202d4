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

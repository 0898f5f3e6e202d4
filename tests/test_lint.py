"""The Python code stays ruff-clean (skipped where ruff is not installed, e.g. an offline GPU runner)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from grader import paths


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None, reason="ruff not installed: pip install ruff")
def test_ruff_check_passes():
    dirs = ["grader", "tests", *[p.name for p in paths.labs()]]
    dirs += ["benchmarks"] if (paths.ROOT / "benchmarks").exists() else []
    out = subprocess.run([sys.executable, "-m", "ruff", "check", *dirs], cwd=paths.ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr

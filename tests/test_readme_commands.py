"""Every make command the READMEs show exists in the Makefile."""

from __future__ import annotations

import re
import subprocess

from grader import paths

READMES = [paths.ROOT / "README.md", *sorted(paths.ROOT.glob("lab*/README.md"))]


def _targets() -> set[str]:
    text = (paths.ROOT / "Makefile").read_text()
    return set(re.findall(r"^([a-zA-Z0-9_-]+):", text, flags=re.M))


def test_make_commands_in_readmes_exist():
    targets = _targets()
    missing = []
    for readme in READMES:
        for target in re.findall(r"(?:^|`)make ([a-z][a-z0-9-]*)", readme.read_text(), flags=re.M):
            if target not in targets:
                missing.append(f"{paths.rel(readme)}: make {target}")
    assert not missing, missing


def test_make_help_lists_every_documented_target():
    out = subprocess.run(["make", "-s", "help"], cwd=paths.ROOT, capture_output=True, text=True).stdout
    for target in (
        "test-lab1",
        "test-lab5",
        "check",
        "verify",
        "grade",
        "bench-lab1",
        "sanitize-lab1",
        "release",
        "clean",
    ):
        assert target in out

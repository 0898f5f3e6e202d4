"""Every make command the READMEs and the labs' chapter files show exists in the Makefile."""

from __future__ import annotations

import re
import subprocess

from grader import paths

READMES = [
    paths.ROOT / "README.md",
    paths.ROOT / "grader" / "README.md",
    paths.ROOT / "grader" / "instructor" / "README.md",
    *sorted(paths.ROOT.glob("lab*/*.md")),  # a lab's README.md and its chapter files (lab 2 has three)
]


def _targets() -> list[re.Pattern[str]]:
    """Every target the Makefile defines, pattern rules (`test-lab%`) included."""
    text = (paths.ROOT / "Makefile").read_text()
    names = re.findall(r"^([a-zA-Z0-9_%-]+):", text, flags=re.M)
    return [re.compile(re.escape(n).replace("%", r"[0-9]+") + "$") for n in names]


def test_make_commands_in_readmes_exist():
    targets = _targets()
    missing = []
    for readme in READMES:
        for target in re.findall(r"(?:^|`)make ([a-z][a-zA-Z0-9-]*)", readme.read_text(), flags=re.M):
            target = target.replace("labN", "lab1")  # `make sanitize-labN` names the pattern rule
            if not any(t.match(target) for t in targets):
                missing.append(f"{paths.rel(readme)}: make {target}")
    assert not missing, missing


def test_make_help_lists_every_documented_target():
    out = subprocess.run(["make", "-s", "help"], cwd=paths.ROOT, capture_output=True, text=True).stdout
    for target in (
        "test-labN",
        "sanitize-labN",
        "bench-labN",
        "profile-labN",
        "check",
        "verify",
        "grade",
        "release",
        "clean",
    ):
        assert target in out

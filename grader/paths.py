"""Where things live: the repo root, labs, task sources and build outputs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INCLUDE = ROOT / "grader" / "include"
BUILD = ROOT / ".build"
LAB_RE = re.compile(r"lab(\d+)$")


def labs() -> list[Path]:
    return sorted((p for p in ROOT.iterdir() if p.is_dir() and LAB_RE.match(p.name)), key=lambda p: int(p.name[3:]))


def student_source(lab: Path, name: str) -> Path:
    return lab / name


def solution_source(lab: Path, name: str) -> Path:
    return lab / "solutions" / name


def rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)

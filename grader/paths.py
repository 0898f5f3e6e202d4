"""Where things live: the repo root, labs, task sources and build outputs."""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parent.parent
INCLUDE = ROOT / "grader" / "include"
BUILD = ROOT / ".build"
LAB_RE = re.compile(r"lab(\d+)$")


def labs() -> list[Path]:
    return sorted((p for p in ROOT.iterdir() if p.is_dir() and LAB_RE.match(p.name)), key=lambda p: int(p.name[3:]))


def lab_file(lab: Path, name: str) -> tuple[Path, str]:
    """(lab folder, path inside it) of a file a task names: `kiln/cpu.py` is in `lab` itself,
    `../lab4/kiln/cpu.py` in lab 4 (lab 5's compiler is lab 4's, extended)."""
    parts = PurePosixPath(name).parts
    if not parts or parts[0] != "..":
        return lab, name
    if len(parts) < 3 or not LAB_RE.match(parts[1]):
        raise ValueError(f"{name!r}: a file of another lab is named ../labN/<path>")
    return ROOT / parts[1], str(PurePosixPath(*parts[2:]))


def student_source(lab: Path, name: str) -> Path:
    home, inner = lab_file(lab, name)
    return home / inner


def solution_source(lab: Path, name: str) -> Path:
    home, inner = lab_file(lab, name)
    return home / "solutions" / inner


def rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def write_atomically(path: Path, text: str) -> None:
    """`text` into `path` whole or not at all, for readers and for other processes or machines
    writing the same file (gradebook shards, make check's workers building one unit): a temporary
    file beside it (named per machine and process), then a rename."""
    tmp = path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, newline="")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)

"""Broken variants written as edits to a working file, the way `lab1/solutions/broken.py` keeps
lab 1's: an edit that no longer applies fails loudly instead of grading a stale copy."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from grader import paths

Edits = Sequence[tuple[str, str]]  # (text in the working file, what replaces it)


class Variant(NamedTuple):
    """A broken variant of a lab's reference solution (labN/solutions/broken.py) and the verdict
    the grader must give it (tests/test_broken_variants.py)."""

    solution: str  # file in labN/solutions/
    edits: list[tuple[str, str]]  # (text in the solution, what replaces it)
    verdicts: set[str]  # any of these is right
    words: str  # the message must contain this (case-insensitive)
    why: str
    huge: bool = False  # caught only by the cases past 2^31 elements (make grade)
    timing: bool = False  # caught only when the timed calls run: graded with timing on (see TIMED)
    perf_points: float | None = None  # the performance points it must earn (a slow `pass`: 0); needs timing


def materialize(base: Path, edits: Edits, name: str, why: str) -> Path:
    """`base` with `edits` applied, written under .build/variants/<name>/ with the same file name
    and a first line that says what is broken."""
    out = paths.BUILD / "variants" / name / base.name
    out.parent.mkdir(parents=True, exist_ok=True)
    if base.suffix == ".ipynb":
        text = _edited_notebook(base, edits, name, why)
    else:
        text = base.read_text()
        for old, new in edits:
            assert old in text, f"{name}: the edit no longer applies to {paths.rel(base)}: {old!r}"
            text = text.replace(old, new)
        mark = "#" if base.suffix == ".py" else "//"
        if not text.startswith(("#!", '"""')) or base.suffix != ".py":
            text = f"{mark} BROKEN ON PURPOSE ({why})\n{text}"
    if not out.exists() or out.read_text() != text:  # unchanged files keep their build caches warm
        out.write_text(text)
    return out


def _edited_notebook(base: Path, edits: Edits, name: str, why: str) -> str:
    """A notebook's edits apply to the source of its code cells (as a student reads them, not as
    JSON escapes them); what is broken goes in the notebook's metadata, which keeps it valid."""
    nb = json.loads(base.read_text())
    cells = [c for c in nb["cells"] if c.get("cell_type") == "code"]
    for old, new in edits:
        for cell in cells:
            source = "".join(cell["source"])
            if old in source:
                cell["source"] = source.replace(old, new).splitlines(keepends=True)
                break
        else:
            raise AssertionError(f"{name}: the edit no longer applies to {paths.rel(base)}: {old!r}")
    nb.setdefault("metadata", {})["broken_on_purpose"] = why
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def processes_with(tag: str) -> list[int]:
    """The processes whose command line holds `tag`: what a hostile variant left running."""
    pids = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and tag.encode() in (d / "cmdline").read_bytes():
                pids.append(int(d.name))
        except OSError:
            pass
    return pids

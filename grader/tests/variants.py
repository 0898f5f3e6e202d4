"""Helpers for the grader's own tests of hostile variants (the variants themselves, and how they
are written as edits, are in grader/instructor/broken.py)."""

from __future__ import annotations

from pathlib import Path


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

"""Honest alternatives: correct solutions written differently from the reference, that must pass.

A grader tuned against one reference can reject a right answer that adds in another order,
tiles another way or peels its unaligned head differently. Each lab's
`labN/solutions/alternatives.py` lists such solutions as edits to the reference (as broken
variants are written, grader/instructor/broken.py); `tests/test_honest_alternatives.py` grades
each under several secret seeds and requires `pass` every time.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

from grader import paths, toolchain
from grader.instructor.broken import materialize, one_per_task, task_of
from grader.records import TaskResult, TimingMode

SEEDS = ("1", "2", "3")  # GRADER_SEED values each alternative is graded under


class Alternative(NamedTuple):
    """A correct solution written differently from the reference, as edits to it."""

    solution: str  # file in labN/solutions/
    edits: list[tuple[str, str]]  # (text in the solution, what replaces it)
    why: str  # how it differs from the reference


def labs() -> list[str]:
    return [lab.name for lab in paths.labs() if (lab / "solutions" / "alternatives.py").exists()]


def catalogue_of(lab: str) -> ModuleType:
    """`labN/solutions/alternatives.py`: ALTERNATIVES, name -> Alternative."""
    spec = importlib.util.spec_from_file_location(
        f"{lab}_alternatives", paths.ROOT / lab / "solutions" / "alternatives.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sources(lab: str, name: str) -> dict[str, Path]:
    """The files an alternative is graded with: its own, and the task's others as solved."""
    alt = catalogue_of(lab).ALTERNATIVES[name]
    task = task_of(lab, name)
    files = {
        rel: paths.solution_source(task.lab_dir(), rel) for rel in [*task.sources, *getattr(task, "builds_on", ())]
    }
    files[alt.solution] = materialize(
        paths.ROOT / lab / "solutions" / alt.solution, alt.edits, f"{lab}-honest-{name}", f"honest: {alt.why}"
    )
    return files


@contextmanager
def secret_seed(seed: str) -> Iterator[None]:
    """GRADER_SEED set for the grading process (it derives every task's key from it)."""
    old = os.environ.get("GRADER_SEED")
    os.environ["GRADER_SEED"] = seed
    try:
        yield
    finally:
        if old is None:
            del os.environ["GRADER_SEED"]
        else:
            os.environ["GRADER_SEED"] = old


def grade_lab(lab: str, seed: str, timing: TimingMode = TimingMode.OFF) -> dict[str, TaskResult]:
    """Every alternative of `lab`, graded under GRADER_SEED=`seed`, one per task in a run; those of
    tasks needing more GPUs than this machine shows are left out (the grader would skip them)."""
    from grader.parent import runner

    out: dict[str, TaskResult] = {}
    seen = toolchain.visible_gpu_count()
    names = [n for n in sorted(catalogue_of(lab).ALTERNATIVES) if task_of(lab, n).gpus <= seen]
    with secret_seed(seed):
        for batch in one_per_task(names):
            tasks = [task_of(lab, n) for n in batch]
            files = {t.task_id: sources(lab, n) for t, n in zip(tasks, batch, strict=True)}
            results = runner.grade(tasks, runner.Options(timing=timing, timeout=120), files)
            out.update(zip(batch, results, strict=True))
    return out

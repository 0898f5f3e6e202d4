"""The notebook kind: the student fills TODO regions in the code cells of a `.ipynb`.

The task process validates the notebook with nbformat and executes it headless with nbclient,
cell by cell in one kernel, then runs the task's checks in that same kernel, each as one more
code cell. The checks are code, not pytest tests: they need the kernel's namespace (the
student's variables and functions), which only code sent to the kernel can see. Each check is a
`NotebookCheck` with its own points, so a notebook earns partial credit the way a Python-module
task does, and a failing check is named with its assertion's message.

    NotebookTask(
        lab="lab5", number="02", title="attention by hand", sources=["02_attention.ipynb"],
        checks=[NotebookCheck("shape", "assert out.shape == (4, 8)", points=1),
                NotebookCheck("values", "import numpy as np\\nassert np.allclose(out, ref)", points=3)],
    )

`cell_timeout` bounds each cell (a hang is reported with its cell); `timeout` (the task's, as
for every kind) bounds the whole process, kernel start included, and should be larger. `gpu`
defaults to False, as for Python modules: such a notebook is run and graded on a CPU-only
machine, and `make check` executes it headless (tests/test_notebooks.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import ClassVar

from grader.tasks.spec import Task


@dataclass(frozen=True)
class NotebookCheck:
    """Code run in the notebook's kernel after the student's cells: passes unless it raises."""

    name: str
    code: str
    points: float = 1.0


@dataclass(kw_only=True)
class NotebookTask(Task):
    """`sources` is the one notebook, relative to the lab folder (`02_attention.ipynb`).

    A plain string among `checks` is a check worth 1 point, named by its position.
    """

    kind: ClassVar[str] = "notebook"

    checks: Sequence[NotebookCheck | str] = ()
    cell_timeout: float = 30.0  # seconds for any one cell, the checks' included
    kernel: str = "python3"
    gpu: bool = False

    def __post_init__(self) -> None:
        if len(self.sources) != 1 or PurePosixPath(self.sources[0]).suffix != ".ipynb":
            raise ValueError(f"{self.lab}/{self.number}: a NotebookTask has one .ipynb source, not {self.sources}")

    def check_list(self) -> list[NotebookCheck]:
        return [
            c if isinstance(c, NotebookCheck) else NotebookCheck(f"check {i}", c)
            for i, c in enumerate(self.checks, start=1)
        ]

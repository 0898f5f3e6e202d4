"""The task process: runs one task's checks, isolated from the grading process.

It is the only place where student code runs, so a crash, an illegal address or a hang ends
this process alone; the parent turns that into a verdict and goes on with the next task. It
starts before its job is known (torch and CUDA start up while nvcc builds), reads a `ChildJob`
as one JSON line from stdin, and writes a `ChildReport` as it goes, so even a killed child
leaves behind which case it was in.

    python -m grader.child --result r.json  <<< '{"spec": ..., "sources": {...}, "lib": ...}'
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback
from pathlib import Path
from typing import Any

from grader.records import CheckFailure, ChildJob, ChildReport, Verdict
from grader.tasks.catalogue import load_task

# which module runs which kind of task (each exposes run(task, job, rec))
RUNNERS = {
    "cuda": "grader.child.cudalib",
    "torch_ext": "grader.child.torch_ext",
    "python": "grader.child.pytests",
    "notebook": "grader.child.notebook",
}


class Recorder:
    """The report on disk, rewritten at every step."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.report = ChildReport()

    def set(self, **kw: Any) -> None:
        for k, v in kw.items():
            setattr(self.report, k, v)
        self.flush()

    def flush(self) -> None:
        self.report.dump(self.path)


def warm_up() -> None:
    """What every task needs anyway, done while the grading process still builds."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.init()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m grader.child")
    p.add_argument("--result", type=Path, required=True)
    p.add_argument("--job", type=Path, help="the job as a JSON file (default: one line on stdin)")
    a = p.parse_args(argv)
    rec = Recorder(a.result)
    rec.flush()
    if a.job is not None:
        line = a.job.read_text()
    else:
        warm_up()
        line = sys.stdin.readline()
    if not line.strip():  # the grading process had nothing for us (the build failed)
        return 0
    try:
        job = ChildJob.from_line(line)
        task = load_task(Path(job.spec))
        runner = importlib.import_module("grader.child.profiling" if job.profile else RUNNERS[task.kind])
        runner.run(task, job, rec)
    except CheckFailure as f:
        rec.set(verdict=f.verdict, message=f.message)
    except Exception:
        rec.set(verdict=Verdict.GRADER_ERROR, message=traceback.format_exc())
        return 3
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The task process: runs one task's checks, isolated from the grading process.

It is the only place where student code runs, so a crash, an illegal address or a hang ends
this process alone; the parent turns that into a verdict and goes on with the next task. It
starts before its job is known (torch and CUDA start up while nvcc builds), reads its report
key and then a `ChildJob` as JSON lines from stdin, and sends a `ChildReport` as it goes, so
even a killed child leaves behind which case it was in.

Graded runs report over a pipe (`--report-fd`), each update signed with the key, which is read
before any student code is loaded (grader/parent/isolation.py checks the signatures). A
profiler's run, which grades nothing, writes its report to a file instead (`--result`).

    python -m grader.child --report-fd 5  <<< 'KEY-HEX\n{"spec": ..., "sources": {...}, "lib": ...}'
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import hmac
import importlib
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from grader.records import CheckFailure, ChildJob, ChildReport, Phase, Stage, Verdict, to_jsonable
from grader.tasks import seeds
from grader.tasks.catalogue import load_task

# which module runs which kind of task (each exposes run(task, job, rec))
RUNNERS = {
    "cuda": "grader.child.cudalib",
    "torch_ext": "grader.child.torch_ext",
    "python": "grader.child.pytests",
    "notebook": "grader.child.notebook",
}


class Recorder:
    """The report, sent again at every step: a signed line on the report pipe, or a file."""

    def __init__(self, scratch: Path, path: Path | None = None, fd: int | None = None, key: bytes = b"") -> None:
        self.scratch = scratch  # this task's folder for files of its own (removed by the grading process)
        self.path, self.fd, self._key = path, fd, key
        self.report = ChildReport()
        self._step, self._since = str(Stage.STARTING), time.perf_counter()

    def at(self, stage: Stage, what: str = "") -> None:
        """The process is now at `stage`, doing `what`: sent at once, so that a process killed
        there is reported with it."""
        self._clock(f"{stage}: {what.split(',')[0]}" if what else str(stage))
        self.set(phase=Phase(stage, what))

    def _clock(self, step: str) -> None:
        """The step that ends now gets the seconds since it began."""
        now = time.perf_counter()
        if self._step:
            seconds = self.report.step_seconds
            seconds[self._step] = seconds.get(self._step, 0.0) + now - self._since
        self._step, self._since = step, now

    def set(self, **kw: Any) -> None:
        if "verdict" in kw:  # the end: the last step's time is in
            self._clock("")
        for k, v in kw.items():
            setattr(self.report, k, v)
        self.flush()

    def flush(self) -> None:
        if self.fd is None:
            assert self.path is not None
            self.report.dump(self.path)
            return
        payload = json.dumps(to_jsonable(self.report))
        line = (hmac.new(self._key, payload.encode(), hashlib.sha256).hexdigest() + " " + payload + "\n").encode()
        view = memoryview(line)
        while view:
            view = view[os.write(self.fd, view) :]


def warm_up() -> None:
    """What every task needs anyway, done while the grading process still builds: CUDA's start,
    and the first launch of the torch kernels every case runs (drawing inputs, filling the output
    buffers' markers, comparing against the reference). Under CUDA's lazy loading a kernel's first
    launch loads its module, and a forked task process starts with none loaded."""
    import torch

    if not torch.cuda.is_available():
        return
    torch.cuda.init()
    try:
        from grader.child.compare import bad_mask

        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(4096, device="cuda", generator=g)
        torch.rand(4096, device="cuda", generator=g)
        torch.randint(0, 100, (4096,), device="cuda", generator=g)
        y = torch.empty_like(x)
        y.view(torch.int32).fill_(0x7FC0FFEE)
        y.copy_(x)
        for t in (y, y.half(), y.bfloat16()):
            bool(bad_mask(t, x, 1e-6, 1e-6).any())
        torch.equal(x, y.clone())
        torch.cuda.synchronize()
    except Exception:  # nothing here may stop a task: its own cases start these kernels anyway
        pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m grader.child")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--report-fd", type=int, help="the report pipe; its key is the first line on stdin")
    where.add_argument("--result", type=Path, help="write the report to this file (a profiler's run)")
    p.add_argument("--job", type=Path, help="the job as a JSON file (default: one line on stdin)")
    p.add_argument("--scratch", type=Path, help="a folder for the task's own files (default: beside --result)")
    a = p.parse_args(argv)
    scratch = a.scratch or (a.result.parent if a.result else Path.cwd())
    scratch.mkdir(parents=True, exist_ok=True)
    if a.report_fd is not None:
        rec = Recorder(scratch, fd=a.report_fd, key=bytes.fromhex(sys.stdin.readline().strip()))
        os.set_inheritable(a.report_fd, False)  # student processes started later do not get it
    else:
        rec = Recorder(scratch, path=a.result)
    rec.report.sandbox = json.loads(os.environ.pop("GRADER_SANDBOX_HELD", "[]"))
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
        if job.seed:
            seeds.use_key(task.task_id, job.seed)
        runner = importlib.import_module("grader.child.profiling" if job.profile else RUNNERS[task.kind])
        runner.run(task, job, rec)
    except CheckFailure as f:
        rec.set(verdict=f.verdict, message=f.message)
    except OSError as e:
        if e.errno != errno.EFBIG:  # the sandbox's limit on one file (stdout included): the code's doing
            rec.set(verdict=Verdict.GRADER_ERROR, message=traceback.format_exc())
            return 3
        rec.set(
            verdict=Verdict.CRASH,
            message=f"stopped in {rec.report.phase}: the code wrote more than the sandbox allows into one file "
            "(its output counts): is something printing in a loop?",
        )
    except Exception:
        rec.set(verdict=Verdict.GRADER_ERROR, message=traceback.format_exc())
        return 3
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

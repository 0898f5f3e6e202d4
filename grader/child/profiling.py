"""The task process in profile mode: each entry point once on the timing case, for a profiler.

`python -m grader profile` starts this process under Nsight Compute (and Nsight Systems) with
`--profile-from-start off`, so only what runs between cudaProfilerStart and cudaProfilerStop is
measured. Everything else the grader does (seeded inputs, the torch reference, the guarded
output buffers, one warm-up call that also loads the module and fills the caches) happens
outside that range: the profile holds the student's kernels and nothing of torch's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grader.child.cudalib import (
    call,
    card_skips,
    check_outputs,
    device_info,
    inputs_and_reference,
    prepare,
    skip_notes,
)
from grader.child.ffi import Library
from grader.records import CheckFailure, ChildJob, Phase, Stage, Verdict
from grader.tasks.spec import Case, CudaTask, Task

if TYPE_CHECKING:
    from grader.child.__main__ import Recorder


def profiled_case(task: CudaTask) -> Case:
    """The case the grader times; without one, the largest case that is not a huge one."""
    if task.timing_case:
        return next(c for c in task.cases if c.label == task.timing_case)
    return max((c for c in task.cases if not c.huge), key=lambda c: c.size)


@contextlib.contextmanager
def nvtx_range(name: str) -> Iterator[None]:
    """A named range on the Nsight Systems timeline (and ncu's NVTX view), where torch has NVTX."""
    import torch

    pushed = False
    try:
        torch.cuda.nvtx.range_push(name)
        pushed = True
    except (RuntimeError, AttributeError):  # a torch built without NVTX: the profile works without names
        pass
    try:
        yield
    finally:
        if pushed:
            torch.cuda.nvtx.range_pop()


def run(task: Task, job: ChildJob, rec: Recorder) -> None:
    import torch

    if not isinstance(task, CudaTask):
        raise CheckFailure(
            Verdict.ENVIRONMENT, f"profiling covers CUDA-library tasks; {task.task_id} is a {task.kind} task"
        )
    if not torch.cuda.is_available():
        rec.set(
            verdict=Verdict.SKIPPED,
            message=f"torch sees no CUDA GPU (torch.version.cuda = {torch.version.cuda}): profiling needs one",
        )
        return
    rec.set(device=device_info())
    assert job.lib is not None, "a CUDA task's job names its built library"
    lib = Library(Path(job.lib))
    case = profiled_case(task)
    ready: list[tuple[Any, ...]] = []
    skipped = card_skips(task)  # entry points this card cannot run (lab 2's rung 4 outside sm_90)
    for entry in [e for e in task.entries if e.symbol not in skipped]:
        ep = lib.function(entry.symbol, entry.args)
        where = f"{entry.symbol}, case {case.label}"
        rec.at(Stage.TIMING, f"warm-up of {where}")
        inputs, expected = inputs_and_reference(task, entry, case)
        shapes = task.shapes(inputs, expected)
        values, _ = prepare(task, entry, inputs, shapes)
        call(ep, values, where + " (warm-up)")
        values, outs = prepare(task, entry, inputs, shapes)  # fresh outputs: the profiled call starts clean
        ready.append((entry, ep, values, outs, expected, where))
    torch.cuda.synchronize()
    rec.at(Stage.TIMING, f"profiled calls, case {case.label}")
    torch.cuda.profiler.start()
    try:
        for entry, ep, values, _, _, where in ready:
            with nvtx_range(entry.symbol):
                call(ep, values, where)
        torch.cuda.synchronize()  # work left on other streams belongs inside the range too
    finally:
        torch.cuda.profiler.stop()
    notes = skip_notes(skipped)
    for entry, _, _, outs, expected, where in ready:
        try:
            check_outputs(task, entry, outs, expected, where)
        except CheckFailure as f:
            notes.append(f"the profiled output is wrong, so these numbers describe a wrong kernel: {f.message}")
    rec.set(verdict=Verdict.PASS, phase=Phase(Stage.DONE), message=case.label, notes=notes)

"""Grading tasks: static checks, one parallel build, then each task in its own child process."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from grader import paths, sanitizer, toolchain
from grader.build import BuildResult, build_all
from grader.isolation import Child, ChildRun, child_env, new_child, signal_name
from grader.spec import Task
from grader.static_checks import check_source
from grader.verdict import TaskResult, Timing, Verdict


@dataclass
class Options:
    solutions: bool = False  # grade labN/solutions/*.cu instead of the student files
    timing: str = "quick"  # off | quick | bench
    sanitize: bool = False  # also run compute-sanitizer memcheck and racecheck
    force_run: bool = False  # run the checks even on an untouched skeleton (make verify)
    timeout: float = float(os.environ.get("GRADER_TIMEOUT", "60"))


def source_of(task: Task, opts: Options) -> Path:
    lab = task.lab_dir()
    return paths.solution_source(lab, task.source) if opts.solutions else paths.student_source(lab, task.source)


def _result(task: Task, src: Path, verdict: Verdict, message: str = "", **kw: object) -> TaskResult:
    return TaskResult(task.lab, task.number, task.title, paths.rel(src), verdict, message, **kw)  # type: ignore[arg-type]


def grade(tasks: list[Task], opts: Options, sources: dict[str, Path] | None = None) -> Iterator[TaskResult]:
    """Yields one result per task, in order, as soon as each is known.

    `sources` overrides which file is graded for a task id (the grader's own tests use it to
    grade deliberately broken variants).
    """
    t0 = time.perf_counter()
    sources = {t.task_id: (sources or {}).get(t.task_id) or source_of(t, opts) for t in tasks}
    early: dict[str, TaskResult] = {}
    notes: dict[str, list[str]] = {}
    for t in tasks:
        src = sources[t.task_id]
        if not src.exists():
            early[t.task_id] = _result(t, src, Verdict.COMPILE_ERROR, f"{paths.rel(src)} does not exist")
            continue
        outcome = check_source(t, src.read_text(), paths.rel(src))
        notes[t.task_id] = outcome.notes
        if outcome.verdict is not None and not (opts.force_run and outcome.verdict == Verdict.NOT_STARTED):
            early[t.task_id] = _result(t, src, outcome.verdict, outcome.message)
    to_build = [t for t in tasks if t.task_id not in early]
    gpu = toolchain.has_gpu()
    scratch = Path(tempfile.mkdtemp(prefix="grader-"))
    # the first task's process starts (imports torch, or sets up CUDA when forked) while nvcc builds
    first = new_child(Path(to_build[0].spec_file), scratch / "0.json", opts.timing) if gpu and to_build else None
    try:
        builds = build_all([sources[t.task_id] for t in to_build]) if to_build else {}
    except toolchain.ToolchainError as e:
        if first:
            first.kill()
        builds = {}
        for t in to_build:
            early[t.task_id] = _result(t, sources[t.task_id], Verdict.COMPILE_ERROR, str(e))
    build_seconds = time.perf_counter() - t0
    pending = first
    try:
        for i, t in enumerate(tasks):
            if t.task_id in early:
                yield early[t.task_id]
                continue
            b = builds[sources[t.task_id]]
            child, pending = pending, None
            res = _grade_built(t, b, opts, gpu, scratch / f"{i}.json", child)
            res.notes = notes.get(t.task_id, []) + res.notes
            if b.cached is False:
                res.notes.append(f"built in {build_seconds:.1f} s")
            yield res
    finally:  # also when the consumer stops early (pytest -x)
        if pending is not None:
            pending.kill()
        shutil.rmtree(scratch, ignore_errors=True)


def _grade_built(
    task: Task, b: BuildResult, opts: Options, gpu: bool, result_path: Path, child: Child | None
) -> TaskResult:
    start = time.perf_counter()
    src = b.source
    if not b.ok:
        if child:
            child.feed(None)
            child.wait(10)
        return _result(task, src, Verdict.COMPILE_ERROR, b.error, kernels=b.kernels)
    if not gpu:
        return _result(
            task,
            src,
            Verdict.SKIPPED,
            "no NVIDIA GPU visible (nvidia-smi finds none): the kernel "
            "compiled; run on a GPU machine to check and time it",
            kernels=b.kernels,
        )
    assert b.lib is not None
    if child is None:
        child = new_child(Path(task.spec_file), result_path, opts.timing)
    child.feed(b.lib)
    res = _from_child(task, src, child.wait(opts.timeout), opts.timeout)
    if opts.sanitize and res.verdict in (Verdict.PASS, Verdict.WRONG):
        findings = _sanitize(task, b, opts, result_path.with_suffix(".san.json"))
        if findings:
            text = "\n".join(str(f) for f in findings[:10])
            if res.verdict == Verdict.PASS:
                res.verdict, res.message = Verdict.SANITIZER, text
            else:
                res.message += "\ncompute-sanitizer:\n" + text
    res.kernels = b.kernels
    res.seconds = time.perf_counter() - start
    return res


def _from_child(task: Task, src: Path, run: ChildRun, timeout: float) -> TaskResult:
    r = run.result
    phase = r.get("phase", "start-up")
    verdict_text = r.get("verdict")
    tail = "\n".join((run.stderr or "").strip().splitlines()[-8:])
    if run.timed_out:
        return _result(
            task,
            src,
            Verdict.TIMEOUT,
            f"killed after {timeout:.0f} s in {phase}: a kernel that never finishes (an infinite loop, "
            f"a loop whose index never reaches its bound, or a __syncthreads() that some threads of the "
            f"block never reach); if it is only slow, raise GRADER_TIMEOUT",
            cases=r.get("cases", []),
        )
    if verdict_text is None:
        return _result(
            task,
            src,
            Verdict.CRASH,
            f"the task's process died ({signal_name(run.returncode)}) in {phase}"
            + (f"; its last output:\n{tail}" if tail else ""),
            cases=r.get("cases", []),
        )
    if verdict_text == "grader error":
        return _result(task, src, Verdict.CRASH, "internal grader error (please report it):\n" + r.get("message", ""))
    message = r.get("message", "")
    if verdict_text == str(Verdict.CRASH) and tail:
        message += f"\nits last output:\n{tail}"
    return _result(
        task,
        src,
        Verdict(verdict_text),
        message,
        cases=r.get("cases", []),
        timings=[Timing(**t) for t in r.get("timings", [])],
        notes=list(r.get("notes", [])),
    )


def _sanitize(task: Task, b: BuildResult, opts: Options, result_path: Path) -> list[sanitizer.Finding]:
    """The task's small cases under memcheck, then racecheck: findings in its own source."""
    assert b.lib is not None
    env = {**child_env(), "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}  # one allocation per tensor: memcheck sees bounds
    findings: list[sanitizer.Finding] = []
    for tool in sanitizer.TOOLS:
        child = Child(
            Path(task.spec_file), result_path, "off", sanitize=True, wrapper=sanitizer.wrapper(tool), lib=b.lib, env=env
        )
        run = child.wait(opts.timeout * 4)
        report = run.stdout + run.stderr
        log = paths.BUILD / "sanitizer" / f"{task.lab}-{task.number}.{tool}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(report)  # the whole report, for whoever wants more than the summary
        findings += sanitizer.parse(tool, report, b.source)
    return findings

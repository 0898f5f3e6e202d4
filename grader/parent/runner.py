"""Grading tasks: static checks, one parallel build, then each task in its own task process.

Runs in the grading process (pytest's, or `python -m grader`'s). Per task: the source rules and
"not started" (static_checks), the build for kinds that have one here (CUDA libraries, through
nvcc), then a `ChildJob` for the task process (grader/child), whose `ChildReport` becomes the
`TaskResult`, scored before it is yielded.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from grader import paths, toolchain
from grader.build import head_start
from grader.build.nvcc import BuildResult, BuildUnit, build_all
from grader.parent import sandbox, sanitizer, scoring
from grader.parent.isolation import Child, ChildRun, SpawnedChild, child_env, new_child, signal_name
from grader.parent.static_checks import check_build, check_source
from grader.records import ChildJob, SanitizerRun, Stage, TaskResult, TimingMode, Verdict
from grader.tasks.python import PythonTask
from grader.tasks.seeds import task_key
from grader.tasks.spec import CudaTask, Task

DEFAULT_TIMEOUT = 60.0


@dataclass
class Options:
    solutions: bool = False  # grade labN/solutions/* instead of the student files
    timing: TimingMode = TimingMode.QUICK  # a string of its values is taken too (a command line's)
    sanitize: bool = False  # also run compute-sanitizer memcheck and racecheck
    force_run: bool = False  # run the checks even on an untouched skeleton (make verify)
    huge: bool = False  # also the cases past 2^31 elements (make grade)
    timeout: float | None = None  # overrides every task's own; None: the task's, else GRADER_TIMEOUT
    sandbox: bool = field(default_factory=sandbox.enabled)  # untrusted code: grader/parent/sandbox.py
    output_bytes: int = 256 << 20  # in the sandbox, the most a task may write to one file (its output too)

    def __post_init__(self) -> None:
        self.timing = TimingMode(self.timing)  # "bnech" fails here, not as an untimed run

    def timeout_for(self, task: Task) -> float:
        if self.timeout is not None:
            return self.timeout
        if "GRADER_TIMEOUT" in os.environ:
            base = max(float(os.environ["GRADER_TIMEOUT"]), task.timeout or 0.0)
        else:
            base = task.timeout or DEFAULT_TIMEOUT
        # cases past 2^31 elements fill tens of GB and compute their reference first
        return base * 4 if self.huge and any(c.huge for c in getattr(task, "cases", ())) else base

    def policy(self, work: Path, writable: tuple[str, ...] = ()) -> sandbox.Policy | None:
        """The sandbox for one task process or build step, or None when not sandboxing."""
        if not self.sandbox:
            return None
        memory = (128 if self.huge else 32) << 30  # the cases past 2^31 elements fill tens of GB
        return sandbox.Policy(work=str(work), writable=writable, memory_bytes=memory, file_bytes=self.output_bytes)

    def confine(self, unit_folder: Path) -> list[str]:
        """The command prefix that runs one nvcc step of a unit in the sandbox."""
        policy = self.policy(unit_folder / "tmp", (str(unit_folder),))
        assert policy is not None
        sandbox.give_to_sandbox(unit_folder)
        return sandbox.command(policy)


Sources = dict[str, Path]  # a task's file (relative to its lab) -> the file graded in its place


def sources_of(task: Task, opts: Options, override: Path | Mapping[str, Path] | None = None) -> Sources:
    """Which file stands for each of the task's files: the student's, the solution's, or the
    override (a single path replaces the task's first file)."""
    lab = task.lab_dir()
    chosen = {
        rel: paths.solution_source(lab, rel) if opts.solutions else paths.student_source(lab, rel)
        for rel in task.sources
    }
    if isinstance(override, Path):
        chosen[task.source] = override
    elif override:
        chosen.update({rel: Path(p) for rel, p in override.items()})
    return chosen


def _variant(opts: Options, override: object) -> str:
    return "variant" if override else ("solution" if opts.solutions else "student")


def _result(task: Task, src: Path, verdict: Verdict, message: str = "", **kw: object) -> TaskResult:
    return TaskResult(task.lab, task.number, task.title, paths.rel(src), verdict, message, **kw)  # type: ignore[arg-type]


def _scored(task: Task, result: TaskResult) -> TaskResult:
    result.points, result.max_points = scoring.score(task, result)
    if result.verdict == Verdict.PASS:
        result.notes += scoring.perf_report(task, result)
    return result


BUSY = "timing: other processes were using this GPU when grading began"  # how that note starts


def busy_notes(results: list[TaskResult]) -> list[str]:
    """The distinct notes saying other processes used the GPU while `results` were timed."""
    return sorted({n for r in results for n in r.notes if n.startswith(BUSY)})


def grade(
    tasks: list[Task], opts: Options, overrides: Mapping[str, Path | Mapping[str, Path]] | None = None
) -> Iterator[TaskResult]:
    """Yields one scored result per task, in order, as soon as each is known.

    `overrides` replaces, per task id, which files are graded (the grader's own tests use it to
    grade deliberately broken variants and fixture tasks).
    """
    others = toolchain.other_gpu_processes() if opts.timing != TimingMode.OFF else []
    busy = f"{BUSY} ({', '.join(others)}): the times may be low; nvidia-smi lists them" if others else ""
    for result in _grade(tasks, opts, overrides or {}):
        task = next(t for t in tasks if t.task_id == result.task_id)
        if busy and result.timings:
            result.notes.append(busy)
        yield _scored(task, result)


def _grade(
    tasks: list[Task], opts: Options, overrides: Mapping[str, Path | Mapping[str, Path]]
) -> Iterator[TaskResult]:
    t0 = time.perf_counter()
    sources = {t.task_id: sources_of(t, opts, overrides.get(t.task_id)) for t in tasks}
    variants = {t.task_id: _variant(opts, overrides.get(t.task_id)) for t in tasks}
    early: dict[str, TaskResult] = {}
    notes: dict[str, list[str]] = {}
    for t in tasks:
        missing = [p for p in sources[t.task_id].values() if not p.exists()]
        main_src = sources[t.task_id][t.source]
        if missing:
            early[t.task_id] = _result(t, main_src, Verdict.COMPILE_ERROR, f"{paths.rel(missing[0])} does not exist")
            continue
        for src in (sources[t.task_id][rel] for rel in t.sources):  # not the earlier tasks' (builds_on)
            outcome = check_source(t, src.read_text(), paths.rel(src))
            notes.setdefault(t.task_id, []).extend(outcome.notes)
            if outcome.verdict is not None and not (opts.force_run and outcome.verdict == Verdict.NOT_STARTED):
                early[t.task_id] = _result(t, src, outcome.verdict, outcome.message)
                break
    prepared: dict[str, str | None] = {}  # each prepare step once per run: its error, or None
    for t in tasks:
        if t.prepare is None or t.task_id in early:
            continue
        if t.prepare not in prepared:
            prepared[t.prepare] = run_prepare(t.prepare)
        if prepared[t.prepare] is not None:
            early[t.task_id] = _result(t, sources[t.task_id][t.source], Verdict.ENVIRONMENT, prepared[t.prepare])
    gpu = toolchain.has_gpu()
    runnable = {t.task_id for t in tasks if t.task_id not in early and (gpu or not t.gpu) and not too_few_gpus(t)}
    # the tasks whose library nvcc builds here: CUDA tasks, and Python tasks with .cu sources
    cuda = [t for t in tasks if t.task_id not in early and builds_here(t)]
    scratch = Path(tempfile.mkdtemp(prefix="grader-"))
    if opts.sandbox:
        sandbox.hide_this_process()
        os.chmod(scratch, 0o711)  # the sandbox's user reaches its own scratch folder, lists nothing
    # the first task's process starts (imports torch, or sets up CUDA when forked) while nvcc builds
    pending = new_child(scratch / "0", opts.policy(scratch / "0.work")) if runnable else None
    builds: dict[str, BuildResult] = {}
    try:
        # one unit per task: all its files, its own flags, libraries and header wheels
        units = {t.task_id: BuildUnit.for_task(t, sources[t.task_id], variants[t.task_id]) for t in cuda}
        confine = opts.confine if opts.sandbox else None
        built = build_all(list(units.values()), confine=confine) if units else {}
        builds = {task_id: built[unit] for task_id, unit in units.items()}
        for lab in {t.lab for t in cuda if not opts.sandbox and variants[t.task_id] != "variant"}:
            # what `make test-labN` builds before pytest starts, next time (grader/build/head_start.py)
            mine = [units[t.task_id] for t in cuda if t.lab == lab and variants[t.task_id] != "variant"]
            head_start.remember(lab, "solution" if opts.solutions else "student", mine, toolchain.target_arch())
    except toolchain.ToolchainError as e:
        for t in cuda:
            early[t.task_id] = _result(t, sources[t.task_id][t.source], Verdict.ENVIRONMENT, str(e))
    build_seconds = time.perf_counter() - t0
    try:
        for i, t in enumerate(tasks):
            if t.task_id in early:
                yield early[t.task_id]
                continue
            b = builds.get(t.task_id) if builds_here(t) else None
            child, pending = (pending, None) if t.task_id in runnable else (None, pending)
            res = _grade_one(t, sources[t.task_id], variants[t.task_id], b, opts, gpu, scratch / str(i), child)
            res.notes = notes.get(t.task_id, []) + res.notes
            if b is not None and b.cached is False:
                res.build_seconds = build_seconds
            yield res
    finally:  # also when the consumer stops early (pytest -x)
        if pending is not None:
            pending.kill()
        shutil.rmtree(scratch, ignore_errors=True)


def builds_here(task: Task) -> bool:
    """Whether the grading process builds the task's library with nvcc before its process starts."""
    return isinstance(task, CudaTask) or (isinstance(task, PythonTask) and task.builds_library)


def too_few_gpus(task: Task) -> str:
    """Why a task of several GPUs cannot run here ("lab6/01 needs 2 GPUs; this machine shows 1"),
    or "" when it can. One-GPU tasks keep the no-GPU skip alone: this says nothing about them."""
    if task.gpus <= 1 or not task.gpu:
        return ""
    seen = toolchain.visible_gpu_count()
    if seen >= task.gpus:
        return ""
    return f"{task.task_id} needs {task.gpus} GPUs; this machine shows {toolchain.gpus_seen()}"


def run_prepare(target: str) -> str | None:
    """Runs a task's prepare step ("module:function"); its error message, or None when it worked."""
    module, _, name = target.partition(":")
    try:
        getattr(importlib.import_module(module), name)()
    except Exception as e:  # a broken prepare step is that task's environment problem, not the run's
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return f"preparing the task ({target}) failed: {type(e).__name__}: {first}"
    return None


def _grade_one(
    task: Task,
    sources: Sources,
    variant: str,
    b: BuildResult | None,
    opts: Options,
    gpu: bool,
    base: Path,
    child: Child | None,
) -> TaskResult:
    start = time.perf_counter()
    src = sources[task.source]
    kernels = b.kernels if b else []
    # the rules that judge what was compiled (shared memory per kernel, headers read, libraries linked)
    ruled = check_build(task, b, sources) if b is not None else None
    if b is not None and (not b.ok or (ruled and ruled.verdict is not None)):
        if child:
            child.feed(None)
            child.wait(10)
        if ruled and ruled.verdict is not None:
            return _result(task, src, ruled.verdict, ruled.message, kernels=kernels)
        return _result(task, src, b.verdict, b.error, kernels=kernels)
    if task.gpu and not gpu:
        what = "the kernel compiled; " if b is not None else ""
        return _result(
            task,
            src,
            Verdict.SKIPPED,
            f"no NVIDIA GPU visible (nvidia-smi finds none): {what}run on a GPU machine to check and time it",
            kernels=kernels,
        )
    if too_few_gpus(task):
        what = "the kernel compiled; " if b is not None else ""
        message = f"{too_few_gpus(task)}: {what}run on a machine with enough GPUs to check it"
        return _result(task, src, Verdict.SKIPPED, message, kernels=kernels)
    # earlier tasks' files this one runs, as this run grades them (the solutions, or the student's)
    lab, pick = task.lab_dir(), paths.solution_source if opts.solutions else paths.student_source
    earlier = {rel: str(pick(lab, rel)) for rel in getattr(task, "builds_on", ())}
    job = ChildJob(
        spec=task.spec_file,
        sources={**earlier, **{rel: str(p) for rel, p in sources.items()}},
        lib=str(b.lib) if b and b.lib else None,
        timing=opts.timing,
        huge=opts.huge,
        variant=variant,
        seed=task_key(task.task_id),
    )
    if child is None:
        child = new_child(base, opts.policy(base.with_suffix(".work")))
    child.feed(job)
    timeout = opts.timeout_for(task)
    res = from_child(task, src, child.wait(timeout), timeout)
    if opts.sanitize and task.gpu and res.verdict in (Verdict.PASS, Verdict.WRONG):
        _sanitize(task, job, opts, base.with_name(base.name + "-san"), res, b)
    res.kernels = kernels
    res.seconds = time.perf_counter() - start
    return res


def from_child(task: Task, src: Path, run: ChildRun, timeout: float) -> TaskResult:
    """The task's result from what its process left behind: its report, exit status and output."""
    res = _from_child(task, src, run, timeout)
    res.sandbox = list(run.sandbox or [])
    if run.forged:
        res.notes.append(
            f"{run.forged} line(s) on the grader's report channel did not carry the task process's key "
            "(written by the submission's code?) and were ignored"
        )
    return res


def _from_child(task: Task, src: Path, run: ChildRun, timeout: float) -> TaskResult:
    r = run.result
    tail = _last_output(run.stderr or "")
    if run.timed_out:
        if r.phase.stage == Stage.BUILDING:
            why = "the build did not finish (a cold PyTorch-extension build takes about a minute on a busy machine)"
        elif task.kind in ("cuda", "torch_ext"):
            why = (
                "a kernel that never finishes (an infinite loop, a loop whose index never reaches its bound, "
                "or a __syncthreads() that some threads of the block never reach)"
            )
        else:
            why = "code that never finishes (an infinite loop, or a wait for something that never comes)"
        return _result(
            task,
            src,
            Verdict.TIMEOUT,
            f"killed after {timeout:.0f} s in {r.phase}: {why}; if it is only slow, raise GRADER_TIMEOUT",
            cases=r.cases,
            tests=r.tests,
        )
    if r.verdict is None and run.returncode == -signal.SIGXFSZ:
        return _result(
            task,
            src,
            Verdict.CRASH,
            f"the task's process was stopped in {r.phase} for writing more than the sandbox allows into one "
            "file (its output counts): is something printing in a loop?",
            cases=r.cases,
            tests=r.tests,
        )
    if r.verdict is None:
        return _result(
            task,
            src,
            Verdict.CRASH,
            f"the task's process died ({signal_name(run.returncode)}) in {r.phase}"
            + (f"; its last output:\n{tail}" if tail else ""),
            cases=r.cases,
            tests=r.tests,
        )
    message = r.message
    if r.verdict == Verdict.GRADER_ERROR:
        message = "internal grader error (please report it):\n" + message
    if r.verdict == Verdict.CRASH and tail:
        message += f"\nits last output:\n{tail}"
    return _result(
        task,
        src,
        r.verdict,
        message,
        cases=r.cases,
        timings=r.timings,
        tests=r.tests,
        notes=list(r.notes),
        build_seconds=r.build_seconds,
        skipped=dict(r.skipped),
        step_seconds=dict(r.step_seconds),
    )


def _last_output(stderr: str) -> str:
    """What a dead task process said last. Python's fault handler prints the innermost frame first,
    so its report is quoted from its start; otherwise the last lines."""
    lines = stderr.strip().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Fatal Python error"):
            return "\n".join(lines[i : i + 12])
    return "\n".join(lines[-8:])


def _sync_copies_lib(b: BuildResult | None, opts: Options) -> str | None:
    """For racecheck: the library rebuilt with COURSE_SYNC_COPIES when the build read course_mma.h,
    whose cp_async_16 then copies at once with plain loads and stores. racecheck counts a cp.async's
    write when its group is waited for, so a stage refilled before the barrier that ends the other
    warps' reads of it (the copy issued too early, waited for later) looks clean to it; a copy done
    at its issue is a shared store between two barriers, and the hazard is reported. A correct
    pipeline stays correct: landing at once is one of the timings the asynchronous copy allows.
    None: no such build (the task's own library serves), or it did not build."""
    if b is None or b.unit is None or b.facts is None or not any(h.endswith("/course_mma.h") for h in b.facts.headers):
        return None
    unit = dataclasses.replace(
        b.unit, stem=b.unit.stem + ".sync", flags=(*b.unit.flags, "-DCOURSE_SYNC_COPIES"), facts=False
    )
    built = build_all([unit], confine=opts.confine if opts.sandbox else None)[unit]
    return str(built.lib) if built.ok and built.lib else None


def _sanitize(task: Task, job: ChildJob, opts: Options, base: Path, res: TaskResult, b: BuildResult | None) -> None:
    """The task's small cases under memcheck, then racecheck: findings in its own sources, and a
    record of each tool's run (a tool that could not run is said so, never taken as clean)."""
    env = {**child_env(), "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}  # one allocation per tensor: memcheck sees bounds
    job = dataclasses.replace(job, timing=TimingMode.OFF, sanitize=True)
    headers = b.facts.headers if b and b.facts else []
    findings: list[sanitizer.Finding] = []
    for tool in sanitizer.TOOLS:
        try:
            wrapper = sanitizer.wrapper(tool)
        except toolchain.ToolchainError as e:
            res.sanitizer.append(SanitizerRun(tool, "not run", str(e)))
            continue
        policy = opts.policy(base.with_name(f"{base.name}-{tool}.work"))
        if tool == "racecheck" and (lib := _sync_copies_lib(b, opts)):
            job = dataclasses.replace(job, lib=lib)
        child = SpawnedChild(base.with_name(f"{base.name}-{tool}"), job=job, wrapper=wrapper, env=env, policy=policy)
        run = child.wait(opts.timeout_for(task) * 4)
        report = run.stdout + run.stderr
        log = paths.BUILD / "sanitizer" / f"{task.lab}-{task.number}.{tool}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(report)  # the whole report, for whoever wants more than the summary
        found = sanitizer.findings(tool, report, job.sources.values(), headers)
        findings += found
        res.sanitizer.append(sanitizer.outcome(tool, report, run.result.verdict is not None, found, paths.rel(log)))
    not_run = [s for s in res.sanitizer if s.status == "not run"]
    for s in not_run:
        res.notes.append(
            f"compute-sanitizer {s.tool} could not run here, so this task is not checked by it: {s.detail}"
        )
    if findings:
        text = "\n".join(str(f) for f in findings[:10])
        if res.verdict == Verdict.PASS:
            res.verdict, res.message = Verdict.SANITIZER, text
        else:
            res.message += "\ncompute-sanitizer:\n" + text

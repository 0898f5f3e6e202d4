"""`make verify`: the course proves itself sound, task by task.

With a GPU: every skeleton (run even though untouched) must fail and every reference solution
must pass. Without one: both must compile, the skeleton must read as "not started", and the
checks must be able to fail (calibration). Either way the skeletons must match the solutions.
Then every broken variant (labN/solutions/broken.py) is graded, a GPU's on a GPU, and the
number caught is printed per lab and mistake class: one that passes fails verify.

Performance targets marked `gate=True` are promises (the lab README quotes them): with a GPU the
reference solutions of those tasks are timed as `make bench-labN` times them, and a solution that
misses a gated target fails verify. Without a GPU the gates are reported as not checked.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from grader import paths, toolchain
from grader.instructor import broken, skeletons
from grader.instructor.calibration import calibrate
from grader.parent import runner, scoring
from grader.parent.static_checks import check_source
from grader.records import TaskResult, TimingMode, Verdict
from grader.tasks import catalogue
from grader.tasks.spec import Task

GATE_TIMEOUT = 900.0  # seconds per task: benchmark timing, and the ladder where a gate reads it


def gated(tasks: list[Task]) -> list[Task]:
    return [t for t in tasks if any(p.gate for p in t.perf)]


def needs_ladder(task: Task) -> bool:
    """Whether a gate of `task` reads a ladder row: a rung without a timing case, or a share of a
    library baseline other than the entry's own torch baseline."""
    if getattr(task, "ladder", None) is None:
        return False
    return not getattr(task, "timing_case", None) or any(
        p.gate and p.metric.startswith("share_of:") and p.metric != "share_of:torch" for p in task.perf
    )


def gate_problems(task: Task, result: TaskResult) -> list[str]:
    """One line per gated target of `task` that the timed reference solution did not hold (those of
    an entry point this card cannot run are not held against it: `result.skipped`)."""
    problems = []
    for target in (p for p in scoring.targets(task, result) if p.gate):
        if result.verdict != Verdict.PASS:
            line = result.headline()
            problems.append(
                f"{task.task_id}: gate {target.entry} {target.metric} not checked: the timed solution got "
                f"{result.verdict}" + (f": {line}" if line else "")
            )
            continue
        value = scoring.metric(task, result, target)
        if value is None:
            problems.append(
                f"{task.task_id}: gate {target.entry} {target.metric} was not measured: no timing of `{target.entry}` "
                f"(a timing_case, or a ladder rung, must cover it)"
            )
        elif value < target.target:
            problems.append(f"{task.task_id}: the reference solution misses its gate: {scoring.reached(target, value)}")
    return problems


def check_gates(tasks: list[Task], gpu: bool, say: Callable[[str], None]) -> list[str]:
    """Times the reference solutions of the tasks with gated targets; the problems found."""
    chosen = gated(tasks)
    if not chosen:
        return []
    n = sum(p.gate for t in chosen for p in t.perf)
    if not gpu:
        say(f"performance gates not checked: no GPU ({n} gated targets in {len(chosen)} tasks)")
        return []
    say(f"timing {len(chosen)} reference solutions for {n} performance gates (benchmark timing)")
    timeout = max(GATE_TIMEOUT, float(os.environ.get("GRADER_TIMEOUT", 0)))
    problems: list[str] = []
    results: list[TaskResult] = []
    for mode in (TimingMode.BENCH, TimingMode.LADDER):
        group = [t for t in chosen if needs_ladder(t) == (mode == TimingMode.LADDER)]
        results += runner.grade(group, runner.Options(solutions=True, timing=mode, timeout=timeout)) if group else []
    for line in runner.busy_notes(results):
        say(f"  {line}")
    by_id = {r.task_id: r for r in results}
    for task in chosen:
        result = by_id[task.task_id]
        found = gate_problems(task, result)
        for target in (p for p in scoring.targets(task, result) if p.gate):
            value = scoring.metric(task, result, target)
            if value is not None and result.verdict == Verdict.PASS:
                say(f"  {task.task_id}: {scoring.reached(target, value)} {'✓' if value >= target.target else '✗'}")
        problems += found
    return problems


def check_variants(
    labs: list[str], gpu: bool, say: Callable[[str], None], jobs: int = 1, only: set[str] | None = None
) -> list[str]:
    """Grades every broken variant of `labs` (those a CPU can grade, without a GPU; those of the
    tasks in `only`, when given) and prints, per lab and mistake class, how many the grader caught;
    one problem per variant let through."""
    problems: list[str] = []
    for lab in (lab for lab in broken.labs() if lab in labs):
        problems += broken.check_lab(lab, gpu, say, jobs, only)
    return problems


def verify(
    labs: list[str],
    say: Callable[[str], None],
    variants: bool = True,
    jobs: int = 1,
    selectors: str = "",
    gates: bool = True,
    calibration: bool = True,
) -> int:
    """`selectors` ("10,11" or "lab2/10"): only those tasks, so that one lab's verification can be
    split over several machines or GPUs (lab 2's takes longer than one device call allows).
    `calibration=False` leaves out the check that each task's checks can fail (its column reads
    "not run"): the course's own tests make it per task, in tests/test_calibration.py."""
    tasks = [t for t in catalogue.all_tasks(labs) if paths.solution_source(t.lab_dir(), t.source).exists()]
    if not tasks:
        say("no reference solutions in this tree (a student release?): nothing to verify")
        return 2
    tasks = catalogue.select(tasks, selectors)
    if not tasks:
        say(f"no task matches {selectors!r}")
        return 2
    only = {t.task_id for t in tasks} if selectors else None
    verified = {t.lab for t in tasks}
    problems: list[str] = [
        f"{f} differs from its solution's skeleton: run `make skeletons`"
        for f in skeletons.drifted()
        if f.split("/")[0] in verified
    ]
    gpu = toolchain.has_gpu()
    say(f"verifying {len(tasks)} tasks on {'the GPU' if gpu else 'the CPU only (no GPU: compile + calibration)'}")
    skel = {r.task_id: r for r in runner.grade(tasks, runner.Options(force_run=True, timing=TimingMode.OFF))}
    sol = {r.task_id: r for r in runner.grade(tasks, runner.Options(solutions=True, timing=TimingMode.OFF))}
    width = max(len(f"{t.task_id} {t.title}") for t in tasks)
    say(f"{'task'.ljust(width)}  {'skeleton':<22}  {'solution':<22}  calibration")
    notes: list[str] = []
    for t in tasks:
        s, r = skel[t.task_id], sol[t.task_id]
        student = paths.student_source(t.lab_dir(), t.source)
        started = check_source(t, student.read_text(), paths.rel(student)).verdict != Verdict.NOT_STARTED
        cal = calibrate(t) if calibration else []
        ok_skel = s.verdict not in (Verdict.PASS, Verdict.COMPILE_ERROR) and not started
        # without a GPU a solution is only built; where a library or header wheel is missing here
        # it is not even that (the GPU machine has them): said below the table, not a problem
        unbuilt = not gpu and r.verdict == Verdict.ENVIRONMENT
        # a task of several GPUs on a machine of fewer is skipped, with the counts: not a failure here
        few = gpu and r.verdict == Verdict.SKIPPED and bool(runner.too_few_gpus(t))
        ok_sol = r.verdict == Verdict.PASS or (not gpu and r.verdict == Verdict.SKIPPED) or unbuilt or few
        if unbuilt:
            notes.append(f"{t.task_id}: not built on this machine: {r.headline()}")
        if few:
            notes.append(f"{t.task_id}: not run: {runner.too_few_gpus(t)}")
        if s.verdict == Verdict.SKIPPED:
            s_text = "compiles, not started" if not started else "compiles, STARTED?"
        else:
            s_text = f"fails ({s.verdict})" if ok_skel else f"{s.verdict}!"
        r_text = (
            "compiles"
            if r.verdict == Verdict.SKIPPED
            else "not built here"
            if unbuilt
            else ("passes" if ok_sol else f"{r.verdict}!")
        )
        say(
            f"{(t.task_id + ' ' + t.title).ljust(width)}  {('✓ ' if ok_skel else '✗ ') + s_text:<22}  "
            f"{('✓ ' if ok_sol else '✗ ') + r_text:<22}  {('✓' if not cal else '✗') if calibration else 'not run'}"
        )
        if not ok_skel:
            problems.append(f"{t.task_id}: the skeleton should fail but got {s.verdict}: {s.headline()}")
        if not ok_sol:
            problems.append(f"{t.task_id}: the solution should pass but got {r.verdict}: {r.message}")
        problems += cal
    if notes:
        say("\n".join(notes))
    if gates:
        problems += check_gates(tasks, gpu, say)
    elif gated(tasks):
        say("performance gates not timed (--no-gates): time them on a quiet machine")
    if variants:
        say("")
        problems += check_variants(sorted({t.lab for t in tasks}), gpu, say, jobs, only)
    if problems:
        say("\nproblems:\n  " + "\n  ".join(problems))
        return 1
    held = ", every performance gate holds" if gates and gpu and gated(tasks) else ""
    caught = ", every broken variant graded is caught" if variants else ""
    say(
        "verify: every skeleton fails, every solution "
        + ("passes" if gpu else "compiles")
        + (", every check can fail" if calibration else " (calibration not run)")
        + held
        + caught
    )
    return 0

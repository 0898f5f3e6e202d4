"""`make verify`: the course proves itself sound, task by task.

With a GPU: every skeleton (run even though untouched) must fail and every reference solution
must pass. Without one: both must compile, the skeleton must read as "not started", and the
checks must be able to fail (calibration). Either way the skeletons must match the solutions.
"""

from __future__ import annotations

from grader import paths, toolchain
from grader.instructor import skeletons
from grader.instructor.calibration import calibrate
from grader.parent import runner
from grader.parent.static_checks import check_source
from grader.records import Verdict
from grader.tasks import catalogue


def verify(labs: list[str], say: callable) -> int:  # type: ignore[valid-type]
    tasks = [t for t in catalogue.all_tasks(labs) if paths.solution_source(t.lab_dir(), t.source).exists()]
    if not tasks:
        say("no reference solutions in this tree (a student release?): nothing to verify")
        return 2
    problems: list[str] = [
        f"{f} differs from its solution's skeleton: run `make skeletons`" for f in skeletons.drifted()
    ]
    gpu = toolchain.has_gpu()
    say(f"verifying {len(tasks)} tasks on {'the GPU' if gpu else 'the CPU only (no GPU: compile + calibration)'}")
    skel = {r.task_id: r for r in runner.grade(tasks, runner.Options(force_run=True, timing="off"))}
    sol = {r.task_id: r for r in runner.grade(tasks, runner.Options(solutions=True, timing="off"))}
    width = max(len(f"{t.task_id} {t.title}") for t in tasks)
    say(f"{'task'.ljust(width)}  {'skeleton':<22}  {'solution':<22}  calibration")
    for t in tasks:
        s, r = skel[t.task_id], sol[t.task_id]
        student = paths.student_source(t.lab_dir(), t.source)
        started = check_source(t, student.read_text(), paths.rel(student)).verdict != Verdict.NOT_STARTED
        cal = calibrate(t)
        ok_skel = s.verdict not in (Verdict.PASS, Verdict.COMPILE_ERROR) and not started
        ok_sol = r.verdict == Verdict.PASS or (not gpu and r.verdict == Verdict.SKIPPED)
        if s.verdict == Verdict.SKIPPED:
            s_text = "compiles, not started" if not started else "compiles, STARTED?"
        else:
            s_text = f"fails ({s.verdict})" if ok_skel else f"{s.verdict}!"
        r_text = "compiles" if r.verdict == Verdict.SKIPPED else ("passes" if ok_sol else f"{r.verdict}!")
        say(
            f"{(t.task_id + ' ' + t.title).ljust(width)}  {('✓ ' if ok_skel else '✗ ') + s_text:<22}  "
            f"{('✓ ' if ok_sol else '✗ ') + r_text:<22}  {'✓' if not cal else '✗'}"
        )
        if not ok_skel:
            problems.append(
                f"{t.task_id}: the skeleton should fail but got {s.verdict}: {(s.message or ' ').splitlines()[0]}"
            )
        if not ok_sol:
            problems.append(f"{t.task_id}: the solution should pass but got {r.verdict}: {r.message}")
        problems += cal
    if problems:
        say("\nproblems:\n  " + "\n  ".join(problems))
        return 1
    say("verify: every skeleton fails, every solution " + ("passes" if gpu else "compiles") + ", every check can fail")
    return 0

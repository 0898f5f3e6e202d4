"""The grader's commands: python -m grader {verify,skeletons,release,doctor,bench,profile,submission,gradebook}."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from grader.instructor import skeletons
from grader.tasks.regions import RegionError


def say(text: str) -> None:
    print(text, flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m grader")
    sub = p.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("verify", help="every skeleton fails, every reference solution passes")
    v.add_argument("labs", nargs="*", help="e.g. lab1 (default: all)")
    v.add_argument("--task", default="", help="only these tasks: 10,11 or lab2/10 (split one lab over machines)")
    v.add_argument(
        "--no-gates",
        dest="gates",
        action="store_false",
        help="skip timing the gated reference solutions (time them on a quiet machine: other runs beside them skew it)",
    )
    v.add_argument(
        "--no-variants", dest="variants", action="store_false", help="skip grading the broken variants (faster)"
    )
    v.add_argument(
        "--no-calibration",
        dest="calibration",
        action="store_false",
        help="skip checking that each task's checks can fail (tests/test_calibration.py does it task by task)",
    )
    v.add_argument(
        "--jobs",
        type=int,
        default=max(1, min(8, (os.cpu_count() or 2) // 2)),
        help="grading runs of broken variants at once (untimed ones; default: half the cores, at most 8)",
    )
    s = sub.add_parser("skeletons", help="regenerate the student files from labN/solutions/ (every task file)")
    s.add_argument("--check", action="store_true", help="only report files that differ")
    r = sub.add_parser("release", help="export a student tree without solutions")
    r.add_argument("dest", type=Path)
    r.add_argument("--grader-repo", default=None, help="owner/name of this repository on GitHub (default: origin's)")
    b = sub.add_parser("bench", help="time a lab carefully; write its ladder tables and plots into its README")
    b.add_argument("lab", help="e.g. lab2 (or a lab-shaped folder)")
    b.add_argument("--task", default="", help="only these tasks: 04 or 01,04")
    b.add_argument("--solutions", action="store_true", help="time the reference solutions")
    b.add_argument("--readme", type=Path, help="write the tables here (default: the lab's .md file with their markers)")
    b.add_argument("--placeholder", action="store_true", help="write only the tables' shape, without numbers or GPU")
    d = sub.add_parser("doctor", help="what this machine has for the course (exit 0 when the course can run here)")
    d.add_argument("--json", action="store_true", help="the rows as JSON")
    d.add_argument("--missing", action="store_true", help="only the requirements pip should install (setup.sh)")
    d.add_argument("--need", choices=["course", "python"], default="course", help="what exit 0 vouches for")
    pr = sub.add_parser("profile", help="Nsight Compute summary of one task's timing case")
    pr.add_argument("task", help="e.g. lab1/03")
    pr.add_argument("--solutions", action="store_true", help="profile the reference solution")
    sb = sub.add_parser("submission", help="grade one student's submission with this grader (only their files count)")
    sb.add_argument("origin", help="a folder, a .zip or .tar.gz, or a git URL")
    sb.add_argument("--out", type=Path, default=Path("grade-results"), help="results go to OUT/<name>/")
    sb.add_argument("--name", default="", help="the student's name (default: from the origin)")
    sb.add_argument(
        "--classroom",
        action="store_true",
        help="also write classroom.json and, in GitHub Actions, the step output `result` and the points notice "
        "that GitHub Classroom's autograding reporter reads",
    )
    gb = sub.add_parser("gradebook", help="grade a folder of submissions into OUT/gradebook.csv (resumes)")
    gb.add_argument("folder", type=Path, help="one folder, archive or git repository per student")
    gb.add_argument("--out", type=Path, default=Path("grade-results"))
    gb.add_argument("--only", default="", help="regrade this student only")
    gb.add_argument("--fresh", action="store_true", help="regrade everyone, even unchanged submissions")
    gb.add_argument("--gpus", default="all", help="one worker per GPU: all (those this process may use), or ids: 0,1")
    mode = gb.add_mutually_exclusive_group()
    mode.add_argument("--shard", type=_shard, metavar="I/N", help="grade every N-th submission from the I-th (0-based)")
    mode.add_argument("--collect", action="store_true", help="only rebuild OUT/gradebook.csv from what shards graded")
    mode.add_argument("--slurm", type=_count, metavar="N", help="only write OUT/grade.sbatch: N shards on Slurm")
    for q in (sb, gb):
        q.add_argument("--timing", choices=["off", "quick", "bench"], default="bench")
        q.add_argument("--sanitize", action="store_true", help="also compute-sanitizer")
    a = p.parse_args(argv)

    if a.cmd == "verify":
        from grader.instructor.verify import verify

        return verify(
            a.labs, say, variants=a.variants, jobs=a.jobs, selectors=a.task, gates=a.gates, calibration=a.calibration
        )
    if a.cmd == "skeletons":
        try:
            if a.check:
                drift = skeletons.drifted()
                for f in drift:
                    say(f"{f} differs from its solution's skeleton: run `make skeletons`")
                return 1 if drift else 0
            for f in skeletons.write_all():
                say(f"wrote {f}")
            return 0
        except RegionError as e:
            say(f"error: {e}")
            return 1
    if a.cmd == "doctor":
        from grader.instructor import doctor

        return doctor.run(say, as_json=a.json, missing=a.missing, need=a.need)
    if a.cmd == "profile":
        from grader.instructor.profile import profile

        return profile(a.task, a.solutions, say)
    if a.cmd == "bench":
        from grader.instructor.bench import bench

        return bench(a.lab, a.task, a.solutions, a.readme, say, placeholder=a.placeholder)
    if a.cmd in ("submission", "gradebook"):
        from grader.instructor import gradebook
        from grader.instructor.submissions import SubmissionError
        from grader.parent.runner import Options
        from grader.tasks import catalogue

        # code written by students: its build and its run in the sandbox (grader/parent/sandbox.py)
        opts = Options(timing=a.timing, sanitize=a.sanitize, sandbox=True)
        if a.cmd == "gradebook":
            if not a.folder.is_dir():
                say(f"error: {a.folder} is not a folder of submissions")
                return 2
            if a.collect:
                return gradebook.collect(a.folder, a.out, say)
            if a.slurm:
                return gradebook.slurm(a.folder, a.out, a.slurm, opts, say, only=a.only, fresh=a.fresh)
            try:
                gpus = gradebook.worker_gpus(a.gpus)
            except ValueError as e:
                say(f"error: {e}")
                return 2
            return gradebook.gradebook(a.folder, a.out, opts, say, only=a.only, fresh=a.fresh, gpus=gpus, shard=a.shard)
        name = a.name or gradebook.student_name(Path(a.origin.rstrip("/")))
        try:
            g = gradebook.grade_one(a.origin, name, a.out, opts, catalogue.all_tasks())
        except SubmissionError as e:
            say(f"error: {e}")
            return 2
        points, most = sum(r.points for r in g.results), sum(r.max_points for r in g.results)
        say(f"{name}: {points:g} points; report: {a.out / name / 'summary.md'}")
        if a.classroom:
            from grader.report import classroom

            github_output = os.environ.get("GITHUB_OUTPUT")
            classroom.write(g.results, a.out / name, Path(github_output) if github_output else None)
            if os.environ.get("GITHUB_ACTIONS") == "true":  # the annotation the reporter would make
                say(f"::notice title=Autograding complete::Points {points:g}/{most:g}")
        return 0
    if a.cmd == "release":
        from grader.instructor.release import release

        try:
            copied = release(a.dest, grader_repo=a.grader_repo)
        except ValueError as e:
            say(f"error: {e}")
            return 2
        say(f"released {len(copied)} files to {a.dest} (no solutions); check it with: cd {a.dest} && make check")
        say(f"its grading workflow takes the grader from {copied.grader_repo} at {copied.grader_ref}")
        for note in copied.notes:
            say(f"note: {note}")
        return 0
    return 2


def _shard(text: str) -> tuple[int, int]:
    """--shard I/N, as a Slurm array index or a CI matrix value fills it in."""
    from grader.instructor.gradebook import parse_shard

    try:
        return parse_shard(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a number of shards, 1 or more")
    return int(text)


if __name__ == "__main__":
    sys.exit(main())

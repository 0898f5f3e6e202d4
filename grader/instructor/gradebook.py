"""Grading a class: one submission, or a folder of them into a gradebook.

    python -m grader submission PATH-OR-URL --out DIR          one student
    python -m grader gradebook SUBMISSIONS --out DIR [--only NAME] [--fresh]

A folder of submissions holds one entry per student: a folder, a git repository, a .zip or a
.tar.gz, named after the student. Each is graded by the instructor's grader, specs and seed
(grader/instructor/submissions.py takes only the files the student owns), into DIR/<name>/
(results.json and the summary.md students know), then DIR/gradebook.csv gets a row per student,
a column per task and per lab, and the total. A submission already graded with the same files is
not graded again, so an interrupted batch resumes where it stopped; `--only NAME` regrades one.
A submission that does not build, hangs or crashes gets its verdicts and the batch goes on.
"""

from __future__ import annotations

import csv
import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from grader.parent import runner
from grader.records import TaskResult
from grader.report import envinfo
from grader.report.files import markdown, write_json
from grader.tasks import catalogue
from grader.tasks.spec import Task

Say = Callable[[str], None]
ARCHIVES = (".zip", ".tar.gz", ".tgz", ".tar")


@dataclass
class Graded:
    name: str
    digest: str
    results: list[TaskResult]
    resumed: bool = False  # taken from an earlier run of the batch

    def points(self) -> dict[str, float]:
        return {r.task_id: r.points for r in self.results}


def student_name(entry: Path) -> str:
    name = entry.name
    for suffix in ARCHIVES:
        name = name.removesuffix(suffix)
    return name


def grade_one(origin: str, name: str, out: Path, opts: runner.Options, tasks: list[Task]) -> Graded:
    """Grades one submission into out/<name>/; raises SubmissionError when it cannot be read."""
    from grader.instructor.submissions import intake

    with tempfile.TemporaryDirectory(prefix="submission-") as scratch:
        sub = intake(origin, name, Path(scratch))
        results = list(runner.grade(tasks, opts, sub.overrides(tasks)))
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        env = envinfo.environment()
        write_json(folder / "results.json", results, env)
        header = [
            f"# Submission of {name}",
            "",
            f"Graded: `{sub.origin}`"
            + (f" at commit `{sub.commit}`" if sub.commit else "")
            + f"; files taken hash to `{sub.digest}`.",
            "",
        ]
        header += [f"- missing {m}: graded as absent" for m in sub.missing]
        header += [f"- {line}" for line in sub.ignored]
        (folder / "summary.md").write_text("\n".join(header) + "\n\n" + markdown(results, env))
        (folder / "submission.json").write_text(
            json.dumps(
                {
                    "name": name,
                    "origin": sub.origin,
                    "commit": sub.commit,
                    "digest": sub.digest,
                    "missing": sub.missing,
                    "ignored": sub.ignored,
                },
                indent=2,
            )
        )
        return Graded(name, sub.digest, results)


def _load(out: Path, name: str) -> Graded | None:
    """What an earlier run wrote for this student, if anything."""
    from grader.records import from_jsonable

    meta, results = out / name / "submission.json", out / name / "results.json"
    if not (meta.exists() and results.exists()):
        return None
    rows = json.loads(results.read_text())["tasks"]
    tasks = [from_jsonable(TaskResult, {k: v for k, v in row.items() if k != "task"}) for row in rows]
    return Graded(name, json.loads(meta.read_text())["digest"], tasks, resumed=True)


def _unchanged(out: Path, origin: str, name: str) -> Graded | None:
    """The earlier grade of this submission, if the files it takes are the same as then."""
    from grader.instructor.submissions import SubmissionError, intake

    earlier = _load(out, name)
    if earlier is None:
        return None
    try:
        with tempfile.TemporaryDirectory(prefix="submission-") as scratch:
            digest = intake(origin, name, Path(scratch)).digest
    except SubmissionError:
        return None
    return earlier if earlier.digest == digest else None


def write_csv(path: Path, graded: list[Graded], tasks: list[Task]) -> None:
    labs = sorted({t.lab for t in tasks}, key=lambda lab: (len(lab), lab))
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["student", *[t.task_id for t in tasks], *labs, "total", "graded files"])
        for g in sorted(graded, key=lambda g: g.name):
            pts = g.points()
            per_lab = [sum(pts.get(t.task_id, 0.0) for t in tasks if t.lab == lab) for lab in labs]
            w.writerow(
                [
                    g.name,
                    *[f"{pts.get(t.task_id, 0.0):g}" for t in tasks],
                    *[f"{p:g}" for p in per_lab],
                    f"{sum(pts.values()):g}",
                    g.digest,
                ]
            )
        w.writerow(
            [
                "(maximum)",
                *[f"{_max(t):g}" for t in tasks],
                *[f"{sum(_max(t) for t in tasks if t.lab == lab):g}" for lab in labs],
                f"{sum(_max(t) for t in tasks):g}",
                "",
            ]
        )


def _max(task: Task) -> float:
    return task.points + sum(p.points for p in task.perf)


def gradebook(folder: Path, out: Path, opts: runner.Options, say: Say, only: str = "", fresh: bool = False) -> int:
    """Grades every submission in `folder` into `out`; returns 0, or 1 when one could not be read."""
    from grader.instructor.submissions import SubmissionError

    entries = sorted(p for p in folder.iterdir() if not p.name.startswith("."))
    if only:
        entries = [p for p in entries if student_name(p) == only]
        if not entries:
            say(f"no submission named {only} in {folder}")
            return 2
    tasks = catalogue.all_tasks()
    out.mkdir(parents=True, exist_ok=True)
    # students graded by an earlier run stay in the gradebook (with --only, they are not revisited)
    graded = {g.name: g for g in (_load(out, student_name(p)) for p in sorted(folder.iterdir())) if g is not None}
    failures = 0
    for i, entry in enumerate(entries, 1):
        name = student_name(entry)
        earlier = None if (fresh or only) else _unchanged(out, str(entry), name)
        if earlier is not None:
            say(f"[{i}/{len(entries)}] {name}: unchanged since it was graded, kept")
            graded[name] = earlier
            continue
        say(f"[{i}/{len(entries)}] {name}: grading")
        try:
            g = grade_one(str(entry), name, out, opts, tasks)
        except SubmissionError as e:
            say(f"[{i}/{len(entries)}] {name}: cannot be graded: {e}")
            graded.pop(name, None)  # never a stale grade in its place
            failures += 1
            continue
        graded[name] = g
        total = sum(r.points for r in g.results)
        say(f"[{i}/{len(entries)}] {name}: {total:g} points")
        write_csv(out / "gradebook.csv", list(graded.values()), tasks)  # after each: an interruption loses one
    write_csv(out / "gradebook.csv", list(graded.values()), tasks)
    say(f"gradebook: {out / 'gradebook.csv'} ({len(graded)} students); feedback in {out}/<student>/summary.md")
    return 1 if failures else 0

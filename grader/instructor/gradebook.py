"""Grading a class: one submission, or a folder of them into a gradebook.

    python -m grader submission PATH-OR-URL --out DIR          one student
    python -m grader gradebook SUBMISSIONS --out DIR [--only NAME] [--fresh] [--gpus all|0,1] [--shard I/N]
    python -m grader gradebook SUBMISSIONS --out DIR --collect  the gradebook of what the shards graded
    python -m grader gradebook SUBMISSIONS --out DIR --slurm N  write DIR/grade.sbatch: N shards of a worker each

A folder of submissions holds one entry per student: a folder, a git repository, a .zip or a
.tar.gz, named after the student. Each is graded by the instructor's grader, specs and seed
(grader/instructor/submissions.py takes only the files the student owns), into DIR/<name>/
(results.json and the summary.md students know), then DIR/gradebook.csv gets a row per student,
a column per task and per lab, and the total. A submission already graded with the same files is
not graded again, so an interrupted batch resumes where it stopped; `--only NAME` regrades one.
A submission that does not build, hangs or crashes gets its verdicts and the batch goes on; one
that cannot be read at all gets DIR/<name>/error.txt and no row (never a stale grade).

One worker per GPU (`--gpus`, default all this process may use): with several, each submission is
graded alone on its GPU by its own `python -m grader submission` process (CUDA_VISIBLE_DEVICES set
to that GPU, its output in DIR/<name>/grading.log), so its timings are as honest as on a machine
with one GPU, and the next submission goes to whichever GPU frees first. A task that needs several
GPUs (`Task.gpus`, lab 6's) makes every worker a group of that many (`worker_groups`): each student
is graded on as many GPUs as any other, and GPUs left over from the last whole group stay idle. With one GPU or none the
submissions are graded in this process, one after the other. The batch ends by saying how many
submissions it graded per hour, also in DIR/throughput.json, to compare one GPU with several.

Across machines the batch is split by a scheduler that exists (a Slurm array, a GitHub Actions
matrix), never by one of ours: `--shard I/N` grades the I-th of every N submissions, and shards may
share one DIR on a shared filesystem. DIR/gradebook.csv is always rebuilt whole from the folders
in DIR of all the students in SUBMISSIONS and replaced atomically, so it is never half written and
each shard's includes what the others finished; `--collect` rebuilds it once they all have.
`--slurm N` writes the array job that runs the N shards, and grades nothing itself.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from grader import paths, toolchain
from grader.parent import runner
from grader.records import TaskResult, TimingMode
from grader.report import envinfo
from grader.report.files import markdown, write_json
from grader.tasks import catalogue
from grader.tasks.spec import Task

Say = Callable[[str], None]
Shard = tuple[int, int]  # (I, N): this run grades the entries whose index % N == I
ARCHIVES = (".zip", ".tar.gz", ".tgz", ".tar")
GRADED_FILES = ("results.json", "submission.json", "summary.md", "error.txt")  # a grade, or why there is none
POLL_SECONDS = 0.2  # how often the coordinator looks for a worker that finished
TAIL_LINES = 8  # of a failed worker's log, said and kept in error.txt
SLURM_CPUS = 8  # per shard: nvcc builds a submission's tasks in parallel
SLURM_MINUTES = {
    TimingMode.OFF: 3,
    TimingMode.QUICK: 5,
    TimingMode.BENCH: 10,
}  # a shard's --time allows this per submission, and 30 more


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
        header += sandbox_lines(results, opts)
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


def sandbox_lines(results: list[TaskResult], opts: runner.Options) -> list[str]:
    """What the sandbox held for this submission's code (grader/parent/sandbox.py), as the first
    task that ran in it reported; what did not hold on this machine is said in capitals."""
    if not opts.sandbox:
        return ["", "Sandbox: off (the submission's code ran with the grader's rights)."]
    held = next((r.sandbox for r in results if r.sandbox), [])
    if not held:
        return ["", "Sandbox: on; no task's code ran here (nothing to run on this machine)."]
    return ["", "Sandbox: " + "; ".join(held) + "."]


def _load(out: Path, name: str) -> Graded | None:
    """What an earlier run (or another worker or shard) wrote for this student, if anything. A
    folder being written at this moment counts as not graded yet: submission.json comes last."""
    from grader.records import from_jsonable

    meta, results = out / name / "submission.json", out / name / "results.json"
    if not (meta.exists() and results.exists()):
        return None
    try:
        rows = json.loads(results.read_text())["tasks"]
        digest = json.loads(meta.read_text())["digest"]
    except (OSError, json.JSONDecodeError):  # half written, or removed since we looked
        return None
    tasks = [from_jsonable(TaskResult, {k: v for k, v in row.items() if k != "task"}) for row in rows]
    return Graded(name, digest, tasks, resumed=True)


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


def _forget(out: Path, name: str) -> None:
    """Before a student is graded again: what is in their folder must be this grading's or nothing,
    so that a gradebook rebuilt meanwhile (by us or another shard) never shows a stale grade."""
    for f in GRADED_FILES:
        (out / name / f).unlink(missing_ok=True)


def _cannot_grade(out: Path, name: str, why: str) -> None:
    _forget(out, name)
    (out / name).mkdir(parents=True, exist_ok=True)
    (out / name / "error.txt").write_text(f"{name} cannot be graded: {why}\n")


def write_csv(path: Path, graded: list[Graded], tasks: list[Task]) -> None:
    labs = sorted({t.lab for t in tasks}, key=lambda lab: (len(lab), lab))
    text = io.StringIO()
    w = csv.writer(text)
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
    paths.write_atomically(path, text.getvalue())


def _max(task: Task) -> float:
    return task.points + sum(p.points for p in task.perf)


def entries_of(folder: Path) -> list[Path]:
    """Every student's entry, sorted: the order in which shards count them."""
    return sorted(p for p in folder.iterdir() if not p.name.startswith("."))


def parse_shard(text: str) -> Shard:
    """'I/N' (0 <= I < N), as a Slurm array index or a CI matrix value fills it in."""
    i, sep, n = text.strip().partition("/")
    if not (sep and i.isdigit() and n.isdigit() and int(i) < int(n)):
        raise ValueError(f"{text!r} is not a shard: use I/N with 0 <= I < N, e.g. 0/4")
    return int(i), int(n)


def shard_of(entries: list[Path], shard: Shard | None) -> list[Path]:
    """This shard's entries: every N-th from the I-th, so that N shards cover each entry once."""
    if shard is None:
        return entries
    i, n = shard
    return [e for k, e in enumerate(entries) if k % n == i]


def worker_gpus(spec: str = "all") -> list[str]:
    """The GPUs to run one worker on each: ids as given ('0,1'), or for 'all' every GPU this process
    may use: CUDA_VISIBLE_DEVICES's ids when it is set (a scheduler gave us those), else each one
    nvidia-smi lists. None without a GPU (or with GRADER_NO_GPU=1)."""
    if spec != "all":
        ids = [g.strip() for g in spec.split(",") if g.strip()]
        if not ids:
            raise ValueError(f"--gpus {spec!r}: give all, or GPU ids like 0,1")
        return ids
    found = toolchain.gpus()
    if not found:
        return []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [str(i) for i in range(len(found))]
    return [g.strip() for g in visible.split(",") if g.strip()]


def gpus_needed(tasks: list[Task]) -> int:
    """The most GPUs one task of `tasks` needs: how many each worker gets."""
    return max((t.gpus for t in tasks if t.gpu), default=1)


def worker_groups(ids: list[str], need: int) -> list[str]:
    """The GPUs of each worker, as its CUDA_VISIBLE_DEVICES ("0,1"): one GPU each when no task needs
    more; else consecutive groups of `need`, the GPUs past the last whole group left idle (a worker
    with fewer would skip tasks that another worker's students get graded on). With fewer than
    `need` in all, one worker gets them all, and every student's task that needs more is skipped
    alike, with the reason."""
    if need <= 1 or not ids:
        return list(ids)
    if len(ids) < need:
        return [",".join(ids)]
    return [",".join(ids[i : i + need]) for i in range(0, len(ids) - need + 1, need)]


def _book(out: Path, names: list[str]) -> list[Graded]:
    """The gradebook's rows: each of these students that a run, a worker or a shard graded in `out`."""
    return [g for g in (_load(out, name) for name in names) if g is not None]


def _to_grade(entries: list[Path], out: Path, regrade: bool, say: Say) -> list[Path]:
    """The entries to grade now; those unchanged since they were graded are kept (the resume)."""
    todo = []
    for i, entry in enumerate(entries, 1):
        name = student_name(entry)
        if not regrade and _unchanged(out, str(entry), name) is not None:
            say(f"[{i}/{len(entries)}] {name}: unchanged since it was graded, kept")
        else:
            todo.append(entry)
    return todo


@contextlib.contextmanager
def _on_gpu(gpu: str | None) -> Iterator[None]:
    """Grading in this process on one given GPU: the task processes inherit CUDA_VISIBLE_DEVICES."""
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before


def _grade_here(
    todo: list[Path],
    out: Path,
    opts: runner.Options,
    tasks: list[Task],
    say: Say,
    rebuild: Callable[[], None],
    done: int,
) -> int:
    """One worker: each submission graded in this process in turn; returns how many could not be."""
    from grader.instructor.submissions import SubmissionError

    total, failures = done + len(todo), 0
    for entry in todo:
        done += 1
        name, started = student_name(entry), time.monotonic()
        say(f"[{done}/{total}] {name}: grading")
        _forget(out, name)
        try:
            g = grade_one(str(entry), name, out, opts, tasks)
        except SubmissionError as e:
            _cannot_grade(out, name, str(e))
            say(f"[{done}/{total}] {name}: cannot be graded: {e}")
            failures += 1
        else:
            points = sum(r.points for r in g.results)
            say(f"[{done}/{total}] {name}: {points:g} points ({time.monotonic() - started:.1f} s)")
        rebuild()  # after each: an interruption loses one
    return failures


@dataclass
class _Job:
    """One submission being graded on one GPU by its own `python -m grader submission`."""

    name: str
    gpu: str
    proc: subprocess.Popen[bytes]
    log: Path
    started: float


def _start(entry: Path, gpu: str, out: Path, opts: runner.Options, ways: int) -> _Job:
    name = student_name(entry)
    _forget(out, name)  # so that "no results.json" means this grading wrote none
    (out / name).mkdir(parents=True, exist_ok=True)
    log = out / name / "grading.log"
    cmd = [sys.executable, "-m", "grader", "submission", str(entry.absolute())]
    cmd += ["--out", str(out.absolute()), "--name", name, "--timing", str(opts.timing)]
    cmd += ["--sanitize"] if opts.sanitize else []
    # the workers, one per GPU, share the host's cores
    env = {**os.environ, **toolchain.cpu_share(ways), "CUDA_VISIBLE_DEVICES": gpu, "PYTHONUNBUFFERED": "1"}
    with log.open("wb") as f:
        proc = subprocess.Popen(cmd, cwd=paths.ROOT, env=env, stdin=subprocess.DEVNULL, stdout=f, stderr=f)
    return _Job(name, gpu, proc, log, time.monotonic())


def _tail(log: Path) -> list[str]:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-TAIL_LINES:] or ["(the log is empty)"]


def _finish(job: _Job, out: Path, say: Say, tag: str) -> bool:
    """Says how the job's submission went; False (and error.txt) when it could not be graded."""
    where = f"{tag} {job.name} on GPU {job.gpu}"
    code = job.proc.returncode
    graded = _load(out, job.name) if code == 0 else None
    if graded is None:
        why = f"exit {code}" if code else "it wrote no results"
        tail = _tail(job.log)
        _cannot_grade(out, job.name, f"{why}; the end of {job.log}:\n" + "\n".join(tail))
        say(f"{where}: cannot be graded ({why}); the end of {job.log}:\n" + "\n".join(f"    {t}" for t in tail))
        return False
    points = sum(r.points for r in graded.results)
    say(f"{where}: {points:g} points ({time.monotonic() - job.started:.1f} s)")
    return True


def _grade_on_gpus(
    todo: list[Path], gpus: list[str], out: Path, opts: runner.Options, say: Say, rebuild: Callable[[], None], done: int
) -> int:
    """One worker per GPU, one submission at a time on each; the next goes to whichever GPU frees
    first (not split in advance: submissions take very different times). Returns the failures."""
    total, failures = done + len(todo), 0
    queue, free, running = list(todo), list(gpus), []
    try:
        while queue or running:
            while queue and free:
                job = _start(queue.pop(0), free.pop(0), out, opts, len(gpus))
                running.append(job)
                say(f"{job.name}: grading on GPU {job.gpu}")
            finished = [job for job in running if job.proc.poll() is not None]
            if not finished:
                time.sleep(POLL_SECONDS)
                continue
            for job in finished:
                running.remove(job)
                free.append(job.gpu)
                done += 1
                failures += not _finish(job, out, say, f"[{done}/{total}]")
            rebuild()
    finally:  # interrupted: no worker goes on grading behind our back
        for job in running:
            job.proc.terminate()
        for job in running:
            job.proc.wait()
    return failures


def _throughput(out: Path, count: int, seconds: float, gpus: int, shard: Shard | None, say: Say) -> None:
    """Said and kept (per shard), so that a closing note can compare one GPU with several."""
    per_hour = count / max(seconds, 1e-6) * 3600
    where = f"on {gpus} GPU{'s' if gpus != 1 else ''}" if gpus else "without a GPU"
    plural, took = "s" if count != 1 else "", f"{seconds:.{0 if seconds >= 10 else 1}f} s"
    say(f"graded {count} submission{plural} in {took} {where} ({per_hour:.0f} per hour)")
    doc = {"submissions": count, "seconds": round(seconds, 1), "gpus": gpus, "per_hour": round(per_hour, 1)}
    name = "throughput.json"
    if shard is not None:
        doc["shard"] = f"{shard[0]}/{shard[1]}"
        name = f"throughput-shard{shard[0]}of{shard[1]}.json"
    paths.write_atomically(out / name, json.dumps(doc, indent=2) + "\n")


def gradebook(
    folder: Path,
    out: Path,
    opts: runner.Options,
    say: Say,
    only: str = "",
    fresh: bool = False,
    gpus: list[str] | None = None,
    shard: Shard | None = None,
) -> int:
    """Grades the submissions in `folder` (this shard's, with `shard`) into `out`, one worker per
    GPU in `gpus` (None: worker_gpus()); returns 0, or 1 when one could not be graded."""
    everyone = entries_of(folder)
    entries = shard_of(everyone, shard)
    if only:
        if only not in {student_name(p) for p in everyone}:
            say(f"no submission named {only} in {folder}")
            return 2
        entries = [p for p in entries if student_name(p) == only]
        if not entries:  # a student of the class, so of another shard
            say(f"{only} is graded by another shard, not this one")
            return 0
    elif shard:
        say(f"shard {shard[0]}/{shard[1]}: {len(entries)} of {len(everyone)} submissions")
    tasks = catalogue.all_tasks()
    out.mkdir(parents=True, exist_ok=True)
    # every student graded in `out` is in the book: by an earlier run, or another shard
    names = [student_name(p) for p in everyone]

    def rebuild() -> None:
        write_csv(out / "gradebook.csv", _book(out, names), tasks)

    todo = _to_grade(entries, out, fresh or bool(only), say)
    ids = worker_gpus() if gpus is None else gpus
    need = gpus_needed(tasks)
    groups = worker_groups(ids, need)
    used = sum(len(g.split(",")) for g in groups)
    if need > 1 and ids:
        idle = f"; {len(ids) - used} left idle" if used < len(ids) else ""
        short = f" (fewer than {need}: the tasks that need {need} are skipped)" if len(ids) < need else ""
        say(f"a task needs {need} GPUs: {len(groups)} worker(s) of {min(need, len(ids))} GPUs{short}{idle}")
    done, started = len(entries) - len(todo), time.monotonic()
    if len(groups) > 1:
        failures = _grade_on_gpus(todo, groups, out, opts, say, rebuild, done)
    else:
        with _on_gpu(groups[0] if groups else None):
            failures = _grade_here(todo, out, opts, tasks, say, rebuild, done)
    if todo:
        _throughput(out, len(todo), time.monotonic() - started, used, shard, say)
    book = _book(out, names)
    write_csv(out / "gradebook.csv", book, tasks)
    say(f"gradebook: {out / 'gradebook.csv'} ({len(book)} students); feedback in {out}/<student>/summary.md")
    return 1 if failures else 0


def collect(folder: Path, out: Path, say: Say) -> int:
    """The gradebook of what every shard graded into `out`, grading nothing: for after the last
    shard (a shard's own may miss what another finished at the same moment). 1 if one lacks a grade."""
    if not out.is_dir():
        say(f"{out} does not exist: nothing was graded there yet")
        return 2
    names = [student_name(p) for p in entries_of(folder)]
    book = _book(out, names)
    write_csv(out / "gradebook.csv", book, catalogue.all_tasks())
    say(f"gradebook: {out / 'gradebook.csv'} ({len(book)} of {len(names)} students)")
    graded = {g.name for g in book}
    failed = [n for n in names if n not in graded and (out / n / "error.txt").exists()]
    pending = [n for n in names if n not in graded and n not in failed]
    if failed:
        say(f"cannot be graded ({out}/<student>/error.txt says why): {', '.join(failed)}")
    if pending:
        say(f"not graded (yet?): {', '.join(pending)}")
    return 1 if failed or pending else 0


def slurm(
    folder: Path, out: Path, shards: int, opts: runner.Options, say: Say, only: str = "", fresh: bool = False
) -> int:
    """Writes out/grade.sbatch, a Slurm array job of `shards` tasks with as many GPUs each as the
    most demanding task needs (one, before lab 6), each task this gradebook with --shard; the
    cluster's own scheduler spreads them. Grades nothing."""
    folder, out = folder.absolute(), out.absolute()
    count = len(entries_of(folder))
    out.mkdir(parents=True, exist_ok=True)
    need = gpus_needed(catalogue.all_tasks())
    each_gpus = "one GPU each" if need == 1 else f"{need} GPUs each"
    each = SLURM_MINUTES[opts.timing] * (2 if opts.sanitize else 1)  # compute-sanitizer runs each task again
    minutes = 30 + math.ceil(count / shards) * each
    py = shlex.quote(sys.executable)
    common = f"{py} -m grader gradebook {shlex.quote(str(folder))} --out {shlex.quote(str(out))}"
    flags = f" --timing {opts.timing}" + (" --sanitize" if opts.sanitize else "") + (" --fresh" if fresh else "")
    flags += f" --only {shlex.quote(only)}" if only else ""
    script = out / "grade.sbatch"
    script.write_text(
        "\n".join(
            [
                "#!/bin/bash",
                "#SBATCH --job-name=gradebook",
                f"#SBATCH --array=0-{shards - 1}",
                f"#SBATCH --gres=gpu:{need}",
                f"#SBATCH --cpus-per-task={SLURM_CPUS}",
                f"#SBATCH --time={minutes // 60}:{minutes % 60:02d}:00",
                f"#SBATCH --output={out}/slurm-%A_%a.log",
                f"# {count} submissions of {folder} in {shards} shards, {each_gpus}; --time allows",
                f"# {each} minutes a submission. Written by: python -m grader gradebook --slurm.",
                f"# Submit: sbatch {script}   (add -p PARTITION, -A ACCOUNT as your cluster wants)",
                f"# Then:   {common} --collect",
                f"cd {shlex.quote(str(paths.ROOT))} || exit 1",
                f'{common} --shard "$SLURM_ARRAY_TASK_ID/{shards}" --gpus all{flags}',
                "status=$?",
                "# 1: a submission could not be graded (said above, and in its error.txt): the shard still did",
                "# its work, so a collect job waiting with --dependency=afterok runs",
                'if [ "$status" -eq 1 ]; then exit 0; fi',
                'exit "$status"',
                "",
            ]
        )
    )
    collect_job = f"cd {shlex.quote(str(paths.ROOT))} && {common} --collect"
    say(f"wrote {script}: {count} submissions in {shards} shards of at most {math.ceil(count / shards)}, {each_gpus}")
    if shards > count:
        say(f"(more shards than submissions: {shards - count} of them will grade nothing)")
    say(f"submit it:        sbatch {script}")
    say(f"when it is done:  {common} --collect")
    say(
        f"or both at once:  jobid=$(sbatch --parsable {script}) && sbatch --dependency=afterok:$jobid"
        f" --job-name=gradebook-collect --output={out}/slurm-collect-%j.log --wrap {shlex.quote(collect_job)}"
    )
    return 0

"""`make bench-labN`: time a lab carefully, then write each ladder's table and plot.

    python -m grader bench lab2 [--task 04] [--solutions] [--readme PATH] [--placeholder]

Every task is graded with benchmark timing; a task that declares a ladder also has its rungs and
baselines timed interleaved over its sweep (timing mode "ladder"). A ladder whose task passed
gets its Markdown table written between its markers, into whichever of the lab's Markdown files
holds them (README.md, or a chapter file beside it: ladders.chapter), with a caption naming
the card, driver, CUDA toolkit and torch, and its plot as labN/figures/ladder-NN.png. A task
that did not pass leaves its table as it was: a README never shows numbers of wrong code.
`--placeholder` writes the tables' shape without numbers (no GPU needed), so a new ladder's block
exists before its first GPU run and `make check` can hold it to the declaration. With
`--solutions` over a whole lab, the chapter also gets the reference solutions' timings on this
card (grader/report/timings.py). A whole lab whose tasks declare sweeps (lab 3's batch sizes)
gets its results JSON for the lab's notebook: labN/results/reference-bench.json with
`--solutions`, labN/results/my-bench.json (not committed) for the student's own code.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from grader import paths, toolchain
from grader.parent import runner, scoring
from grader.records import TimingMode, Verdict
from grader.report import envinfo, files, ladders, timings
from grader.report.terminal import table
from grader.tasks import catalogue

BENCH_TIMEOUT = 900.0  # seconds per task: a ladder times every rung at every size, several times over


def lab_dir(lab: str) -> Path:
    """`lab2` names a lab of this course; a path names any lab-shaped folder (the grader's fixtures)."""
    p = Path(lab)
    if (p / "tests").is_dir():
        return p.resolve()
    return paths.ROOT / lab


def bench(
    lab: str,
    selectors: str,
    solutions: bool,
    readme: Path | None,
    say: Callable[[str], None],
    placeholder: bool = False,
) -> int:
    folder = lab_dir(lab)
    if not folder.is_dir():
        say(f"no lab {lab!r} here (expected a folder {paths.rel(folder)})")
        return 2
    tasks = catalogue.select(catalogue.lab_tasks(folder), selectors)
    if not tasks and not selectors:  # like `make test-labN` on a lab still to be written
        say(f"{lab} has no tasks yet: see {paths.rel(folder / 'README.md')}")
        return 0
    if not tasks:
        say(f"no task of {lab} matches {selectors!r}")
        return 2

    def home(pattern: str, what: str) -> Path | None:
        """Where a block goes: --readme when given, else the lab's file holding its markers (None: said why)."""
        if readme is not None:
            return readme
        try:
            return ladders.chapter(folder, pattern, what)
        except LookupError as e:
            say(str(e))
            return None

    with_ladder = ladders.laddered(tasks)
    broken = [f"{t.task_id}: {p}" for t in with_ladder for p in t.ladder.problems(t)]  # type: ignore[union-attr]
    if broken:
        say("ladder declarations that cannot run:\n  " + "\n  ".join(broken))
        return 1
    if placeholder:
        rc = 0
        for t in with_ladder:
            doc = home(ladders.marker(t.task_id), f"{t.task_id}'s ladder table")
            if doc is None:
                rc = 1
                continue
            existed, _ = ladders.write(doc, t, None, None)
            say(f"{t.task_id}: {'reset' if existed else 'added'} the shape of its ladder table in {paths.rel(doc)}")
        return rc
    if not toolchain.has_gpu():
        say(
            "no NVIDIA GPU visible (nvidia-smi finds none): nothing to time; the README tables stay as they are "
            "(--placeholder writes their shape)"
        )
        return 2
    env = envinfo.environment()
    timeout = max(BENCH_TIMEOUT, float(os.environ.get("GRADER_TIMEOUT", 0)))
    opts = runner.Options(solutions=solutions, timing=TimingMode.LADDER, timeout=timeout)
    results = {r.task_id: r for r in runner.grade(tasks, opts)}
    say(table(list(results.values())))
    for line in runner.busy_notes(list(results.values())):
        say(line)
    rc = 0
    for t in tasks:
        r = results[t.task_id]
        for line in scoring.perf_report(t, r) if r.verdict == Verdict.PASS else []:
            say(f"{t.task_id}: {line}")
        if r.verdict not in (Verdict.PASS, Verdict.SKIPPED):
            line = r.headline()
            say(f"{t.task_id}: {r.verdict}{': ' + line if line else ''}")
            rc = 1
    for t in with_ladder:
        r = results[t.task_id]
        if r.verdict != Verdict.PASS:
            say(f"{t.task_id}: its {t.ladder.name} table is left as it was")  # type: ignore[union-attr]
            rc = 1
            continue
        rows = [x for x in r.timings if x.ladder]
        doc = home(ladders.marker(t.task_id), f"{t.task_id}'s ladder table")
        if doc is None:
            rc = 1
            continue
        existed, png = ladders.write(doc, t, rows, env)
        say("\n" + "\n".join(ladders.table(t, rows)))
        where = "" if existed else " (appended at the end: move the block, markers and all, where it belongs)"
        drawn = f" and its plot into {paths.rel(png)}" if png else " (no plot: pip install matplotlib)"
        say(f"{t.task_id}: wrote the {t.ladder.name} table into {paths.rel(doc)}{where}{drawn}")  # type: ignore[union-attr]
    if solutions and not selectors and folder.parent == paths.ROOT:  # the chapter's table of what the references reach
        lab = folder.name
        if rc != 0:
            say("the reference timings table is left as it was: not every reference solution passed")
        elif (doc := home(timings.marker(lab), f"the {lab} reference timings")) is None:
            rc = 1
        else:
            where = timings.write(doc, lab, list(results.values()), env, f"make bench-{lab} SOLUTIONS=1")
            say(f"the reference timings on {timings.card(env)}: {where} in {paths.rel(doc)}")
    if not selectors and any(t.sweep for r in results.values() for t in r.timings):  # the notebook's data
        stored = folder / "results" / ("reference-bench.json" if solutions else "my-bench.json")
        if solutions and rc != 0:
            say(f"{paths.rel(stored)} is left as it was: not every reference solution passed")
        else:
            stored.parent.mkdir(exist_ok=True)
            files.write_json(stored, list(results.values()), env)
            say(f"the results, batch sweeps included, for the lab's notebook: {paths.rel(stored)}")
    return rc

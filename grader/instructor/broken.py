"""Broken variants: submissions wrong on purpose, that the grader must catch.

Each lab's `labN/solutions/broken.py` describes its variants as edits to the reference
solutions (an edit that no longer applies fails loudly instead of grading a stale copy), the
verdict each must get, and the class of mistake it stands for: one of the classes its task's
spec lists in `mistakes`. `tests/test_broken_variants.py` checks each variant's verdict;
`make verify` grades them all and prints, per lab and class, how many were caught.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

from grader import paths, toolchain
from grader.records import TaskResult, TimingMode
from grader.tasks import CudaTask, NotebookTask, PythonTask, Task, TorchExtensionTask, catalogue

Edits = Sequence[tuple[str, str]]  # (text in the working file, what replaces it)


class Variant(NamedTuple):
    """A broken variant of a lab's reference solution and the verdict the grader must give it."""

    solution: str  # file in labN/solutions/
    edits: list[tuple[str, str]]  # (text in the solution, what replaces it)
    verdicts: set[str]  # any of these is right
    words: str  # the message must contain this (case-insensitive)
    why: str
    huge: bool = False  # caught only by the cases past 2^31 elements (make grade)
    timing: bool = False  # caught only when the timed calls run: graded with timing on (see TIMED)
    perf_points: float | None = None  # the performance points it must earn (a slow `pass`: 0); needs timing
    mistake: str = ""  # the class of mistake, a key of its task's `mistakes`
    gpu: bool = False  # caught only by the GPU checks of a task graded on the CPU: graded where there is a GPU
    # the entry point it breaks, where that one runs on some cards only (Entry.min_cc, max_cc: lab 2's
    # rung 4, sm_90 alone): on another card the grader skips that entry, so the variant is not graded there
    entry: str = ""


def needs_gpu(lab: str, name: str) -> bool:
    """Whether variant `name` can only be graded on a GPU: its task needs one, or only the task's
    GPU checks (which a machine without a GPU leaves out) catch it."""
    return task_of(lab, name).gpu or catalogue_of(lab).VARIANTS[name].gpu


def unsupported_here(lab: str, name: str) -> str:
    """Why variant `name` cannot be graded on this machine's GPU: the entry point it breaks is one
    that this card skips (Entry.min_cc, max_cc), so nothing here could catch it; "" when it can be
    (or there is no GPU: needs_gpu says the rest)."""
    entry = catalogue_of(lab).VARIANTS[name].entry
    found = toolchain.gpus()
    task = task_of(lab, name) if entry and found else None
    if not isinstance(task, CudaTask):
        return ""
    return task.entry(entry).unsupported(toolchain.compute_capability(found[0].compute_capability))


def materialize(base: Path, edits: Edits, name: str, why: str) -> Path:
    """`base` with `edits` applied, written under .build/variants/<name>/ with the same file name
    and a first line that says what is broken."""
    out = paths.BUILD / "variants" / name / base.name
    out.parent.mkdir(parents=True, exist_ok=True)
    if base.suffix == ".ipynb":
        text = _edited_notebook(base, edits, name, why)
    else:
        text = base.read_text()
        for old, new in edits:
            assert old in text, f"{name}: the edit no longer applies to {paths.rel(base)}: {old!r}"
            text = text.replace(old, new)
        mark = "#" if base.suffix == ".py" else "//"
        if not text.startswith(("#!", '"""')) or base.suffix != ".py":
            text = f"{mark} BROKEN ON PURPOSE ({why})\n{text}"
    if not out.exists() or out.read_text() != text:  # unchanged files keep their build caches warm
        out.write_text(text)
    return out


def _edited_notebook(base: Path, edits: Edits, name: str, why: str) -> str:
    """A notebook's edits apply to the source of its code cells (as a student reads them, not as
    JSON escapes them); what is broken goes in the notebook's metadata, which keeps it valid."""
    nb = json.loads(base.read_text())
    cells = [c for c in nb["cells"] if c.get("cell_type") == "code"]
    for old, new in edits:
        for cell in cells:
            source = "".join(cell["source"])
            if old in source:
                cell["source"] = source.replace(old, new).splitlines(keepends=True)
                break
        else:
            raise AssertionError(f"{name}: the edit no longer applies to {paths.rel(base)}: {old!r}")
    nb.setdefault("metadata", {})["broken_on_purpose"] = why
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


# --- a lab's catalogue ------------------------------------------------------------------------


def labs() -> list[str]:
    """The labs that describe broken variants, in lab order (none in a student release)."""
    return [lab.name for lab in paths.labs() if (lab / "solutions" / "broken.py").exists()]


_CATALOGUES: dict[str, ModuleType] = {}


def catalogue_of(lab: str) -> ModuleType:
    """`labN/solutions/broken.py`: VARIANTS, BATCHES, SANITIZED, AT_BUILD, HUGE, TIMED."""
    if lab not in _CATALOGUES:
        spec = importlib.util.spec_from_file_location(f"{lab}_broken", paths.ROOT / lab / "solutions" / "broken.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _CATALOGUES[lab] = module
    return _CATALOGUES[lab]


def task_of(lab: str, name: str) -> Task:
    """The task a variant (`NN_name.what`) breaks."""
    tasks = {Path(t.spec_file).stem.removeprefix("test_"): t for t in catalogue.all_tasks([lab])}
    return tasks[name.split(".")[0]]


def materialize_variant(lab: str, name: str) -> Path:
    v = catalogue_of(lab).VARIANTS[name]
    return materialize(paths.ROOT / lab / "solutions" / v.solution, v.edits, f"{lab}-{name}", v.why)


def sources(lab: str, task: Task, name: str) -> dict[str, Path]:
    """The files a variant is graded with: its broken one, and the task's other files, and those
    of earlier tasks it runs (`builds_on`), as solved."""
    rels = [*task.sources, *getattr(task, "builds_on", ())]
    files = {rel: paths.solution_source(task.lab_dir(), rel) for rel in rels}
    files[catalogue_of(lab).VARIANTS[name].solution] = materialize_variant(lab, name)
    return files


def mistake_problems(lab: str, only: set[str] | None = None) -> list[str]:
    """What is missing between the specs' `mistakes` and the variants: a class with no variant,
    a variant with no class, or one its task does not list (for the tasks in `only`, when given)."""
    tasks = {Path(t.spec_file).stem.removeprefix("test_"): t for t in catalogue.all_tasks([lab])}
    if only is not None:
        tasks = {stem: t for stem, t in tasks.items() if t.task_id in only}
    variants = {n: v for n, v in catalogue_of(lab).VARIANTS.items() if only is None or n.split(".")[0] in tasks}
    problems = []
    for stem, task in tasks.items():
        if not paths.solution_source(task.lab_dir(), task.source).exists():
            continue
        if not task.mistakes:
            problems.append(f"{task.task_id}: its spec lists no `mistakes` (the classes its cases must catch)")
        covered = {v.mistake for n, v in variants.items() if n.split(".")[0] == stem}
        for cls in task.mistakes:
            if cls not in covered:
                problems.append(f"{task.task_id}: mistake class {cls!r} has no variant in {lab}/solutions/broken.py")
    for name, v in variants.items():
        task = tasks.get(name.split(".")[0])
        if task is None:
            problems.append(f"{lab}/{name}: no task {name.split('.')[0]} in {lab}/tests")
        elif not v.mistake:
            problems.append(f"{lab}/{name}: names no mistake class (one of {sorted(task.mistakes)})")
        elif v.mistake not in task.mistakes:
            problems.append(
                f"{lab}/{name}: mistake {v.mistake!r} is not one of {task.task_id}'s: {sorted(task.mistakes)}"
            )
    return problems


# --- grading them ------------------------------------------------------------------------------


def grade(
    lab: str, names: list[str], sanitize: bool, huge: bool = False, timing: TimingMode = TimingMode.OFF
) -> dict[str, TaskResult]:
    """One grading run of the variants `names` (at most one per task), as `make test-labN` grades."""
    from grader.parent import runner

    chosen = [task_of(lab, n) for n in names]
    assert len({t.task_id for t in chosen}) == len(chosen), f"one variant per task in a grading run: {names}"
    files = {t.task_id: sources(lab, t, n) for t, n in zip(chosen, names, strict=True)}
    timeout = 120 if huge or timing == TimingMode.BENCH else (60 if timing != TimingMode.OFF else 20)
    # a notebook runs all its cells before its checks, an extension is built in the task process
    # (a cold build takes about a minute), and a Python task's tests build kernels and run models
    # there (lab 5's generation on the GPU): their own limits, not a kernel's
    slow = NotebookTask | TorchExtensionTask | PythonTask
    timeout = max([timeout] + [t.timeout or 60 for t in chosen if isinstance(t, slow)])
    opts = runner.Options(timing=timing, sanitize=sanitize, huge=huge, timeout=timeout)
    return dict(zip(names, runner.grade(chosen, opts, files), strict=True))


def one_per_task(names: list[str]) -> list[list[str]]:
    """`names` in batches that hold each task at most once (a grading run grades a task once)."""
    batches: list[list[str]] = []
    for name in names:
        task = name.split(".")[0]
        free = next((b for b in batches if all(n.split(".")[0] != task for n in b)), None)
        if free is None:
            batches.append(free := [])
        free.append(name)
    return batches


Run = tuple[str, list[str], bool, bool, TimingMode]  # one grading run: lab, names, sanitize, huge, timing


def _grade_run(run: Run) -> dict[str, TaskResult]:
    lab, names, sanitize, huge, timing = run
    return grade(lab, names, sanitize, huge, timing)


def _worker_setup(jobs: int) -> None:
    # the fork server forks one task process at a time: workers that share it would take turns
    os.environ["GRADER_FORKSERVER"] = "0"
    # each worker's torch (and the task processes it starts, which inherit these) on its share of
    # the cores: `jobs` thread pools of every core each spin against one another, and a lab's
    # variants then take ten times as long (lab 5's on a 64-core host, four verifications at once)
    share = toolchain.cpu_share(jobs)
    os.environ.update(share)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(share["OMP_NUM_THREADS"]))


def grade_lab(
    lab: str,
    gpu: bool,
    huge: bool = True,
    at_build: bool = False,
    jobs: int = 1,
    progress: Callable[[str], None] | None = None,
    only: set[str] | None = None,
) -> dict[str, TaskResult]:
    """Every variant of `lab` (of the tasks whose ids are in `only`, when given), graded: its
    batches, the sanitized ones, the huge ones, the timed ones.
    Without a GPU, the variants of tasks that need none (and, with `at_build`, those of GPU tasks
    that the build decides). `jobs` grading runs at once (the untimed ones: the timed ones run
    alone afterwards, so that no other run shares the GPU while they are timed). `progress` hears
    one line per finished run: a lab's variants take minutes on a GPU."""
    broken = catalogue_of(lab)
    untimed: list[Run] = []
    timed: list[Run] = []
    off = TimingMode.OFF

    def picked(names: list[str]) -> list[str]:
        return [n for n in names if only is None or task_of(lab, n).task_id in only]

    if not gpu:
        chosen = set(broken.AT_BUILD) if at_build else set()
        cpu = [n for batch in broken.BATCHES for n in picked(batch) if not needs_gpu(lab, n) or n in chosen]
        untimed = [(lab, batch, False, False, off) for batch in one_per_task(cpu)]
    else:
        # a task of more GPUs than this machine shows is skipped, and so is an entry point this card
        # cannot run (lab 2's rung 4 outside sm_90): their variants are not graded here
        seen = toolchain.visible_gpu_count()

        def fits(names: list[str]) -> list[str]:
            return [n for n in picked(names) if task_of(lab, n).gpus <= seen and not unsupported_here(lab, n)]

        untimed = [(lab, fits(batch), False, False, off) for batch in broken.BATCHES if fits(batch)]
        # a grading run grades a task once: two races of one task (lab 2's task 15) take two runs
        untimed += [(lab, batch, True, False, off) for batch in one_per_task(fits(broken.SANITIZED))]
        if fits(broken.HUGE) and huge:
            untimed.append((lab, fits(broken.HUGE), False, True, off))
        # they game only the timed calls: timing on, with benchmark timing as `make grade` scores
        # them (quick timing's few calls let a run's noise decide a close target, either way)
        timed = [(lab, batch, False, False, TimingMode.BENCH) for batch in one_per_task(fits(broken.TIMED))]
    out: dict[str, TaskResult] = {}
    start, runs, finished = time.perf_counter(), len(untimed) + len(timed), 0

    def done(results: dict[str, TaskResult]) -> None:
        nonlocal finished
        out.update(results)
        finished += 1
        if progress:
            seconds = time.perf_counter() - start
            progress(f"  {lab}: {finished} of {runs} grading runs done, {len(out)} variants graded ({seconds:.0f} s)")

    if jobs > 1 and len(untimed) > 1:
        workers = min(jobs, len(untimed))
        with ProcessPoolExecutor(workers, initializer=_worker_setup, initargs=(workers,)) as pool:
            for future in as_completed([pool.submit(_grade_run, run) for run in untimed]):
                done(future.result())
    else:
        for run in untimed:
            done(_grade_run(run))
    for run in timed:
        done(_grade_run(run))
    return out


def missed(lab: str, name: str, result: TaskResult) -> str:
    """Why `result` is not the verdict variant `name` must get; "" when it is caught as it should be."""
    from grader.parent import scoring

    v = catalogue_of(lab).VARIANTS[name]
    if str(result.verdict) not in v.verdicts:
        return f"{lab}/{name}: {result.verdict}, expected {' or '.join(sorted(v.verdicts))}: {result.headline()}"
    if v.words.lower() not in result.message.lower():
        return f"{lab}/{name}: {result.verdict} without the words {v.words!r}: {result.headline()}"
    if v.perf_points is not None:  # a slow kernel that is right: the timing, not the verdict, must tell
        task = task_of(lab, name)
        earned = scoring.score(task, result)[0] - task.points
        if earned != v.perf_points:
            return f"{lab}/{name}: {earned:g} performance points, expected {v.perf_points:g}"
    return ""


@dataclasses.dataclass
class Tally:
    caught: int = 0
    graded: int = 0
    total: int = 0


def tally(lab: str, results: dict[str, TaskResult], only: set[str] | None = None) -> dict[str, Tally]:
    """Per mistake class: the variants caught, graded here, and declared (of the tasks in `only`)."""
    counts: dict[str, Tally] = {}
    for name, v in catalogue_of(lab).VARIANTS.items():
        if only is not None and task_of(lab, name).task_id not in only:
            continue
        t = counts.setdefault(v.mistake or "(no class)", Tally())
        t.total += 1
        if name in results:
            t.graded += 1
            t.caught += not missed(lab, name, results[name])
    return dict(sorted(counts.items()))


def check_lab(
    lab: str, gpu: bool, say: Callable[[str], None], jobs: int = 1, only: set[str] | None = None
) -> list[str]:
    """Grades `lab`'s variants (`jobs` grading runs at once; those of the tasks in `only`, when
    given), prints caught / graded per class, and returns one problem per variant the grader let
    through (or judged with the wrong verdict)."""
    results = grade_lab(lab, gpu, huge=False, at_build=True, jobs=jobs, progress=say, only=only)
    problems = [p for n, r in results.items() if (p := missed(lab, n, r))]
    counts = tally(lab, results, only)
    caught = sum(t.caught for t in counts.values())
    graded = sum(t.graded for t in counts.values())
    total = sum(t.total for t in counts.values())
    more = "make grade, more GPUs than this machine shows, or another card"
    here = "" if graded == total else f" ({total - graded} need {'a GPU' if not gpu else more} to run)"
    say(f"{lab}: the grader catches {caught} of {graded} broken variants graded{here}")
    width = max(len(c) for c in counts) if counts else 0
    for cls, t in counts.items():
        mark = "·" if not t.graded else "✓" if t.caught == t.graded else "✗"
        rest = f", {t.total - t.graded} not run here" if t.graded < t.total else ""
        say(f"  {mark} {cls.ljust(width)}  {t.caught}/{t.graded}{rest}")
    return problems + mistake_problems(lab, only)

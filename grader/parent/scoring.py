"""Scores: correctness points for a pass, performance points only on top of a pass."""

from __future__ import annotations

from grader.records import TaskResult, Verdict
from grader.tasks.spec import PerfTarget, Task


def metric(task: Task, result: TaskResult, target: PerfTarget) -> float | None:
    """The value of `target`'s metric in `result`, from the row of its entry on its case (the
    task's timing case unless the target names one); None when that row was not timed."""
    case = target.case or getattr(task, "timing_case", None)
    rows = {t.entry: t for t in result.timings if t.headline and (case is None or t.case == case)}
    # an entry timed only as a ladder rung is judged at the ladder's last (largest) sweep size
    rows |= {t.entry: t for t in result.timings if t.ladder and t.entry and t.entry not in rows}
    row = rows.get(target.entry)
    if row is None:
        return None
    if target.metric in ("share_of_copy", "share_of_peak", "gbps", "gflops"):
        return getattr(row, target.metric)
    if target.metric == "speedup":
        return row.speedup
    if target.metric.startswith("share_of:"):
        return row.vs.get(target.metric.split(":", 1)[1])
    if target.metric.startswith("speedup_over:"):
        other = rows.get(target.metric.split(":", 1)[1])
        return other.median_ms / row.median_ms if other else None
    raise ValueError(f"unknown metric {target.metric}")


def targets(task: Task, result: TaskResult) -> list[PerfTarget]:
    """The task's performance targets that this result can be held to: not those of an entry point
    the card could not run (`result.skipped`: rung 4 of lab 2's tensor-core ladder outside sm_90)."""
    return [p for p in task.perf if p.entry not in result.skipped]


def score(task: Task, result: TaskResult) -> tuple[float, float]:
    """(points, max points). Correctness gates performance: a wrong fast kernel earns nothing.

    A task graded by pytest tests (Python modules, notebooks) earns its points in proportion to
    the `points` marks of the tests that passed, so one failing test does not cost the whole task.
    The targets of an entry point the card could not run count neither way.
    """
    max_points = task.points + sum(p.points for p in targets(task, result))
    if result.tests and result.verdict in (Verdict.PASS, Verdict.WRONG):
        total = sum(t.points for t in result.tests)
        passed = sum(t.points for t in result.tests if t.outcome == "passed")
        points = task.points * passed / total if total else 0.0
        if result.verdict != Verdict.PASS:
            return round(points, 2), max_points
    elif result.verdict != Verdict.PASS:
        return 0.0, max_points
    else:
        points = task.points
    for target in targets(task, result):
        value = metric(task, result, target)
        if value is not None and value >= target.target:
            points += target.points
    return points, max_points


def _what(target: PerfTarget) -> str:
    if target.metric == "share_of_copy":
        return "of the copy bandwidth"
    if target.metric == "share_of_peak":
        return "of the card's theoretical peak"
    if target.metric in ("gbps", "gflops"):
        return ""
    if target.metric == "speedup":
        return "the speed of torch"
    if target.metric.startswith("share_of:"):
        return f"of {target.metric.split(':', 1)[1]}'s speed"
    return f"the speed of {target.metric.split(':', 1)[1]}"


def _fmt(target: PerfTarget, value: float) -> str:
    if target.metric in ("share_of_copy", "share_of_peak") or target.metric.startswith("share_of:"):
        return f"{value:.0%}"
    if target.metric in ("gbps", "gflops"):
        return f"{value:.0f} {'GB/s' if target.metric == 'gbps' else 'GFLOP/s'}"
    return f"{value:.3g}×"


def reached(target: PerfTarget, value: float) -> str:
    """`saxpy reached 85% of the copy bandwidth (target 75%)`: for reports and `make verify`'s gates."""
    what = " " + _what(target) if _what(target) else ""
    at = f" at {target.case}" if target.case else ""
    return f"{target.entry} reached {_fmt(target, value)}{what}{at} (target {_fmt(target, target.target)})"


def perf_report(task: Task, result: TaskResult) -> list[str]:
    """One line per performance target: what was reached, against what, and the points."""
    lines = []
    for t in task.perf:
        value = metric(task, result, t)
        if value is None:
            continue
        met = value >= t.target and result.verdict == Verdict.PASS
        lines.append(
            f"performance: {reached(t, value)}: " + (f"+{t.points:g} points" if met else "no performance points")
        )
    return lines

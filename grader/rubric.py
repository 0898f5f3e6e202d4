"""Scores: correctness points for a pass, performance points only on top of a pass."""

from __future__ import annotations

from grader.spec import PerfTarget, Task
from grader.verdict import TaskResult, Verdict


def metric(result: TaskResult, target: PerfTarget) -> float | None:
    rows = {t.entry: t for t in result.timings}
    row = rows.get(target.entry)
    if row is None:
        return None
    if target.metric == "share_of_copy":
        return row.share_of_copy
    if target.metric == "speedup":
        return row.speedup
    if target.metric.startswith("speedup_over:"):
        other = rows.get(target.metric.split(":", 1)[1])
        return other.median_ms / row.median_ms if other else None
    raise ValueError(f"unknown metric {target.metric}")


def score(task: Task, result: TaskResult) -> tuple[float, float]:
    """(points, max points). Correctness gates performance: a wrong fast kernel earns nothing."""
    max_points = task.points + sum(p.points for p in task.perf)
    if result.verdict != Verdict.PASS:
        return 0.0, max_points
    points = task.points
    for target in task.perf:
        value = metric(result, target)
        if value is not None and value >= target.target:
            points += target.points
    return points, max_points


def describe(task: Task) -> list[str]:
    lines = [f"{task.points:g} points when every check passes"]
    for p in task.perf:
        what = {"share_of_copy": "of the measured copy bandwidth", "speedup": "× torch's speed"}.get(
            p.metric, f"× the speed of {p.metric.split(':', 1)[-1]}"
        )
        lines.append(
            f"+{p.points:g} when {p.entry} reaches {p.target:g}{' ' if p.metric != 'share_of_copy' else ''}{what}"
        )
    return lines

"""The compact table a student sees at the end of `make test-labN`: a row per task and, under the
row of a task that did not pass, its message (the one place the student's terminal shows it)."""

from __future__ import annotations

from grader.records import TaskResult, Timing, Verdict

MARK = {Verdict.PASS: "✓", Verdict.SKIPPED: "-", Verdict.NOT_STARTED: "·"}


def fmt_ms(ms: float | None) -> str:
    if ms is None:
        return ""
    return f"{ms * 1e3:.1f} µs" if ms < 1 else f"{ms:.2f} ms"


def timing_cells(t: Timing | None) -> tuple[str, str, str]:
    if t is None:
        return "", "", ""
    speed = f"{t.speedup:.2f}×" if t.speedup else ""
    share = f"{t.share_of_copy:.0%} ({t.gbps:.0f} GB/s)" if t.share_of_copy is not None and t.gbps else ""
    return fmt_ms(t.median_ms), speed, share


def flops_cell(t: Timing | None) -> str:
    """GFLOP/s, for tasks that declare FLOPs, with its share of the card's peak where known."""
    if t is None or t.gflops is None:
        return ""
    return f"{t.gflops:.0f}" + (f" ({t.gflops / t.peak_gflops:.0%} of peak)" if t.peak_gflops else "")


def details(r: TaskResult) -> list[str]:
    """What a task that did not pass says: its message, then its notes."""
    return [*r.message.splitlines(), *(f"note: {n}" for n in r.notes)]


def table(results: list[TaskResult], with_details: bool = False) -> str:
    """Ladder rows (`make bench-labN`) are left out: their tables go into the lab README. With
    `with_details`, the details of each task that neither passed nor was skipped follow its last
    row, behind a bar; they are no cells, so they do not widen the columns."""
    flops = any(t.gflops is not None for r in results for t in r.timings if t.headline)
    rows = [("task", "verdict", "time", "vs torch", "of copy bw", *(["GFLOP/s"] if flops else []), "points")]
    under: dict[int, list[str]] = {}  # a row's index: the lines printed under it
    for r in results:
        timings: list[Timing | None] = [t for t in r.timings if t.headline] or [None]
        for k, t in enumerate(timings):
            name = f"{r.task_id} {r.title}" if k == 0 else f"  └ {t.entry if t else ''}"
            if k > 0 and t and t.case != timings[0].case:  # type: ignore[union-attr]
                name += f", {t.case}"  # a target's own case (lab 3's batch 4096)
            if k == 0 and len(timings) > 1 and t:
                name += f" ({t.entry})"
            verdict = f"{MARK.get(r.verdict, '✗')} {r.verdict}" if k == 0 else ""
            points = f"{r.points:g}/{r.max_points:g}" if k == 0 and r.max_points else ""
            rows.append((name, verdict, *timing_cells(t), *([flops_cell(t)] if flops else []), points))
        for symbol in r.skipped:  # an entry point this card cannot run (its reason is among the notes)
            rows.append((f"  └ {symbol}", f"{MARK[Verdict.SKIPPED]} skipped", "", "", "", *([""] if flops else []), ""))
        if with_details and r.verdict not in (Verdict.PASS, Verdict.SKIPPED):
            under[len(rows) - 1] = [f"  │ {line}".rstrip() for line in details(r)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    out = []
    for j, row in enumerate(rows):
        out.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
        if j == 0:
            out.append("  ".join("─" * w for w in widths))
        out.extend(under.get(j, []))
    return "\n".join(out)

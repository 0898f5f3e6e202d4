"""The compact table a student sees at the end of `make test-labN`."""

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


def table(results: list[TaskResult]) -> str:
    """Ladder rows (`make bench-labN`) are left out: their tables go into the lab README."""
    flops = any(t.gflops is not None for r in results for t in r.timings if not t.ladder)
    rows = [("task", "verdict", "time", "vs torch", "of copy bw", *(["GFLOP/s"] if flops else []), "points")]
    for r in results:
        timings: list[Timing | None] = [t for t in r.timings if not t.ladder] or [None]
        for k, t in enumerate(timings):
            name = f"{r.task_id} {r.title}" if k == 0 else f"  └ {t.entry if t else ''}"
            if k == 0 and len(timings) > 1 and t:
                name += f" ({t.entry})"
            verdict = f"{MARK.get(r.verdict, '✗')} {r.verdict}" if k == 0 else ""
            points = f"{r.points:g}/{r.max_points:g}" if k == 0 and r.max_points else ""
            rows.append((name, verdict, *timing_cells(t), *([flops_cell(t)] if flops else []), points))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    out = []
    for j, row in enumerate(rows):
        out.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
        if j == 0:
            out.append("  ".join("─" * w for w in widths))
    return "\n".join(out)

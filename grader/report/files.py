"""Machine-readable results for instructors: results.json and summary.md (JUnit XML comes from
pytest's own --junitxml, with each task's verdict and timings attached as properties)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from grader.records import TaskResult, Timing
from grader.report.terminal import flops_cell, fmt_ms


def write_json(path: Path, results: list[TaskResult], env: dict[str, Any]) -> None:
    labs: dict[str, dict[str, float]] = {}
    for r in results:
        lab = labs.setdefault(r.lab, {"points": 0.0, "max_points": 0.0})
        lab["points"] += r.points
        lab["max_points"] += r.max_points
    doc = {
        "environment": env,
        "tasks": [r.to_dict() for r in results],
        "labs": labs,
        "total": {"points": sum(r.points for r in results), "max_points": sum(r.max_points for r in results)},
    }
    path.write_text(json.dumps(doc, indent=2, default=str))


def markdown(results: list[TaskResult], env: dict[str, Any]) -> str:
    gpu = env.get("gpus") or [{}]
    lines = [
        "# Grading summary",
        "",
        f"GPU: {gpu[0].get('name', 'none')} (cc {gpu[0].get('compute_capability', '-')}, driver "
        f"{gpu[0].get('driver', '-')}) · nvcc {env.get('nvcc')} · torch {env.get('torch')} · arch {env.get('arch')}",
        "",
        "| task | verdict | time | vs torch | of copy bw | GFLOP/s | points |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        timings: list[Timing | None] = [t for t in r.timings if t.headline]  # ladders: see the lab README
        for k, t in enumerate(timings or [None]):
            name = f"{r.task_id} {r.title}" if k == 0 else "↳"
            name += f" (`{t.entry}`)" if t and len(timings) > 1 else ""
            speed = f"{t.speedup:.2f}×" if t and t.speedup else ""
            share = f"{t.share_of_copy:.0%}" if t and t.share_of_copy is not None else ""
            verdict, points = (str(r.verdict), f"{r.points:g} / {r.max_points:g}") if k == 0 else ("", "")
            lines.append(
                f"| {name} | {verdict} | {fmt_ms(t.median_ms) if t else ''} | {speed} | {share} | {flops_cell(t)} "
                f"| {points} |"
            )
        lines += [f"| ↳ (`{symbol}`) | skipped |  |  |  |  |  |" for symbol in r.skipped]  # this card cannot run it
    total = sum(r.points for r in results)
    lines += ["", f"**Total: {total:g} / {sum(r.max_points for r in results):g}**", ""]
    kernels = [(r, k) for r in results for k in r.kernels]
    if kernels:
        lines += [
            "## Kernel resources (from ptxas)",
            "",
            "| task | kernel | registers | spills (st/ld bytes) | shared memory |",
            "| --- | --- | --- | --- | --- |",
        ]
        for r, k in kernels:
            lines.append(
                f"| {r.task_id} | `{k.kernel}` | {k.registers} | {k.spill_stores}/{k.spill_loads} | {k.smem_bytes} B |"
            )
        lines.append("")
    sanitized = [(r, s) for r in results for s in r.sanitizer]
    if sanitized:
        lines += ["## compute-sanitizer", "", "| task | tool | result |", "| --- | --- | --- |"]
        lines += [f"| {r.task_id} | {s.tool} | {s.status}{': ' + s.detail if s.detail else ''} |" for r, s in sanitized]
        lines.append("")
    noted = [(r, n) for r in results for n in r.notes]
    if noted:
        lines += ["## Notes", ""] + [f"- {r.task_id}: {n}" for r, n in noted] + [""]
    failing = [r for r in results if r.message and str(r.verdict) != "pass"]
    if failing:
        lines.append("## Details")
        for r in failing:
            lines += ["", f"### {r.task_id} {r.title}: {r.verdict}", "", "```", r.message.strip(), "```"]
    return "\n".join(lines) + "\n"

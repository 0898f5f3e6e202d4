"""The reference solutions' timings as a table in the lab's chapter, one block per card.

`make bench-labN SOLUTIONS=1` grades the lab's reference solutions with benchmark timing and
writes what each timed entry reached (time, against its baseline, share of the copy bandwidth)
between markers named after the lab and the card:

    <!-- timings:lab1:NVIDIA H200 begin -->  ...  <!-- timings:lab1:NVIDIA H200 end -->

with a caption naming the card, driver, toolkit and torch of that run, so that every number in
the table says where it comes from. A card's block is replaced by its next run; a new card's block
goes after the lab's other timing blocks, or at the `<!-- timings:labN -->` marker the chapter
places where the tables belong.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from grader.records import TaskResult, Verdict


def card(env: Mapping[str, Any]) -> str:
    return str((env.get("gpus") or [{}])[0].get("name", "unknown GPU"))


def begin(lab: str, card_name: str) -> str:
    return f"<!-- timings:{lab}:{card_name} begin -->"


def end(lab: str, card_name: str) -> str:
    return f"<!-- timings:{lab}:{card_name} end -->"


def anchor(lab: str) -> str:
    return f"<!-- timings:{lab} -->"


def marker(lab: str) -> str:
    """The pattern that finds the file holding the lab's timing blocks or its anchor (ladders.chapter)."""
    return rf"<!-- timings:{re.escape(lab)}(:[^>]*? begin)? -->"


def _ms(v: float) -> str:
    return f"{v * 1000:.1f} µs" if v < 1 else f"{v:.2f} ms"


def rows(results: Sequence[TaskResult]) -> list[str]:
    """One row per timed entry of each task (ladder rows are the ladders' own tables)."""
    out = []
    for r in results:
        timed = [t for t in r.timings if t.headline]
        if r.verdict != Verdict.PASS or not timed:
            continue
        for t in timed:
            vs = f"{t.speedup:.2f}× {t.baseline}" if t.speedup is not None else "–"
            copy = "–" if t.share_of_copy is None else "<1%" if t.share_of_copy < 0.005 else f"{t.share_of_copy:.0%}"
            out.append(f"| {r.task_id} `{t.entry}` ({t.case}) | {_ms(t.median_ms)} | {vs} | {copy} |")
    return out


def block(lab: str, results: Sequence[TaskResult], env: Mapping[str, Any], command: str) -> str:
    gpu = (env.get("gpus") or [{}])[0]
    timed = [t for r in results for t in r.timings if t.copy_gbps and t.gbps]
    largest = max(timed, key=lambda t: t.gbps * t.median_ms) if timed else None  # the most bytes moved
    caption = (
        f"*{card(env)}, driver {gpu.get('driver', '?')}, CUDA toolkit {env.get('nvcc', '?')}, torch "
        f'{env.get("torch", "?")}. Median of the timed calls. "Of copy": against a device-to-device copy of '
        "the same number of bytes, timed the same way in the same run"
        + (f" ({largest.copy_gbps / 1000:.2f} TB/s for the largest case)" if largest else "")
        + f". Written by `{command}`: do not edit by hand.*"
    )
    table = ["| task, entry (timed case) | time | against | of copy |", "| --- | ---: | ---: | ---: |"]
    return "\n".join([begin(lab, card(env)), caption, "", *table, *rows(results), end(lab, card(env))])


def write(readme: Path, lab: str, results: Sequence[TaskResult], env: Mapping[str, Any], command: str) -> str:
    """Writes this card's block into `readme`; says where (replaced, inserted) or why not."""
    text = readme.read_text()
    new = block(lab, results, env, command)
    mine = re.compile(re.escape(begin(lab, card(env))) + r".*?" + re.escape(end(lab, card(env))), re.S)
    if mine.search(text):
        readme.write_text(mine.sub(lambda _m: new, text, count=1))
        return "replaced"
    others = list(re.finditer(rf"<!-- timings:{re.escape(lab)}:[^>]*? end -->", text))
    if others:
        at = others[-1].end()
        readme.write_text(text[:at] + "\n\n" + new + text[at:])
        return "inserted"
    if anchor(lab) in text:
        readme.write_text(text.replace(anchor(lab), anchor(lab) + "\n\n" + new, 1))
        return "inserted"
    return f"not written: {readme.name} has no `{anchor(lab)}` marker where the table belongs"


def rewrite_marked(path: Path, begin_marker: str, end_marker: str, text: str) -> None:
    """Replaces what stands between two markers of a chapter with `text` (a lab's own benchmark
    script writes its tables this way); ValueError when the markers are missing or out of order."""
    doc = path.read_text(encoding="utf-8")
    if begin_marker not in doc or end_marker not in doc or doc.index(begin_marker) > doc.index(end_marker):
        raise ValueError(f"{path}: no {begin_marker} ... {end_marker} block to replace")
    head, rest = doc.split(begin_marker, 1)
    tail = rest.split(end_marker, 1)[1]
    path.write_text(f"{head}{begin_marker}\n{text}\n{end_marker}{tail}", encoding="utf-8")


def save_bench_results(lab: Path, results: Mapping[str, Any], solutions: bool) -> Path:
    """A lab benchmark's results as JSON: <lab>/results/reference-bench.json for the reference
    solutions, my-bench.json for the student's own code (kept apart: the reference's is committed)."""
    out = lab / "results" / ("reference-bench.json" if solutions else "my-bench.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return out


def write_bench_block(path: Path, begin_marker: str, end_marker: str, text: str) -> None:
    """rewrite_marked for a lab's benchmark script (`--write-readme`): a chapter without the block
    ends the script with the reason, not a traceback."""
    try:
        rewrite_marked(path, begin_marker, end_marker, text)
    except ValueError as e:
        raise SystemExit(str(e)) from None

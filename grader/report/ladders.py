"""A ladder's table (Markdown, into the lab README between markers) and its plot (PNG, beside it).

The block a README holds for task lab2/04 reads

    <!-- ladder:lab2/04 begin -->
    *caption: metric, how it was measured, card, driver, CUDA toolkit, torch*

    | kernel | n=2^20 | n=2^24 |
    | --- | ---: | ---: |
    | `reduce_v0` | 412 | 980 |
    | torch (baseline) | 2710 | 3050 |

    ![reduction ladder](figures/ladder-04.png)
    <!-- ladder:lab2/04 end -->

and only `make bench-labN` writes it, into whichever of the lab's Markdown files holds the block's
markers (`chapter`: a lab may split its chapter over several files). Its shape, the header and the
first column, follows from the task's Ladder declaration alone (`expected_shape`), so `drift` can
tell on any machine, GPU or not, when the README and the declaration disagree; the numbers are the
GPU's business.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from grader import paths
from grader.records import Timing
from grader.report.terminal import fmt_ms
from grader.tasks.ladder import METRICS, Ladder, metric_caption
from grader.tasks.spec import CudaTask, Task

BLOCK = re.compile(r"<!-- ladder:(?P<id>[\w./-]+) begin -->\n(?P<body>.*?)<!-- ladder:(?P=id) end -->", re.S)
PLACEHOLDER = "–"


def begin(task_id: str) -> str:
    return f"<!-- ladder:{task_id} begin -->"


def end(task_id: str) -> str:
    return f"<!-- ladder:{task_id} end -->"


def laddered(tasks: Iterable[Task]) -> list[CudaTask]:
    return [t for t in tasks if isinstance(t, CudaTask) and t.ladder is not None]


def bench_command(task: Task) -> str:
    """What writes the task's table: `make bench-labN`, or the bench command for a fixture folder."""
    if re.fullmatch(r"lab\d+", task.lab):
        return f"make bench-{task.lab}"
    return f"python -m grader bench {paths.rel(task.lab_dir())}"


def chapter(folder: Path, pattern: str, what: str) -> Path:
    """The one Markdown file directly in `folder` whose text matches `pattern` (a block's markers).

    A lab written as a single README.md that lacks the markers gets README.md, where a new block
    is appended; a lab split over several files must hold the markers in exactly one of them,
    since appending to the entry point would put the block far from the text it belongs to.
    Raises LookupError, naming the files, when no file or several hold them."""
    docs = sorted(folder.glob("*.md"))
    holding = [doc for doc in docs if re.search(pattern, doc.read_text())]
    if len(holding) == 1:
        return holding[0]
    names = ", ".join(paths.rel(doc) for doc in (holding or docs))
    if holding:
        raise LookupError(f"{what}: its markers are in {len(holding)} files ({names}); keep them in one")
    readme = folder / "README.md"
    if docs in ([], [readme]):
        return readme
    raise LookupError(f"{what}: none of {names} holds its markers; place them where the table belongs")


def marker(task_id: str) -> str:
    """The pattern `chapter` looks for to find the file that holds a task's ladder block."""
    return re.escape(begin(task_id))


def figure_path(readme: Path, task: Task) -> Path:
    return readme.parent / "figures" / f"ladder-{task.number}.png"


# --- cells --------------------------------------------------------------------------------------


def value(row: Timing, metric: str) -> float | None:
    if metric == "time":
        return row.median_ms
    if metric.startswith("share_of:"):
        return row.vs.get(metric.split(":", 1)[1])
    return getattr(row, metric)


def fmt(metric: str, v: float | None) -> str:
    if v is None:
        return PLACEHOLDER
    if metric == "time":
        return fmt_ms(v)
    if metric.startswith("share_of"):
        return f"{v:.0%}"
    if metric == "speedup":
        return f"{v:.2f}×"
    return f"{v:.0f}"


def _row_key(row: Timing) -> str:
    return row.rung or row.entry


def grid(ladder: Ladder, rows: Sequence[Timing]) -> list[list[float | None]]:
    """values[i][j]: row label i (rungs, then baselines) at sweep size j; None where not timed."""
    by = {(_row_key(r), r.case): r for r in rows}
    keys = [*ladder.rungs, *ladder.baselines]
    return [
        [value(by[(k, c.label)], ladder.metric) if (k, c.label) in by else None for c in ladder.sweep] for k in keys
    ]


# --- the block ----------------------------------------------------------------------------------


def caption(task: CudaTask, env: Mapping[str, Any] | None) -> str:
    ladder = task.ladder
    assert ladder is not None
    what = f"{ladder.name}: {metric_caption(ladder.metric)}"
    if ladder.metric in METRICS and not METRICS[ladder.metric][1]:
        what += " (lower is better)"
    if env is None:
        return f"*{what}. Not measured yet: `{bench_command(task)}` on a GPU writes the numbers.*"
    gpu = (env.get("gpus") or [{}])[0]
    return (
        f"*{what}. Median of each kernel's timed calls, L2 flushed before every call, inputs rotated, "
        f"rungs and baselines interleaved in one run. {gpu.get('name', 'unknown GPU')}, driver "
        f"{gpu.get('driver', '?')}, CUDA toolkit {env.get('nvcc', '?')}, torch {env.get('torch', '?')}. "
        f"Written by `{bench_command(task)}`: do not edit by hand.*"
    )


def table(task: CudaTask, rows: Sequence[Timing] | None) -> list[str]:
    ladder = task.ladder
    assert ladder is not None
    header = ladder.header()
    lines = ["| " + " | ".join(header) + " |", "| --- |" + " ---: |" * (len(header) - 1)]
    values = grid(ladder, rows) if rows is not None else [[None] * len(ladder.sweep) for _ in ladder.row_labels()]
    for label, vs in zip(ladder.row_labels(), values, strict=True):
        lines.append("| " + " | ".join([label, *(fmt(ladder.metric, v) for v in vs)]) + " |")
    return lines


def block(task: CudaTask, rows: Sequence[Timing] | None, env: Mapping[str, Any] | None, figure: str | None) -> str:
    """The whole block, markers included; `rows` None gives the shape without numbers."""
    ladder = task.ladder
    assert ladder is not None
    body = [caption(task, env), "", *table(task, rows)]
    if figure:
        body += ["", f"![{ladder.name} ladder]({figure})"]
    return "\n".join([begin(task.task_id), *body, end(task.task_id)])


def replace_block(text: str, task_id: str, new_block: str) -> tuple[str, bool]:
    """`text` with the task's block replaced (True), or with it appended when it had none (False)."""
    for m in BLOCK.finditer(text):
        if m.group("id") == task_id:
            return text[: m.start()] + new_block + text[m.end() :], True
    return text.rstrip("\n") + "\n\n" + new_block + "\n", False


def write(
    readme: Path, task: CudaTask, rows: Sequence[Timing] | None, env: Mapping[str, Any] | None, plot_it: bool = True
) -> tuple[bool, Path | None]:
    """Writes the task's block into `readme` (and its plot beside it, when there are numbers and
    matplotlib). Returns (whether the block was already there, the plot written or None)."""
    png = None
    if rows is not None and plot_it:
        png = figure_path(readme, task)
        if not plot(task, rows, png, env):
            png = None
    figure = png.relative_to(readme.parent).as_posix() if png else None
    text = readme.read_text() if readme.exists() else ""
    new, existed = replace_block(text, task.task_id, block(task, rows, env, figure))
    readme.write_text(new)
    return existed, png


def plot(task: CudaTask, rows: Sequence[Timing], path: Path, env: Mapping[str, Any] | None) -> bool:
    """The ladder as lines over the sweep (rungs solid, baselines dashed); False without matplotlib."""
    try:
        from matplotlib.figure import Figure  # the object API: no pyplot, no display, no global state
    except ImportError:
        return False
    ladder = task.ladder
    assert ladder is not None
    values = grid(ladder, rows)
    labels = [lab.replace("`", "") for lab in ladder.row_labels()]
    xs = list(range(len(ladder.sweep)))
    fig = Figure(figsize=(7.5, 4.2), layout="constrained")
    ax = fig.subplots()
    n_rungs = len(ladder.rungs)
    for i, (label, ys) in enumerate(zip(labels, values, strict=True)):
        pts = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
        if not pts:
            continue
        style = {"linestyle": "--", "color": "0.35"} if i >= n_rungs else {}
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label, **style)
    finite = [y for ys in values for y in ys if y]
    if finite and max(finite) / min(finite) > 50:
        ax.set_yscale("log")
    ax.set_xticks(xs, [c.label for c in ladder.sweep])
    ax.margins(x=0.08)
    ax.set_xlabel("size")
    ax.set_ylabel(metric_caption(ladder.metric).split(" (")[0])
    gpu = ((env or {}).get("gpus") or [{}])[0].get("name", "")
    ax.set_title(f"{task.task_id} {ladder.name}" + (f" — {gpu}" if gpu else ""))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return True


# --- drift: the README against the declarations -------------------------------------------------


def parse_table(body: str) -> tuple[list[str], list[str]]:
    """(header cells, first-column labels) of the first Markdown table in a block."""
    lines = [ln.strip() for ln in body.splitlines() if ln.strip().startswith("|")]
    if not lines:
        return [], []

    def cells(line: str) -> list[str]:
        return [c.strip() for c in line.strip("|").split("|")]

    header = cells(lines[0])
    rows = [cells(ln)[0] for ln in lines[1:] if not re.fullmatch(r"\|?[\s:|-]+\|?", ln)]
    return header, rows


def blocks(text: str) -> dict[str, str]:
    return {m.group("id"): m.group("body") for m in BLOCK.finditer(text)}


def drift(task: CudaTask, readme_text: str) -> list[str]:
    """What differs between the task's ladder declaration and its README block, in shape."""
    ladder = task.ladder
    assert ladder is not None
    found = blocks(readme_text)
    if task.task_id not in found:
        return [
            f"{task.task_id}: no ladder block ({begin(task.task_id)} ... {end(task.task_id)}) in its README: "
            f"run `python -m grader bench {paths.rel(task.lab_dir())} --task {task.number} --placeholder`, or "
            f"`{bench_command(task)}` on a GPU"
        ]
    header, labels = parse_table(found[task.task_id])
    problems = []
    if header != ladder.header():
        problems.append(f"{task.task_id}: the README table's header is {header}, the ladder declares {ladder.header()}")
    if labels != ladder.row_labels():
        problems.append(
            f"{task.task_id}: the README table's rows are {labels}, the ladder declares {ladder.row_labels()}"
        )
    if problems:
        problems[-1] += f": run `{bench_command(task)}` on a GPU (or its `--placeholder` to reset the shape)"
    return problems


def orphans(tasks: Iterable[Task], readme_text: str) -> list[str]:
    """Blocks in a README that no task's ladder declares (a renamed task, a ladder removed)."""
    known = {t.task_id for t in laddered(tasks)}
    return [f"ladder block {i} has no ladder declared for it" for i in blocks(readme_text) if i not in known]

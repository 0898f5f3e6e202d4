"""A ladder: several implementations of one operation, timed side by side over a sweep of sizes.

A lab that climbs from a naive kernel to library speed (reduction v0..v5, SGEMM v1..v7) declares
its rungs (entry points of the task, slowest first), the sizes to sweep, the library baselines
(torch, cuBLAS: callables taking (inputs, outputs) like `Entry.baseline`) and the metric its
table and plot show. `make bench-labN` times every rung and every baseline interleaved, one
sweep size at a time, so every ratio compares code that ran under the same clocks; it writes
the table into the lab README between markers and a plot beside it. The README table's shape
(header and row labels) follows from this declaration alone, so `make check` can tell when the
two drift apart without a GPU.

    Ladder(
        name="reduction",
        rungs=["reduce_v0", "reduce_v1", ...],
        sweep=[Case("n=2^20", n=1 << 20), Case("n=2^24", n=1 << 24)],
        baselines={"torch": lambda v, o: torch.sum(v["x"], out=o["out"])},
        metric="gbps",
        labels={"reduce_v0": "v0 interleaved, divergent"},
    )
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from grader.tasks.spec import Case, Values

if TYPE_CHECKING:
    from grader.tasks.spec import CudaTask

# metric -> (what the table's caption calls it, whether higher is better)
METRICS: dict[str, tuple[str, bool]] = {
    "time": ("median time per call", False),
    "gbps": ("GB/s (bytes the operation must move / median time)", True),
    "gflops": ("GFLOP/s (FLOPs the operation needs / median time)", True),
    "share_of_copy": ("share of the copy bandwidth measured in the same run", True),
    "share_of_peak": ("share of the card's theoretical peak (FLOP/s where FLOPs are declared, else DRAM)", True),
    "speedup": ("speed-up over the first baseline (its time / this time)", True),
}


def metric_caption(metric: str) -> str:
    if metric.startswith("share_of:"):
        return f"share of {metric.split(':', 1)[1]}'s speed (its time / this time)"
    return METRICS[metric][0]


@dataclass(frozen=True)
class Ladder:
    """Rungs and baselines of one operation, and how their table and plot read."""

    name: str
    rungs: Sequence[str]
    sweep: Sequence[Case]
    baselines: Mapping[str, Callable[[Values, Values], Any]] = field(default_factory=dict)
    metric: str = "gbps"  # time | gbps | gflops | share_of_copy | share_of_peak | speedup | share_of:<baseline>
    labels: Mapping[str, str] = field(default_factory=dict)  # rung symbol -> row label (default `symbol`)

    def rung_label(self, symbol: str) -> str:
        return self.labels.get(symbol, f"`{symbol}`")

    @staticmethod
    def baseline_label(name: str) -> str:
        return f"{name} (baseline)"

    def row_labels(self) -> list[str]:
        """The table's first column, top to bottom: the rungs in order, then the baselines."""
        return [self.rung_label(s) for s in self.rungs] + [self.baseline_label(b) for b in self.baselines]

    def header(self) -> list[str]:
        return ["kernel", *(c.label for c in self.sweep)]

    def problems(self, task: CudaTask) -> list[str]:
        """What makes this declaration unusable for `task` (empty when it is sound)."""
        out = []
        symbols = {e.symbol for e in task.entries}
        out += [f"rung `{s}` is not an entry point of {task.task_id}" for s in self.rungs if s not in symbols]
        if not self.rungs or not self.sweep:
            out.append("a ladder needs at least one rung and one sweep size")
        if len({c.label for c in self.sweep}) != len(self.sweep):
            out.append("sweep labels must be distinct")
        m = self.metric
        if m.startswith("share_of:"):
            if m.split(":", 1)[1] not in self.baselines:
                out.append(f"metric {m}: no baseline of that name")
        elif m not in METRICS:
            out.append(f"unknown metric {m!r}: one of {', '.join(METRICS)} or share_of:<baseline>")
        elif m == "speedup" and not self.baselines:
            out.append("metric speedup needs a baseline")
        entries = [e for e in task.entries if e.symbol in self.rungs]
        if m in ("gbps", "share_of_copy") and any(e.bytes_moved is None for e in entries):
            out.append(f"metric {m} needs bytes_moved on every rung")
        if m == "gflops" and any(e.flops is None for e in entries):
            out.append("metric gflops needs flops on every rung")
        return out

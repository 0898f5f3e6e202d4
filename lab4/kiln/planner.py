"""Lab 4 task 01 · the memory planner: liveness, then one arena for every tensor of a run.

Implement: `liveness` (the first and last step of every tensor that owns memory) and the placement
           loop of `plan_memory` (a 256-aligned byte offset for every such tensor), in the TODO
           regions. The chapter's section "Task 01: liveness and interval allocation" explains both.
Contract:  a step is an index into `graph.nodes` (a topological order). A tensor owns memory unless
           its operator is a view (`kiln.ops.get(op).view_of` is not None: reshape, slice_update);
           a view shares its owner's bytes, found by following `view_of` (views of views too).
           `liveness(graph)` maps every owning node to `Lifetime(first, last)`: `first` the step
           that defines it, `last` the last step that reads it, directly or through a view.
           Sources (input, constant, buffer), graph outputs and the owners of output views live to
           the end; sources from step 0 (the executor copies inputs in before the first step).
           `plan_memory(graph)` returns a `Plan`: every owning tensor at an offset that is a
           multiple of ALIGNMENT, inside `arena_bytes`, and two tensors whose lifetimes overlap
           (share a step) never share a byte. Views get their owner's offset.
Test:      make test-lab4 TASK=01
"""

from __future__ import annotations

from dataclasses import dataclass

from kiln import ops
from kiln.ir import SOURCES, Graph, Node

ALIGNMENT = 256  # bytes: what cudaMalloc guarantees, and enough for any vector load


def align_up(nbytes: int, alignment: int = ALIGNMENT) -> int:
    """`nbytes` rounded up to a multiple of `alignment`."""
    return -(-nbytes // alignment) * alignment


@dataclass
class Lifetime:
    """The steps a tensor's bytes must survive: defined at `first`, last read at `last` (inclusive)."""

    first: int
    last: int

    def overlaps(self, other: Lifetime) -> bool:
        """Both alive at some step: the writer of one step and the tensors it reads are live together."""
        return self.first <= other.last and other.first <= self.last


def is_view(node: Node) -> bool:
    """True when the node's output shares an input's memory instead of owning its own."""
    if node.op in SOURCES:
        return False
    return ops.get(node.op).view_of is not None


def owner_of(node: Node) -> Node:
    """The node whose memory `node` lives in: itself, or for a view, its input's owner (recursively)."""
    while is_view(node):
        node = node.inputs[ops.get(node.op).view_of]
    return node


def liveness(graph: Graph) -> dict[Node, Lifetime]:
    """Lifetime of every node that owns memory (views have none: they extend their owner's)."""
    life: dict[Node, Lifetime] = {}
    # born at its own step, extended by every read (a view's read extends its owner), outputs to the
    # end, sources (input, constant, buffer) for the whole run
    # TODO(lab4/01) begin: a Lifetime for every owner; see the chapter's section "Liveness"; about 15 lines
    raise NotImplementedError("lab4/01: liveness")  # ~
    # TODO(lab4/01) end
    return life


@dataclass
class Plan:
    """Where every tensor lives in one arena of `arena_bytes`.

    `offsets`: byte offset of every node of the graph (a view: its owner's).
    `sizes`: bytes reserved for every owning node: its nbytes rounded up to ALIGNMENT.
    `lifetimes`: `liveness(graph)`, the intervals the placement respected.
    """

    offsets: dict[Node, int]
    sizes: dict[Node, int]
    arena_bytes: int
    lifetimes: dict[Node, Lifetime]

    @property
    def peak_live_bytes(self) -> int:
        """The lower bound for any arena: the most bytes live at one step (aligned sizes)."""
        if not self.lifetimes:
            return 0
        steps = max(lt.last for lt in self.lifetimes.values()) + 1
        live = [0] * (steps + 1)
        # difference array: +size where a lifetime starts, -size one step after it ends
        for node, lt in self.lifetimes.items():
            live[lt.first] += self.sizes[node]
            live[lt.last + 1] -= self.sizes[node]
        peak = running = 0
        for delta in live:
            running += delta
            peak = max(peak, running)
        return peak

    @property
    def total_bytes(self) -> int:
        """The arena without any reuse: every owning tensor in a slot of its own."""
        return sum(self.sizes.values())


def _finish(graph: Graph, life: dict[Node, Lifetime], sizes: dict[Node, int], placed: dict[Node, int]) -> Plan:
    """The Plan of a placement of the owning nodes: views take their owner's offset."""
    offsets = {node: placed[owner_of(node)] for node in graph.nodes}
    arena = max((placed[n] + sizes[n] for n in placed), default=0)
    return Plan(offsets=offsets, sizes=sizes, arena_bytes=arena, lifetimes=life)


def plan_memory(graph: Graph) -> Plan:
    """One arena for the whole run: greedy by size, each tensor at the lowest offset that fits."""
    life = liveness(graph)
    sizes = {node: align_up(node.type.nbytes) for node in life}
    placed: dict[Node, int] = {}
    # placed[node] = offset for every node of `life`: largest first, each at the lowest offset clear of
    # the already placed tensors whose lifetimes overlap its own; `sizes` are already aligned
    # TODO(lab4/01) begin: greedy by size; see the chapter's section "Placement"; about 10 lines
    raise NotImplementedError("lab4/01: placement")  # ~
    # TODO(lab4/01) end
    return _finish(graph, life, sizes, placed)


def best_fit_plan(graph: Graph) -> Plan:
    """The baseline to compare with (given): an online best-fit allocator, as a caching allocator
    works. Walks the steps in order; frees what is dead, then gives each tensor defined at this step
    the smallest free hole that fits, or grows the arena. It never sees the future, so it can leave
    holes that greedy-by-size, which knows every lifetime in advance, avoids."""
    life = liveness(graph)
    sizes = {node: align_up(node.type.nbytes) for node in life}
    placed: dict[Node, int] = {}
    holes: list[tuple[int, int]] = []  # (offset, size) of free ranges below `top`, sorted by offset
    top = 0
    steps = len(graph.nodes)
    for step in range(steps):
        # free the tensors whose last read was the step before: this step's output may reuse them
        for node in placed:
            if life[node].last == step - 1:
                holes.append((placed[node], sizes[node]))
        holes = _merge(holes)
        for node in (n for n in life if life[n].first == step):
            need = sizes[node]
            fits = [h for h in holes if h[1] >= need]
            if fits:
                start, size = min(fits, key=lambda h: (h[1], h[0]))
                holes.remove((start, size))
                if size > need:
                    holes.append((start + need, size - need))
                    holes.sort()
            elif holes and holes[-1][0] + holes[-1][1] == top:
                start = holes.pop()[0]  # extend the free range at the top rather than leave it
                top = start + need
            else:
                start = top
                top += need
            placed[node] = start
    return _finish(graph, life, sizes, placed)


def _merge(holes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Free ranges sorted by offset, adjacent ones joined."""
    out: list[tuple[int, int]] = []
    for start, size in sorted(holes):
        if out and out[-1][0] + out[-1][1] == start:
            out[-1] = (out[-1][0], out[-1][1] + size)
        else:
            out.append((start, size))
    return out


def _kib(nbytes: int) -> str:
    return f"{nbytes / 1024:.1f} KiB"


def describe(plan: Plan, graph: Graph) -> str:
    """A few lines comparing a plan with the lower bound, best-fit and no reuse at all."""
    bound = plan.peak_live_bytes
    best = best_fit_plan(graph).arena_bytes

    def gap(n: int) -> str:
        return f"{100.0 * (n - bound) / bound:+.1f}% over the bound" if bound else "n/a"

    return "\n".join(
        [
            f"graph {graph.name}: {len(plan.lifetimes)} tensors own memory, {len(graph.nodes)} nodes",
            f"  arena        {_kib(plan.arena_bytes):>12}  ({gap(plan.arena_bytes)})",
            f"  lower bound  {_kib(bound):>12}  (the most bytes live at one step)",
            f"  best-fit     {_kib(best):>12}  ({gap(best)})",
            f"  no reuse     {_kib(plan.total_bytes):>12}  ({gap(plan.total_bytes)})",
        ]
    )

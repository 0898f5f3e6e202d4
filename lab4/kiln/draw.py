"""Pictures of a graph, for the labs' notebooks and chapters (given code; needs matplotlib).

    from kiln.draw import draw_graph
    draw_graph(graph)                        # a new figure
    draw_graph(graph, ax=ax, weights=False)  # into an axis, constants left out

Nodes are laid out by topological depth (a source has depth 0, any other node is one deeper than
its deepest input), edges go from each input to its reader. Sources are blue, views (no memory of
their own) green, the other operators orange.
"""

from __future__ import annotations

from typing import Any

from kiln import ops
from kiln.ir import SOURCES, Graph, Node

SOURCE_COLOR, VIEW_COLOR, OP_COLOR = "#cfe0f5", "#cdeccd", "#fbe0c4"


def depths(graph: Graph, shown: set[Node] | None = None) -> dict[Node, int]:
    d: dict[Node, int] = {}
    for node in graph.nodes:  # a topological order: inputs come first
        if shown is None or node in shown:
            d[node] = 1 + max((d[i] for i in node.inputs if i in d), default=-1)
    return d


def kind_color(node: Node) -> str:
    if node.op in SOURCES:
        return SOURCE_COLOR
    return VIEW_COLOR if ops.get(node.op).view_of is not None else OP_COLOR


def label(node: Node) -> str:
    """`%name`, the operator (a constant's name instead) and the type, one per line."""
    what = node.attrs["name"] if node.op in ("constant", "buffer") else node.op
    return f"%{node.name}\n{what}\n{node.type}"


def draw_graph(
    graph: Graph, ax: Any = None, *, weights: bool = True, title: str | None = None, gap: float = 2.2
) -> Any:
    """Draws `graph` into `ax` (a new figure when None) and returns the axis. `weights=False`
    leaves the constants out: a model's picture shows its data flow, not its hundred weights."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch

    shown = {n for n in graph.nodes if weights or n.op != "constant"}
    d = depths(graph, shown)
    columns: dict[int, list[Node]] = {}
    for node in graph.nodes:
        if node in shown:
            columns.setdefault(d[node], []).append(node)
    where = {}
    for depth, nodes in columns.items():
        for row, node in enumerate(nodes):
            where[node] = (depth * gap, -(row - (len(nodes) - 1) / 2) * 1.1)
    if ax is None:
        _fig, ax = plt.subplots(figsize=(gap * len(columns) + 1, 1.1 * max(map(len, columns.values())) + 1.5))
    for node in shown:
        for src in node.inputs:
            if src in where:
                ax.add_patch(
                    FancyArrowPatch(
                        where[src],
                        where[node],
                        arrowstyle="-|>",
                        mutation_scale=12,
                        shrinkA=28,
                        shrinkB=28,
                        color="#555",
                    )
                )
    for node, (px, py) in where.items():
        bbox = {"boxstyle": "round", "fc": kind_color(node), "ec": "#666"}
        ax.text(px, py, label(node), ha="center", va="center", fontsize=7.5, bbox=bbox)
    outs = ", ".join(f"%{n.name}" for n in graph.outputs)
    ax.set_title(title or f"graph {graph.name}: {len(graph.nodes)} nodes, outputs {outs}")
    xs = [p[0] for p in where.values()]
    ys = [p[1] for p in where.values()]
    ax.set_xlim(min(xs) - 1.2, max(xs) + 1.2)
    ax.set_ylim(min(ys) - 0.8, max(ys) + 0.8)
    ax.axis("off")
    return ax

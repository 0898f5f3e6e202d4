"""kiln's intermediate representation: a graph of typed nodes.

A model is a `Graph`: nodes in a topological order (every node after the nodes it reads), each
with an operator name, its input nodes, constant attributes and the type of the one tensor it
produces. A run executes the nodes in list order. Three operators have no inputs and stand for
memory the model owns or is given:

    input     a tensor the caller passes to every run             attrs: name
    constant  a weight, fixed when the model is compiled           attrs: name   (value in Graph.constants)
    buffer    persistent state (a KV cache), kept between runs     attrs: name   (zeros at compile time)

Every other operator is declared in kiln/ops.py, which says how to infer its output type,
whether its output is a view of an input's memory and which inputs it writes in place. Lab 5
adds operators there; this file never changes for them.

Tensors are dense and row-major (contiguous); shapes have rank 1 to 4.

A buffer is the one tensor a run changes in place (slice_update writes into it). Each node that
stands for a buffer names one version of its contents: `%kv = buffer` the contents the run starts
with, `%u = slice_update(%kv, ...)` the contents after that write, a reshape the version of its
input. There is one copy of the bytes, so a node sees the version it names only if it runs before
the buffer's next write. `check_writes` (called by Graph.validate) holds every graph to that:

    a node that reads a version of a buffer comes before the next write into that buffer, and the
    writer itself reads the buffer through its target only; an output is the buffer's last version.

So a node that must see a write reads the writer's node (its edge puts it after the write), and a
node that must see the old contents reads the older node and comes before the write. A pass that
reorders nodes keeps the graph's meaning if the graph still validates.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

MAX_RANK = 4
SOURCES = ("input", "constant", "buffer")  # operators without inputs: memory from outside the run


class IRError(ValueError):
    """A malformed graph: a cycle, a dangling reference, a duplicate name, a bad type."""


class DType(Enum):
    """Element types: the text form (`f32`), the torch name and the size of one element."""

    float32 = ("f32", "float32", 4)
    float16 = ("f16", "float16", 2)
    bfloat16 = ("bf16", "bfloat16", 2)
    int64 = ("i64", "int64", 8)

    def __init__(self, short: str, torch_name: str, itemsize: int) -> None:
        self.short = short
        self.torch_name = torch_name
        self.itemsize = itemsize

    @property
    def is_float(self) -> bool:
        return self is not DType.int64

    @classmethod
    def parse(cls, text: str) -> DType:
        """`f32`, `float32` or a torch dtype's name (`torch.float32`) -> DType."""
        key = text.removeprefix("torch.")
        for d in cls:
            if key in (d.short, d.torch_name):
                return d
        known = ", ".join(f"{d.short} ({d.torch_name})" for d in cls)
        raise IRError(f"unknown dtype {text!r}: kiln knows {known}")


@dataclass(frozen=True)
class TensorType:
    """shape and dtype of a tensor: `f32[4, 784]`."""

    shape: tuple[int, ...]
    dtype: DType

    def __post_init__(self) -> None:
        if not 1 <= len(self.shape) <= MAX_RANK:
            raise IRError(f"rank {len(self.shape)} for shape {list(self.shape)}: kiln's tensors have rank 1 to 4")
        if any(not isinstance(d, int) or d < 1 for d in self.shape):
            raise IRError(f"shape {list(self.shape)}: every dimension is a positive int")

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def __str__(self) -> str:
        return f"{self.dtype.short}[{', '.join(map(str, self.shape))}]"


@dataclass(eq=False)
class Node:
    """One operator application. `name` is unique in its graph (printed `%name`); identity, not
    value, makes two nodes the same, so a DAG that reads one node twice holds one object."""

    name: str
    op: str
    inputs: tuple[Node, ...]
    attrs: dict[str, Any]
    type: TensorType

    def __repr__(self) -> str:
        return f"%{self.name} = {self.op}({', '.join('%' + i.name for i in self.inputs)}) : {self.type}"


@dataclass(eq=False)
class Graph:
    """Nodes in a topological order, the outputs, and the constants' values by name.

    `constants` maps a constant node's `name` attribute to its value (a torch tensor, on the CPU
    or the GPU, of the node's shape and dtype); the text form names constants but does not carry their values.
    """

    name: str = "model"
    nodes: list[Node] = field(default_factory=list)
    outputs: list[Node] = field(default_factory=list)
    constants: dict[str, Any] = field(default_factory=dict)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise IRError(f"graph {self.name!r} has no node %{name}")

    def of_op(self, op: str) -> list[Node]:
        return [n for n in self.nodes if n.op == op]

    @property
    def inputs(self) -> list[Node]:
        return self.of_op("input")

    @property
    def buffers(self) -> list[Node]:
        return self.of_op("buffer")

    def users(self) -> dict[Node, list[Node]]:
        """node -> the nodes that read it, in order (a node read twice by one user appears twice)."""
        out: dict[Node, list[Node]] = {n: [] for n in self.nodes}
        for n in self.nodes:
            for i in n.inputs:
                out[i].append(n)
        return out

    def validate(self) -> None:
        """Raises IRError unless names are unique, every input is an earlier node of this graph (no
        cycle, no dangling reference), sources have no inputs, every output is a node here, and
        every read of a buffer comes before the buffer's next write (`check_writes`)."""
        seen: dict[int, Node] = {}
        names: set[str] = set()
        for n in self.nodes:
            if n.name in names:
                raise IRError(f"two nodes are named %{n.name}")
            names.add(n.name)
            if n.op in SOURCES and n.inputs:
                raise IRError(f"%{n.name}: {n.op} takes no inputs")
            for i in n.inputs:
                if id(i) not in seen:
                    later = any(i is m for m in self.nodes)
                    why = "a later node (a cycle, or nodes out of order)" if later else "a node outside this graph"
                    raise IRError(f"%{n.name} ({n.op}) reads %{i.name}, {why}")
            seen[id(n)] = n
        for o in self.outputs:
            if id(o) not in seen:
                raise IRError(f"output %{o.name} is not a node of graph {self.name!r}")
        if not self.outputs:
            raise IRError(f"graph {self.name!r} has no output")
        check_writes(self)


def check_writes(graph: Graph) -> None:
    """Raises IRError, naming the reader and the writer, where a node reads a buffer after a write
    that the node it reads does not include (the module's docstring states the rule).

    Only operators registered in kiln/ops.py with `writes` change memory; an unknown operator is
    treated as one that writes nothing (check_graph reports it)."""
    from kiln import ops  # ops imports this module: import it when a graph is checked

    def opdef(n: Node) -> Any:
        return None if n.op in SOURCES else ops.REGISTRY.get(n.op)

    def owner(n: Node) -> Node:
        """The node whose memory n is: a source or a tensor of its own, through any views."""
        while (d := opdef(n)) is not None and d.view_of is not None:
            n = n.inputs[d.view_of]
        return n

    def version(n: Node) -> Node:
        """The node that names the contents n stands for: n, or for a plain view, its input's."""
        while (d := opdef(n)) is not None and d.view_of is not None and d.view_of not in d.writes:
            n = n.inputs[d.view_of]
        return n

    # buffer -> (its last writer so far, the node naming the contents after that write, or None
    # when the writer's output is not the buffer)
    written: dict[Node, tuple[Node, Node | None]] = {}

    def stale(x: Node) -> tuple[str, Node, Node | None] | None:
        """None when reading x now sees the contents x names; else x as the message names it, the
        write that changed the buffer since, and the node naming the contents now (None if none)."""
        buf = owner(x)
        if buf.op != "buffer" or buf not in written:
            return None
        writer, newest = written[buf]
        if version(x) is newest:
            return None
        which = "" if x is buf else f" (buffer %{buf.name})"
        return f"%{x.name}{which}", writer, newest

    for n in graph.nodes:
        for x in n.inputs:
            if why := stale(x):
                what, writer, newest = why
                fix = f"; to see the write, read %{newest.name}" if newest is not None else ""
                raise IRError(
                    f"%{n.name} ({n.op}) reads {what}, the contents before %{writer.name} ({writer.op})"
                    f" wrote into it, but comes after %{writer.name}: a node that reads a buffer must come"
                    f" before the buffer's next write, which changes what it reads{fix}"
                )
        d = opdef(n)
        for t in d.writes if d is not None else ():
            buf = owner(n.inputs[t])
            if buf.op != "buffer":
                continue  # check_graph rejects a write into anything else, with its own message
            for j, x in enumerate(n.inputs):
                if j not in d.writes and owner(x) is buf:
                    raise IRError(
                        f"%{n.name} ({n.op}) writes into buffer %{buf.name} and reads it through %{x.name}"
                        f" (input {j}) at the same step: it would read bytes it is overwriting"
                    )
            written[buf] = (n, n if d.view_of == t else None)
    for o in graph.outputs:
        if why := stale(o):
            what, writer, newest = why
            fix = f"; return %{newest.name}" if newest is not None else ""
            raise IRError(
                f"output {what} is the contents before %{writer.name} ({writer.op}) wrote into it, but the"
                f" caller reads outputs after the run, when the buffer holds the write{fix}"
            )

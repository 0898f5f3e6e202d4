"""The builder API: write a model as Python arithmetic on `Tensor` handles, get an `ir.Graph`.

    b = Builder("mlp")
    x = b.input("x", (4, 784), "float32")
    w1 = b.constant("fc1.weight", torch.randn(1000, 784))
    y = (x @ w1.permute(1, 0)).relu()
    b.output(y)
    graph = b.graph

Every operation appends one node, so the nodes are in creation order, which is a topological
order by construction. Each node's type is inferred the moment it is built: a shape mistake
raises a ShapeError at the line of the model that made it, not later in a pass.

A torch tensor used as an operand becomes a constant (`const0`, `const1`, ...); a Python number
becomes a one-element constant of the other operand's dtype. Lab 5's operators are built with
`b.op("name", *inputs, **attrs)` once registered in kiln/ops.py.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from kiln import ops
from kiln.ir import SOURCES, DType, Graph, IRError, Node, TensorType
from kiln.shapes import ShapeError, check_graph, infer_node, make_type

_NAME_OK = re.compile(r"[^A-Za-z0-9_.]")


def sanitize(name: str) -> str:
    """A node name the text form can print: [A-Za-z0-9_.], anything else becomes `_`."""
    return _NAME_OK.sub("_", name) or "_"


def as_dtype(dtype: Any) -> DType:
    """DType from a DType, a string (`f32`, `float32`) or a torch dtype."""
    if isinstance(dtype, DType):
        return dtype
    return DType.parse(str(dtype))


class Tensor:
    """A handle on one node of the graph being built; arithmetic on it builds more nodes."""

    def __init__(self, builder: Builder, node: Node) -> None:
        self.builder = builder
        self.node = node

    @property
    def type(self) -> TensorType:
        return self.node.type

    @property
    def shape(self) -> tuple[int, ...]:
        return self.node.type.shape

    @property
    def dtype(self) -> DType:
        return self.node.type.dtype

    @property
    def rank(self) -> int:
        return self.node.type.rank

    def __repr__(self) -> str:
        return f"Tensor({self.node!r})"

    # --- arithmetic: the other operand may be a Tensor, a torch tensor or a Python number
    def __add__(self, other: Any) -> Tensor:
        return self.builder.op("add", self, self.builder.lift(other, self))

    def __radd__(self, other: Any) -> Tensor:
        return self.builder.op("add", self.builder.lift(other, self), self)

    def __mul__(self, other: Any) -> Tensor:
        return self.builder.op("mul", self, self.builder.lift(other, self))

    def __rmul__(self, other: Any) -> Tensor:
        return self.builder.op("mul", self.builder.lift(other, self), self)

    def __matmul__(self, other: Any) -> Tensor:
        return self.builder.op("matmul", self, self.builder.lift(other, self))

    def __rmatmul__(self, other: Any) -> Tensor:
        return self.builder.op("matmul", self.builder.lift(other, self), self)

    def relu(self) -> Tensor:
        return self.builder.op("relu", self)

    def silu(self) -> Tensor:
        return self.builder.op("silu", self)

    def reshape(self, *shape: int | Sequence[int]) -> Tensor:
        """`t.reshape(2, 8)` or `t.reshape((2, 8))`; one -1 takes whatever size is left."""
        dims = list(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else list(shape)
        if dims.count(-1) > 1:
            raise IRError(f"reshape {self.type} to {dims}: at most one -1")
        if -1 in dims:
            known = 1
            for d in dims:
                known *= d if d != -1 else 1
            if known < 1 or self.type.numel % known:
                raise IRError(f"reshape {self.type} to {dims}: {self.type.numel} elements do not divide by {known}")
            dims[dims.index(-1)] = self.type.numel // known
        return self.builder.op("reshape", self, shape=dims)

    def permute(self, *dims: int | Sequence[int]) -> Tensor:
        perm = list(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else list(dims)
        return self.builder.op("permute", self, dims=perm)

    def __getitem__(self, key: Any) -> Tensor:
        """Static slicing, `t[0:2, :, 1:3]`: one entry per leading axis, the rest taken whole.

        Steps other than 1 are errors. An int `i` selects `i:i+1` and keeps the axis (kiln's
        slice never drops a dimension); negative indices count from the end as in Python."""
        keys = key if isinstance(key, tuple) else (key,)
        if len(keys) > self.rank:
            raise IRError(f"{len(keys)} indices for {self.type} (rank {self.rank})")
        starts, ends = [], []
        for axis, size in enumerate(self.shape):
            k = keys[axis] if axis < len(keys) else slice(None)
            if isinstance(k, bool) or not isinstance(k, (int, slice)):
                raise IRError(f"index {k!r} on axis {axis}: kiln slices with ints and start:end slices only")
            if isinstance(k, int):
                i = k + size if k < 0 else k
                if not 0 <= i < size:
                    raise IRError(f"index {k} on axis {axis} is out of range for {self.type}")
                starts.append(i)
                ends.append(i + 1)
                continue
            if k.step not in (None, 1):
                raise IRError(f"slice {k} on axis {axis}: kiln's slices have step 1")
            s, e, _ = k.indices(size)
            starts.append(s)
            ends.append(e)
        return self.builder.op("slice", self, starts=starts, ends=ends)

    def slice_update(self, value: Any, offsets: Any) -> Tensor:
        """Write `value` into this buffer at `offsets` (an i64 Tensor of shape (rank,), read at run
        time; a list of ints becomes a constant). Returns the updated buffer: read it through the
        returned tensor, so the read comes after the write in the graph."""
        value = self.builder.lift(value, self)
        if not isinstance(offsets, Tensor):
            offsets = self.builder.lift_tensor(_torch().tensor(list(offsets), dtype=_torch().int64))
        return self.builder.op("slice_update", self, value, offsets)


def _torch() -> Any:
    import torch  # constants are torch tensors; importing torch only when one is made keeps kiln light

    return torch


class Builder:
    """Builds one `Graph`: sources, operators and outputs, each checked as it is added."""

    def __init__(self, name: str = "model") -> None:
        self.graph = Graph(sanitize(name))
        self._names: set[str] = set()
        self._source_names: set[str] = set()
        self._next_temp = 0
        self._next_const = 0

    # --- names
    def _fresh(self) -> str:
        while f"t{self._next_temp}" in self._names:
            self._next_temp += 1
        name = f"t{self._next_temp}"
        self._next_temp += 1
        return name

    def _add(self, name: str, op: str, inputs: Sequence[Node], attrs: dict[str, Any], ty: TensorType) -> Tensor:
        node = Node(name, op, tuple(inputs), attrs, ty)
        self._names.add(name)
        self.graph.nodes.append(node)
        return Tensor(self, node)

    def _source(self, op: str, name: str, ty: TensorType) -> Tensor:
        node_name = sanitize(name)
        if name in self._source_names or node_name in self._names:
            raise IRError(f"{op} {name!r}: the name is taken (as %{node_name})")
        self._source_names.add(name)
        return self._add(node_name, op, (), {"name": name}, ty)

    # --- sources
    def input(self, name: str, shape: Sequence[int], dtype: Any = "float32") -> Tensor:
        """A tensor the caller passes to every run, by `name`."""
        return self._source("input", name, make_type(shape, as_dtype(dtype)))

    def constant(self, name: str, value: Any) -> Tensor:
        """A weight; its value (a torch tensor, on the device it is on: a checkpoint loaded to the GPU
        is not copied back to the host) goes into graph.constants[name]."""
        torch = _torch()
        if not isinstance(value, torch.Tensor):
            raise IRError(f"constant {name!r}: the value must be a torch tensor, not {type(value).__name__}")
        t = self._source("constant", name, make_type(tuple(value.shape), as_dtype(value.dtype)))
        self.graph.constants[name] = value.detach().contiguous()
        return t

    def buffer(self, name: str, shape: Sequence[int], dtype: Any = "float32") -> Tensor:
        """Persistent state (a KV cache): zeros at compile time, kept between runs."""
        return self._source("buffer", name, make_type(shape, as_dtype(dtype)))

    def lift_tensor(self, value: Any) -> Tensor:
        """A torch tensor used as an operand: an auto-named constant."""
        while f"const{self._next_const}" in self._source_names or f"const{self._next_const}" in self._names:
            self._next_const += 1
        name = f"const{self._next_const}"
        self._next_const += 1
        return self.constant(name, value)

    def lift(self, value: Any, like: Tensor) -> Tensor:
        """An operand as a Tensor of this graph: Tensors pass, torch tensors and numbers become constants."""
        if isinstance(value, Tensor):
            if value.builder is not self:
                raise IRError(f"%{value.node.name} belongs to another graph ({value.builder.graph.name!r})")
            return value
        torch = _torch()
        if isinstance(value, torch.Tensor):
            return self.lift_tensor(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            dtype = getattr(torch, like.dtype.torch_name)
            return self.lift_tensor(torch.full((1,), value, dtype=dtype))
        raise IRError(f"cannot use a {type(value).__name__} as an operand of %{like.node.name}")

    # --- operators
    def op(self, op: str, /, *inputs: Tensor, **attrs: Any) -> Tensor:
        """`%tN = op(inputs) {attrs}`, its type inferred now (a ShapeError names the node). `op` is
        positional-only, so an attribute may be named op too (lab 6's all_reduce {op = "sum"})."""
        opdef = ops.get(op)
        if op in SOURCES:
            raise IRError(f"build sources with Builder.{op}(), not Builder.op")
        nodes = []
        for t in inputs:
            if not isinstance(t, Tensor) or t.builder is not self:
                raise IRError(f"{op}: every input must be a Tensor of graph {self.graph.name!r}, got {t!r}")
            nodes.append(t.node)
        # lists, not tuples, so the attrs print and parse back identical
        attrs = {k: list(v) if isinstance(v, tuple) else v for k, v in attrs.items()}
        name = self._fresh()
        ty = infer_node(name, op, [n.type for n in nodes], attrs)
        if opdef.name == "slice_update" and nodes[0].op not in ("buffer", "slice_update"):
            raise ShapeError(
                f"writes into %{nodes[0].name} ({nodes[0].op}): the target must be a buffer", f"%{name} ({op})"
            )
        return self._add(name, op, nodes, attrs, ty)

    def output(self, *tensors: Tensor) -> Graph:
        """The graph's outputs, in order; checks the finished graph and returns it."""
        for t in tensors:
            if not isinstance(t, Tensor) or t.builder is not self:
                raise IRError(f"output {t!r} is not a Tensor of graph {self.graph.name!r}")
        self.graph.outputs = [t.node for t in tensors]
        check_graph(self.graph)
        return self.graph

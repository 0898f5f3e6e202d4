"""Shape inference: the rules every operator's output type follows, and the errors that name them.

An operator's `infer` (kiln/ops.py) sees only its input types and attributes, so it raises a
`ShapeError` that states the rule broken and the shapes involved; `infer_node` runs it for one
node and adds the node's name, so the message a user reads is

    %t3 (matmul): inner dimensions differ: f32[4, 784] @ f32[1000, 10]: 784 != 1000

`check_graph` re-infers every node of a graph and compares with the type it carries: the
shape-checking pass that the parser and the frontend run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kiln.ir import SOURCES, Graph, IRError, TensorType


class ShapeError(IRError):
    """A node whose inputs or attributes break its operator's typing rule.

    `rule` says what is wrong and with which shapes; `node` is `%t3 (matmul)` once known.
    """

    def __init__(self, rule: str, node: str | None = None) -> None:
        self.rule = rule
        self.node = node
        super().__init__(f"{node}: {rule}" if node else rule)

    def at(self, name: str, op: str) -> ShapeError:
        """The same error, now naming the node it belongs to."""
        return ShapeError(self.rule, f"%{name} ({op})")


def fmt(shape: Sequence[int]) -> str:
    return f"[{', '.join(map(str, shape))}]"


def broadcast_shapes(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    """numpy's rule: align the shapes on the right; each pair of sizes must be equal or one of
    them 1 (which stretches); the shorter shape is padded with 1s on the left.

    (4, 1, 8) and (3, 1) -> (4, 3, 8);  (2, 3) and (4, 3)  -> ShapeError (2 vs 4)."""
    n = max(len(a), len(b))
    pa = (1,) * (n - len(a)) + tuple(a)
    pb = (1,) * (n - len(b)) + tuple(b)
    out = []
    for axis, (x, y) in enumerate(zip(pa, pb, strict=True)):
        if x != y and 1 not in (x, y):
            raise ShapeError(
                f"shapes do not broadcast: {fmt(a)} and {fmt(b)}: "
                f"axis {axis - n} (right-aligned) has sizes {x} and {y}; one of them must be 1 or they must match"
            )
        out.append(max(x, y))
    return tuple(out)


def same_dtype(types: Sequence[TensorType], sep: str = ", ") -> None:
    """kiln never promotes: mixing f16 and f32 is a mistake to fix in the model, not to hide."""
    if len({t.dtype for t in types}) > 1:
        raise ShapeError(f"dtypes differ (kiln does not promote): {sep.join(str(t) for t in types)}")


def require_float(t: TensorType, what: str = "input") -> None:
    if not t.dtype.is_float:
        raise ShapeError(f"{what} {t} must be a float tensor (f32, f16 or bf16)")


def int_list(attrs: Mapping[str, Any], key: str) -> tuple[int, ...]:
    """An attribute that must be a list of ints (bools are not ints here)."""
    value = attrs.get(key)
    if not isinstance(value, (list, tuple)) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
        raise ShapeError(f"attribute {key} = {value!r} must be a list of ints")
    return tuple(value)


def make_type(shape: Sequence[int], dtype: Any) -> TensorType:
    """A TensorType, with a bad rank or size reported as a ShapeError."""
    try:
        return TensorType(tuple(shape), dtype)
    except ShapeError:
        raise
    except IRError as e:
        raise ShapeError(str(e)) from None


def infer_node(name: str, op: str, inputs: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    """The output type of `%name = op(inputs) {attrs}`; errors name the node."""
    from kiln import ops  # ops imports this module for its rules

    opdef = ops.get(op)
    if op in SOURCES:
        raise IRError(f"%{name} ({op}): a source's type is declared, not inferred")
    if opdef.arity is None and not inputs:
        raise ShapeError("takes one or more inputs, got none", f"%{name} ({op})")
    if opdef.arity is not None and len(inputs) != opdef.arity:
        raise ShapeError(f"takes {opdef.arity} inputs, got {len(inputs)}", f"%{name} ({op})")
    missing = [a for a in opdef.attrs if a not in attrs]
    extra = [a for a in attrs if a not in opdef.attrs]
    if missing or extra:
        raise ShapeError(
            f"attributes {sorted(attrs)}: {op} takes exactly {list(opdef.attrs)}"
            + (f" (missing {missing})" if missing else "")
            + (f" (unknown {extra})" if extra else ""),
            f"%{name} ({op})",
        )
    try:
        return opdef.infer(inputs, attrs)
    except ShapeError as e:
        raise e.at(name, op) from None


def check_graph(graph: Graph) -> None:
    """The shape-checking pass: graph.validate(), then every node's type must be what its operator
    infers, and a slice_update must write into a buffer (directly or through earlier updates)."""
    from kiln import ops

    graph.validate()
    for n in graph.nodes:
        ops.get(n.op)  # unknown operators are errors even for sources
        if n.op in SOURCES:
            if list(n.attrs) != ["name"] or not isinstance(n.attrs["name"], str):
                raise IRError(f"%{n.name} ({n.op}): a source takes one attribute, name (a string)")
            continue
        inferred = infer_node(n.name, n.op, [i.type for i in n.inputs], n.attrs)
        if inferred != n.type:
            raise ShapeError(f"declared type {n.type} but the inputs give {inferred}", f"%{n.name} ({n.op})")
        if n.op == "slice_update" and n.inputs[0].op not in ("buffer", "slice_update"):
            raise ShapeError(
                f"writes into %{n.inputs[0].name} ({n.inputs[0].op}): the target must be a buffer",
                f"%{n.name} ({n.op})",
            )

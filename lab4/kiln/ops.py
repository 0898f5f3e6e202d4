"""The operator registry: what each operator takes, how its output type follows from its inputs'
and whether that output is a view of an input's memory.

An operator is an `OpDef`; `register` adds one. The frontend, the text parser, shape inference,
the memory planner and both executors look operators up here by name, so lab 5 adds RMSNorm or
attention by registering them (and their kernels) without editing any of those.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kiln.ir import IRError, TensorType

# infer(input types, attrs) -> output type; raises ShapeError (kiln/shapes.py) naming the rule broken
Infer = Callable[[Sequence[TensorType], Mapping[str, Any]], TensorType]


@dataclass(frozen=True)
class OpDef:
    """`arity` is the number of inputs (None: one or more, as lab 5's generated `fused` kernels
    take); `attrs` the attribute names the operator requires.

    `view_of` is the index of the input whose memory the output shares (reshape; slice_update,
    which writes into its buffer and returns it), or None when the output is a tensor of its own.
    The planner gives a view no memory: it keeps its owner alive as long as the view is read.

    `writes` lists the inputs whose memory the operator changes in place (slice_update: (0,), its
    buffer). When `view_of` is one of them, the output names the buffer after the write. Graph.validate
    checks that every read of a buffer sees the version it names (kiln/ir.py, `check_writes`).
    """

    name: str
    arity: int | None
    infer: Infer
    attrs: tuple[str, ...] = ()
    view_of: int | None = None
    writes: tuple[int, ...] = ()
    doc: str = ""


REGISTRY: dict[str, OpDef] = {}


def register(op: OpDef) -> OpDef:
    if op.name in REGISTRY:
        raise IRError(f"operator {op.name!r} is registered twice")
    REGISTRY[op.name] = op
    return op


def registrar(table: dict[str, Any], what: str) -> Callable[[str], Callable[[Any], Any]]:
    """`register = registrar(table, "CPU kernel")`: a decorator factory that files one
    implementation per operator in an executor's table (task 02's CPU kernels, task 06's CUDA
    lowerings), and refuses a second one for the same operator. Lab 5 registers through them."""

    def register(op: str) -> Callable[[Any], Any]:
        def add(fn: Any) -> Any:
            if op in table:
                raise ValueError(f"operator {op!r} already has a {what}")
            table[op] = fn
            return fn

        return add

    return register


def get(name: str) -> OpDef:
    try:
        return REGISTRY[name]
    except KeyError:
        raise IRError(f"unknown operator {name!r}: kiln knows {', '.join(sorted(REGISTRY))}") from None


# --- the core operators ------------------------------------------------------------------------
# Each `infer` checks its inputs and attributes and returns the output type; a rule broken raises
# ShapeError (kiln/shapes.py), which the caller tags with the node's name.

from kiln.shapes import (  # noqa: E402 (the registry above is what shapes' rules plug into)
    ShapeError,
    broadcast_shapes,
    fmt,
    int_list,
    make_type,
    require_float,
    same_dtype,
)


def _source(inputs: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    raise IRError("a source's type is declared (input, constant, buffer), not inferred")


for _name, _doc in (
    ("input", "a tensor the caller passes to every run"),
    ("constant", "a weight: its value is in Graph.constants[name]"),
    ("buffer", "persistent state, zeros at compile time, kept between runs"),
):
    register(OpDef(_name, 0, _source, attrs=("name",), doc=_doc))


def _binary(inputs: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    a, b = inputs
    same_dtype(inputs)
    return make_type(broadcast_shapes(a.shape, b.shape), a.dtype)


register(OpDef("add", 2, _binary, doc="a + b, numpy broadcasting, same dtype"))
register(OpDef("mul", 2, _binary, doc="a * b, numpy broadcasting, same dtype"))


def _matmul(inputs: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    a, b = inputs
    if a.rank < 2 or b.rank < 2:
        raise ShapeError(f"{a} @ {b}: both operands need rank >= 2 ((..., M, K) @ (..., K, N))")
    same_dtype(inputs, sep=" @ ")
    require_float(a, "operand")
    m, k = a.shape[-2:]
    k2, n = b.shape[-2:]
    if k != k2:
        raise ShapeError(f"inner dimensions differ: {a} @ {b}: {k} != {k2}")
    try:
        batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ShapeError:
        raise ShapeError(
            f"batch dimensions do not broadcast: {a} @ {b}: {fmt(a.shape[:-2])} and {fmt(b.shape[:-2])}"
        ) from None
    return make_type((*batch, m, n), a.dtype)


register(OpDef("matmul", 2, _matmul, doc="(..., M, K) @ (K, N) or (B..., K, N), batch dims broadcast; float"))


def _unary_float(inputs: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    (a,) = inputs
    require_float(a)
    return a


register(OpDef("relu", 1, _unary_float, doc="max(x, 0); float"))
register(OpDef("silu", 1, _unary_float, doc="x * sigmoid(x); float"))


def _reshape(inputs: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    (a,) = inputs
    shape = int_list(attrs, "shape")
    if not 1 <= len(shape) <= 4 or any(d < 1 for d in shape):
        raise ShapeError(f"reshape {a} to {fmt(shape)}: the new shape needs rank 1 to 4 and positive sizes")
    out = make_type(shape, a.dtype)
    if out.numel != a.numel:
        raise ShapeError(f"reshape {a} to {fmt(shape)}: element counts differ: {a.numel} != {out.numel}")
    return out


register(OpDef("reshape", 1, _reshape, attrs=("shape",), view_of=0, doc="same elements, new shape: a view"))


def _permute(inputs: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    (a,) = inputs
    dims = int_list(attrs, "dims")
    if sorted(dims) != list(range(a.rank)):
        raise ShapeError(f"permute {a} by dims {fmt(dims)}: dims must be a permutation of 0..{a.rank - 1}")
    return make_type([a.shape[d] for d in dims], a.dtype)


register(OpDef("permute", 1, _permute, attrs=("dims",), doc="axes reordered: out.shape[i] = a.shape[dims[i]]"))


def _slice(inputs: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    (a,) = inputs
    starts, ends = int_list(attrs, "starts"), int_list(attrs, "ends")
    if len(starts) != a.rank or len(ends) != a.rank:
        raise ShapeError(
            f"slice {a} with starts {fmt(starts)}, ends {fmt(ends)}: one (start, end) pair per dimension ({a.rank})"
        )
    for axis, (s, e, d) in enumerate(zip(starts, ends, a.shape, strict=True)):
        if not 0 <= s < e <= d:
            raise ShapeError(f"slice {a}: axis {axis} range [{s}, {e}) must satisfy 0 <= start < end <= {d}")
    return make_type([e - s for s, e in zip(starts, ends, strict=True)], a.dtype)


register(OpDef("slice", 1, _slice, attrs=("starts", "ends"), doc="a[s0:e0, s1:e1, ...], step 1"))


def _slice_update(inputs: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    target, value, offsets = inputs
    if value.rank != target.rank:
        raise ShapeError(f"slice_update of {target} with {value}: ranks differ ({value.rank} != {target.rank})")
    if any(v > t for v, t in zip(value.shape, target.shape, strict=True)):
        raise ShapeError(f"slice_update of {target} with {value}: the value is larger than the target in some axis")
    same_dtype([target, value])
    if offsets.dtype.short != "i64" or offsets.shape != (target.rank,):
        raise ShapeError(f"slice_update offsets {offsets}: must be i64[{target.rank}] (one offset per axis)")
    return target


register(
    OpDef(
        "slice_update",
        3,
        _slice_update,
        view_of=0,
        writes=(0,),
        doc="target[o0:o0+v0, ...] = value, offsets read at run time; returns the target (a view)",
    )
)

"""The operator lab 6 adds to kiln: `all_reduce`, the one collective a tensor-parallel model needs.

    all_reduce   x F[...]   {op = "sum"}   -> F[...]   the sum of x over every rank of the process group

Its type is its input's: every rank holds a partial result of one shape (a row-parallel linear's
partial products), and every rank gets the whole sum back. Registered in kiln's operator registry,
it prints, parses and validates like lab 4's operators:

    %t40 = all_reduce(%t39) {op = "sum"} : f32[5, 64]

The CPU kernel calls torch.distributed.all_reduce on the default process group (gloo on the CPU,
started by kiln_tp.launch). A run is collective: every rank must run the same graph, so that its
all-reduces meet the other ranks' in the same order; a rank that stops leaves the others waiting
until the process group's timeout (launch ends them sooner). The CUDA lowering is task 04's
(kiln_tp/cuda.py): NCCL, on the executor's stream, captured in the step's CUDA graph.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from kiln.cpu import register_cpu
from kiln.ir import Node, TensorType
from kiln.ops import OpDef, register
from kiln.runtime import KilnRunError
from kiln.shapes import ShapeError, require_float

REDUCTIONS = {"sum": dist.ReduceOp.SUM}  # a tensor-parallel model only ever adds its partial products


def _all_reduce(inputs: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    (x,) = inputs
    require_float(x)
    if attrs["op"] not in REDUCTIONS:
        raise ShapeError(f"attribute op = {attrs['op']!r} must be one of {', '.join(map(repr, REDUCTIONS))}")
    return x


register(
    OpDef(
        "all_reduce",
        1,
        _all_reduce,
        attrs=("op",),
        doc="the sum of x over every rank of the default process group; every rank gets the whole sum",
    )
)


@register_cpu("all_reduce")
def all_reduce(node: Node, args: Sequence[torch.Tensor]) -> torch.Tensor:
    if not dist.is_initialized():
        raise KilnRunError(
            f"%{node.name} (all_reduce): no process group; start the ranks with kiln_tp.launch "
            "(torch.distributed.init_process_group on every rank)"
        )
    out = args[0].clone()  # the input is another node's value, which a later node may still read
    dist.all_reduce(out, op=REDUCTIONS[node.attrs["op"]])
    return out

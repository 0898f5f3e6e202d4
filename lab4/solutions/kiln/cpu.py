"""Lab 4 task 02 · the CPU executor: kiln's reference, run with torch on the CPU.

Implement: `broadcast_to`, the kernel of every core operator (registered in CPU_KERNELS with
           `@register_cpu`) and `CPUExecutor.run`, in the TODO regions. The chapter's section
           "Task 02: the CPU executor" explains them; "Broadcasting" gives the rule.
Contract:  `CPUExecutor(graph)` keeps the constants (CPU tensors from graph.constants) and one
           zero-filled tensor per buffer; both persist across runs (given code).
           `run({"x": tensor, ...})` first checks its inputs with `kiln.runtime.check_inputs`
           (missing, extra, wrong shape, dtype or device, non-contiguous: KilnRunError, given),
           evaluates every node once, in graph.nodes order (a topological order), those no
           output reads included, and returns one CPU tensor per graph output, in order. A
           returned tensor is the caller's: a later run must not change it, nor may the caller's
           changes to it or to its inputs change anything else (copy an output that shares a
           buffer's, a constant's or an input's memory).
           A kernel `fn(node, args)` returns a contiguous tensor of `node.type`, except the views:
           `reshape` (a view of its input) and `slice_update`, which writes `value` into the
           persistent buffer at the offsets held in its third input (an i64 tensor, read at run
           time) and returns that buffer itself (a second update may be chained on it); offsets
           that would put `value` outside the buffer raise KilnRunError naming the node.
           `add` and `mul` broadcast by numpy's rule (shapes aligned on the right), explicitly,
           through `broadcast_to`, as the CUDA kernels of tasks 03-05 must. `matmul` in f16/bf16
           accumulates in float32 and casts the result back; every other operator computes in
           its tensors' own dtype (one rounding; i64 exactly, never through a float).
           Lab 5 adds operators with `@register_cpu("name")`: dispatch through CPU_KERNELS only.
Test:      make test-lab4 TASK=02
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from kiln import ops
from kiln.ir import SOURCES, Graph, Node
from kiln.runtime import KilnRunError, check_inputs, check_shared, torch_dtype

# kernel(node, input values) -> output value; node.attrs and node.type say what to compute
CPUKernel = Callable[[Node, Sequence[torch.Tensor]], torch.Tensor]
CPU_KERNELS: dict[str, CPUKernel] = {}


# @register_cpu("op"): the CPU kernel of operator `op` (one per operator)
register_cpu = ops.registrar(CPU_KERNELS, "CPU kernel")


def broadcast_to(t: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """`t` seen with `shape` by numpy's rule: pad t's shape with 1s on the LEFT, then stretch
    every size-1 axis (expand, no copy)."""
    # TODO(lab4/02) begin: pad the shape on the left, then expand; see the chapter's section "Broadcasting"
    pad = (1,) * (len(shape) - t.dim())
    return t.reshape(pad + tuple(t.shape)).expand(*shape)
    # ~ raise NotImplementedError("lab4/02: broadcast_to")
    # TODO(lab4/02) end


@register_cpu("add")
def add(node: Node, args: Sequence[torch.Tensor]) -> torch.Tensor:
    # TODO(lab4/02) begin: a + b after broadcasting both to node.type.shape
    a, b = (broadcast_to(x, node.type.shape) for x in args)
    return a + b
    # ~ raise NotImplementedError("lab4/02: add")
    # TODO(lab4/02) end


@register_cpu("mul")
def mul(node: Node, args: Sequence[torch.Tensor]) -> torch.Tensor:
    # TODO(lab4/02) begin: a * b after broadcasting both to node.type.shape
    a, b = (broadcast_to(x, node.type.shape) for x in args)
    return a * b
    # ~ raise NotImplementedError("lab4/02: mul")
    # TODO(lab4/02) end


@register_cpu("matmul")
def matmul(node: Node, args: Sequence[torch.Tensor]) -> torch.Tensor:
    # TODO(lab4/02) begin: (..., M, K) @ (..., K, N), batch dims broadcast; f16/bf16 accumulate in f32
    a, b = args
    # (B..., M, N): torch.matmul broadcasts the batch dims right-aligned, as the IR does
    return torch.matmul(a.float(), b.float()).to(a.dtype)
    # ~ raise NotImplementedError("lab4/02: matmul")
    # TODO(lab4/02) end


@register_cpu("relu")
def relu(node: Node, args: Sequence[torch.Tensor]) -> torch.Tensor:
    # TODO(lab4/02) begin: max(x, 0)
    return torch.relu(args[0])
    # ~ raise NotImplementedError("lab4/02: relu")
    # TODO(lab4/02) end


@register_cpu("silu")
def silu(node: Node, args: Sequence[torch.Tensor]) -> torch.Tensor:
    # TODO(lab4/02) begin: x * sigmoid(x)
    return torch.nn.functional.silu(args[0])
    # ~ raise NotImplementedError("lab4/02: silu")
    # TODO(lab4/02) end


@register_cpu("reshape")
def reshape(node: Node, args: Sequence[torch.Tensor]) -> torch.Tensor:
    # TODO(lab4/02) begin: a view of the (contiguous) input with node.attrs["shape"]
    return args[0].view(node.attrs["shape"])
    # ~ raise NotImplementedError("lab4/02: reshape")
    # TODO(lab4/02) end


@register_cpu("permute")
def permute(node: Node, args: Sequence[torch.Tensor]) -> torch.Tensor:
    # TODO(lab4/02) begin: axes reordered by node.attrs["dims"], as a new contiguous tensor
    return args[0].permute(node.attrs["dims"]).contiguous()
    # ~ raise NotImplementedError("lab4/02: permute")
    # TODO(lab4/02) end


@register_cpu("slice")
def slice_(node: Node, args: Sequence[torch.Tensor]) -> torch.Tensor:
    # TODO(lab4/02) begin: a[s0:e0, s1:e1, ...] from node.attrs starts/ends, as a new contiguous tensor
    index = tuple(slice(s, e) for s, e in zip(node.attrs["starts"], node.attrs["ends"], strict=True))
    return args[0][index].contiguous()
    # ~ raise NotImplementedError("lab4/02: slice")
    # TODO(lab4/02) end


@register_cpu("slice_update")
def slice_update(node: Node, args: Sequence[torch.Tensor]) -> torch.Tensor:
    # TODO(lab4/02) begin: write value into the target at the run-time offsets; return the target itself
    target, value, offsets = args
    starts = [int(o) for o in offsets.tolist()]
    for axis, (o, v, t) in enumerate(zip(starts, value.shape, target.shape, strict=True)):
        if not 0 <= o <= t - v:
            raise KilnRunError(f"%{node.name} (slice_update): offset {o} on axis {axis} puts {v} rows past size {t}")
    target[tuple(slice(o, o + v) for o, v in zip(starts, value.shape, strict=True))].copy_(value)
    return target
    # ~ raise NotImplementedError("lab4/02: slice_update")
    # TODO(lab4/02) end


def aliases_state(node: Node) -> bool:
    """Whether a node's value shares memory that outlives the run (an input, constant or buffer),
    following views (reshape, slice_update) back to the tensor that owns the memory."""
    while ops.get(node.op).view_of is not None:
        node = node.inputs[ops.get(node.op).view_of]
    return node.op in SOURCES


def _shared(other: CPUExecutor | None, table: str, node: Node) -> torch.Tensor | None:
    """`other`'s constant or buffer named like `node`, checked against node's type; None when
    there is no other executor or it has none of that name."""
    if other is None:
        return None
    t = getattr(other, table).get(node.attrs["name"])
    return None if t is None else check_shared(node, t)


class CPUExecutor:
    """Runs a graph with torch on the CPU, one kernel call per node."""

    def __init__(self, graph: Graph, *, share_with: CPUExecutor | None = None) -> None:
        """`share_with`: another executor whose constants and buffers of the same name (and type)
        this one uses as they are, so two graphs of one model (lab 5's prompt and its one-token
        steps) hold one copy of the weights and write the same KV cache."""
        graph.validate()
        self.graph = graph
        self.constants: dict[str, torch.Tensor] = {}
        for n in graph.of_op("constant"):
            name = n.attrs["name"]
            shared = _shared(share_with, "constants", n)
            if shared is not None:
                self.constants[name] = shared
                continue
            value = graph.constants.get(name)
            if not isinstance(value, torch.Tensor):
                raise KilnRunError(f"constant {name!r} has no value in graph.constants (a parsed graph has none)")
            if tuple(value.shape) != n.type.shape or value.dtype != torch_dtype(n.type.dtype):
                raise KilnRunError(f"constant {name!r}: value {value.dtype}{list(value.shape)}, node says {n.type}")
            self.constants[name] = value.detach().to("cpu").contiguous()
        # persistent state: zeros now, then whatever the runs write (a KV cache)
        self.buffers: dict[str, torch.Tensor] = {}
        for n in graph.buffers:
            shared = _shared(share_with, "buffers", n)
            zeros = torch.zeros(n.type.shape, dtype=torch_dtype(n.type.dtype))
            self.buffers[n.attrs["name"]] = zeros if shared is None else shared
        missing = sorted({n.op for n in graph.nodes if n.op not in SOURCES and n.op not in CPU_KERNELS})
        if missing:
            raise KilnRunError(f"no CPU kernel for {missing}: register one with @register_cpu")

    def run(self, inputs: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
        """One forward pass: the outputs' values, in the order of graph.outputs."""
        # TODO(lab4/02) begin: check the inputs, evaluate every node in order, return independent outputs
        given = check_inputs(self.graph, inputs, "cpu")
        values: dict[Node, torch.Tensor] = {}
        for n in self.graph.nodes:
            if n.op == "input":
                values[n] = given[n.attrs["name"]]
            elif n.op == "constant":
                values[n] = self.constants[n.attrs["name"]]
            elif n.op == "buffer":
                values[n] = self.buffers[n.attrs["name"]]
            else:
                values[n] = CPU_KERNELS[n.op](n, [values[i] for i in n.inputs])
        # an output that shares a buffer's (or the caller's) memory would change under a later
        # run: hand out a copy of those, and the freshly computed tensors as they are
        return [values[o].clone() if aliases_state(o) else values[o] for o in self.graph.outputs]
        # ~ check_inputs(self.graph, inputs, "cpu")  # given: refuses bad inputs before any work
        # ~ raise NotImplementedError("lab4/02: run")
        # TODO(lab4/02) end

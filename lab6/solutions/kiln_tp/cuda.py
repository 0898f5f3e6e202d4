"""Lab 6 task 04 · `all_reduce` on the GPU: NCCL on the executor's stream, inside the step's CUDA graph.

Implement: the launch that `lower_all_reduce` returns, in the TODO region; see the chapter's
           section "The launch" (in the chapter's section "Task 04: all_reduce on the GPU").
Contract:  `lower_all_reduce(ex, node)` is the CUDA lowering of `all_reduce`, registered with lab 4's
           `register_cuda`. Like every lowering it runs once, when the CudaExecutor is built, and
           returns a Launch: a callable without arguments that queues the node's work on
           `ex.stream` and returns a cudaError_t as an int. The given part checks the default
           process group (`check_group`: there must be one, and a CUDA tensor must be reduced by
           NCCL). `x` and `out`, the node's input and output, are views of the executor's arena,
           fixed for the executor's lifetime (ex.tensors). The launch
             - queues all its work on `ex.stream` (torch.cuda.stream): x was written there by the
               launch before, and the launch after reads out there. The current stream is the
               caller's: ex.stream in a capture, the default stream in the capture's warm-up;
             - leaves the sum of every rank's x in `out`, the output's planned slot, and nowhere else:
               x is copied into out, then out is all-reduced in place (torch.distributed.all_reduce
               with the node's reduction, REDUCTIONS[node.attrs["op"]]). x keeps its value;
             - allocates nothing and waits for nothing on the host: it is captured into CUDA graphs,
               which record device work only (a synchronize ends the capture with an error; a tensor
               made during it is the graph's, not the arena's slot that the next node reads);
             - at world 1 makes the copy alone: the sum over one rank is its own tensor, and no NCCL
               call is queued;
           and returns 0 (torch raises an error instead of returning one).
Test:      make test-lab6 TASK=04
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from kiln.cuda import CudaExecutor, Launch, register_cuda
from kiln.ir import Node
from kiln.runtime import KilnRunError
from kiln_tp.ops import REDUCTIONS

NCCL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # the model's dtypes, each one of NCCL's


def check_group(node: Node, device: torch.device, dtype: torch.dtype) -> int:
    """The number of ranks the node's all-reduce adds up, once the default process group is found
    able to reduce a tensor of `device` and `dtype` (given): KilnRunError naming the node otherwise.
    A CUDA tensor needs NCCL in the group (launch(..., device="cuda") makes "cpu:gloo,cuda:nccl");
    a CPU tensor (the course's CPU checks of this lowering) any backend."""
    where = f"%{node.name} (all_reduce)"
    if node.attrs.get("op") not in REDUCTIONS:  # (a graph that passed check_graph has one of them)
        raise KilnRunError(f"{where}: reduction {node.attrs.get('op')!r}; kiln_tp reduces with {sorted(REDUCTIONS)}")
    if not (dist.is_available() and dist.is_initialized()):
        raise KilnRunError(
            f"{where}: no process group; start the ranks with kiln_tp.launch(world, fn, ..., device='cuda')"
            " (torch.distributed.init_process_group on every rank)"
        )
    if device.type == "cuda":
        backend = str(dist.get_backend())
        if "nccl" not in backend:
            raise KilnRunError(
                f"{where}: the process group's backend is {backend!r}, and a CUDA tensor is reduced by NCCL;"
                " start the ranks with kiln_tp.launch(world, fn, ..., device='cuda')"
            )
        if dtype not in NCCL_DTYPES:
            names = ", ".join(str(d).removeprefix("torch.") for d in NCCL_DTYPES)
            raise KilnRunError(f"{where}: {str(dtype).removeprefix('torch.')}: the GPU all-reduce takes {names}")
    return dist.get_world_size()


@register_cuda("all_reduce")
def lower_all_reduce(ex: CudaExecutor, node: Node) -> Launch:
    """out = the sum of x over every rank of the default process group, on ex.stream, in out's slot."""
    out = ex.tensors[node]  # the output's slot of the arena: what the next launches read
    check_group(node, out.device, out.dtype)  # given: a group that cannot reduce it is refused here
    # TODO(lab6/04) begin: x into out, reduced in place, on ex.stream (~10 lines); the chapter's section "The launch"
    x = ex.tensors[node.inputs[0]]
    world, op, stream = dist.get_world_size(), REDUCTIONS[node.attrs["op"]], ex.stream

    def launch() -> int:
        with torch.cuda.stream(stream):  # current in a capture; not in the capture's warm-up
            out.copy_(x)  # a cudaMemcpyAsync into the planned slot; x keeps its value
            if world > 1:
                # NCCL, in place on out; async_op=False: ex.stream waits for the reduction (the host does
                # not), so the next launch on ex.stream reads the sum
                dist.all_reduce(out, op=op)
        return 0

    return launch
    # ~ raise NotImplementedError("lab6/04: the all_reduce launch")
    # TODO(lab6/04) end

"""kiln's all_reduce lowered to your all-reduces of tasks 02 and 03 instead of NCCL (given code).

    from kiln_tp.own_all_reduce import use_own_all_reduce
    use_own_all_reduce(ring_lib, one_shot_lib)   # every rank, before its model's executors are built
    model = TPLlamaModel(...)                    # its executors lower all_reduce to your libraries
    ...
    stop_own_all_reduce()                        # every rank, once nothing replays those executors

Task 04 lowers all_reduce to NCCL. This module lowers it to the libraries of task 02 (02_ring.cu)
and task 03 (03_one_shot.cu), as inference servers run a custom all-reduce beside NCCL: the
one-shot for messages up to ONE_SHOT_MAX_BYTES (a decode step's rows), the ring above (a prompt's),
and task 04's NCCL lowering for a message larger than the ring's buffer. `make generate GPUS=2
ARGS="--all-reduce own"` and `python lab6/bench_tp.py --all-reduce own` use it.

Each rank holds one kiln_tp.ipc.Communicator of each library, made once by every rank at the same
point (the ranks exchange their IPC handles through the process group). The libraries sum float32
in place in their shared buffer, so a launch is three pieces of work on ex.stream: x copied into
the buffer (float16 and bfloat16 widened to float32), the library's all-reduce, the sum copied
into out's slot (narrowed back). No allocation and no host wait: the launch is captured into the
step's CUDA graphs like task 04's. The sums are rounded to float16 once, at the end, where NCCL's
float16 all-reduce rounds after each addition; every rank holds the same bits either way (the ring
gathers one rank's sum of each chunk, the one-shot adds in rank order on every rank).

One buffer serves every all_reduce of every executor on a rank, one call at a time: a launch's
copy out is queued before the next launch's copy in on the same stream, and the model's steps run
one after another (each ends in logits the host reads).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from kiln.cuda import CUDA_LOWERINGS, CudaExecutor, Launch
from kiln.ir import Node
from kiln.runtime import KilnRunError
from kiln_tp.cuda import check_group
from kiln_tp.ipc import Communicator

# float32 bytes up to which the one-shot runs: section 2.6's table on two H200s has it ahead of the
# ring and of NCCL up to 256 KB, and behind the ring from 1 MB on
ONE_SHOT_MAX_BYTES = 256 << 10
RING_CAPACITY = 4 << 20  # floats (16 MB): a 512-token prompt's all-reduce of the 7B shape is 2M of them

_in_use: dict[str, Any] = {}  # this rank's communicators and the lowering they stand in for


def use_own_all_reduce(
    ring_lib: str | Path,
    one_shot_lib: str | Path,
    ring_capacity: int = RING_CAPACITY,
    one_shot_max_bytes: int = ONE_SHOT_MAX_BYTES,
) -> None:
    """From now on, on this rank, CudaExecutors lower all_reduce to tasks 02 and 03's libraries.
    Every rank of the default process group calls it at the same point, on its GPU."""
    if _in_use:
        raise RuntimeError("use_own_all_reduce: already in use on this rank (stop_own_all_reduce first)")
    if not (dist.is_available() and dist.is_initialized()):
        raise KilnRunError(
            "use_own_all_reduce: no process group; start the ranks with kiln_tp.launch(..., device='cuda')"
        )
    rank, world = dist.get_rank(), dist.get_world_size()
    one_shot_floats = max(1, one_shot_max_bytes // 4)
    comms = {
        "one_shot": Communicator(one_shot_lib, "one_shot", one_shot_floats, rank, world),
        "ring": Communicator(ring_lib, "ring", ring_capacity, rank, world),
    }
    _in_use.update(comms=comms, nccl=CUDA_LOWERINGS["all_reduce"], one_shot_floats=one_shot_floats)
    CUDA_LOWERINGS["all_reduce"] = lower_all_reduce_own


def stop_own_all_reduce() -> None:
    """Task 04's NCCL lowering again, the communicators closed (every rank, at the same point, once
    no executor built in between is replayed any more: their launches call the closed libraries)."""
    if not _in_use:
        return
    CUDA_LOWERINGS["all_reduce"] = _in_use["nccl"]
    comms = _in_use["comms"]
    _in_use.clear()
    for comm in comms.values():
        comm.close()


def pick(n: int) -> str:
    """Which all-reduce an n-float message takes: "one_shot", "ring", or "nccl" past the ring's buffer."""
    if n <= _in_use["one_shot_floats"]:
        return "one_shot"
    return "ring" if n <= _in_use["comms"]["ring"].capacity else "nccl"


def lower_all_reduce_own(ex: CudaExecutor, node: Node) -> Launch:
    """out = the sum of x over every rank, by the one-shot or the ring, on ex.stream, in out's slot."""
    out = ex.tensors[node]
    world = check_group(node, out.device, out.dtype)
    n = out.numel()
    which = pick(n)
    if world == 1 or which == "nccl":
        return _in_use["nccl"](ex, node)  # one rank: task 04's copy; too large: NCCL
    comm = _in_use["comms"][which]
    try:  # views of the arena's slots, fixed for the executor's lifetime (never a copy made here)
        x, flat = ex.tensors[node.inputs[0]].view(-1), out.view(-1)
    except RuntimeError as e:
        raise KilnRunError(f"%{node.name} (all_reduce): its slots are not contiguous: {e}") from None
    buf, stream = comm.tensor(n), ex.stream  # (n,) float32 of the library's shared buffer

    def launch() -> int:
        with torch.cuda.stream(stream):  # current in a capture; not in the capture's warm-up
            buf.copy_(x)  # widened to float32
            comm.all_reduce(n, stream=stream)
            flat.copy_(buf)  # narrowed to out's dtype
        return 0

    return launch

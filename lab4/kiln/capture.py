"""Lab 4 task 07 · one CUDA graph per run: the whole forward pass captured once, replayed by every run.

Implement: `capture(ex)`, in the TODO region. The chapter's section "Task 07: one CUDA graph per
           run" explains it; "What a CUDA graph cannot capture" says why the executor of task 06
           is built the way it is.
Contract:  `ex` is a CudaExecutor (kiln/cuda.py, task 06) whose launches are lowered, whose
           constants are in the arena and whose stream is `ex.stream`; CudaExecutor(graph,
           use_graph=True) calls `capture(ex)` at the end of its constructor (given code), keeps
           the result as `ex.cuda_graph`, zeroes the buffers again, and from then on `run` copies
           the inputs into their arena slots, replays the graph on `ex.stream` and copies the
           outputs out: a run calls no kernel entry point at all.
           `capture(ex)` runs every launch once outside any capture (the warm-up: the kernels'
           modules load, errors show plainly), then captures every launch of `ex.launches`, in
           order, into a new `torch.cuda.CUDAGraph` on `ex.stream`, and returns it. A launch
           that returns a non-zero cudaError_t, during the warm-up or the capture, raises
           KilnRunError naming the node ("%name (op): <CUDA error string>"); so does a capture
           that CUDA refuses (a launch that synchronized, allocated or used another stream).
Test:      make test-lab4 TASK=07
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from kiln.cuda import CudaExecutor


def capture(ex: CudaExecutor) -> torch.cuda.CUDAGraph:
    """Every launch of `ex`, captured once on ex.stream: replaying the result is one run."""
    # TODO(lab4/07) begin: warm up, then capture on ex.stream; see the chapter's section "Task 07"
    raise NotImplementedError("lab4/07: capture")  # ~
    # TODO(lab4/07) end

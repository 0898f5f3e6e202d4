"""Lab 7 task 07 · the step without the host: task 06's forward and backward pass replayed as a CUDA graph.

Implement: the bodies marked TODO(lab7/07): `GraphedTrainer.capture` and
           `GraphedTrainer.forward_backward`. The chapter's section "Task 07: the step at GPT-2's
           size" explains them; task 06's Trainer (gpt/train.py: yours) does everything else.
Contract:  GraphedTrainer(cfg, tc) is a Trainer whose forward_backward(x, y) leaves the same
           gradients in the grads arena and returns the same loss as Trainer.forward_backward, by
           replaying a CUDA graph of one whole forward and backward pass:
           - one graph per input shape (batch, context), captured at the first call of that shape
             after WARMUP eager passes on a side stream (cuBLASLt's handle and workspace, torch's
             allocator and the library's first calls must not happen during a capture), kept in
             `self.graphs`; the captured pass reads its inputs from static tensors of that shape;
           - every call copies x and y into the static inputs, replays on the caller's current
             stream, and returns a new float32 CUDA scalar holding the loss (the graph writes its
             loss into the same tensor at every replay); nothing synchronises;
           - while `logits_hook` is set (tests only: Python that a graph would not run again),
             the pass is task 06's, Trainer.forward_backward, with no graph.
           The non-finite check and the optimizer stay outside the graph (the check synchronises;
           the learning rate changes every step). x and y: (B, T) int64 CUDA tensors.
Test:      make test-lab7 TASK=07
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from gpt.model import GPTConfig
from gpt.train import TrainConfig, Trainer

WARMUP = 2  # eager passes on a side stream before a capture


@dataclass
class Captured:
    """One shape's graph and the static tensors it reads and writes (given)."""

    graph: torch.cuda.CUDAGraph
    x: Tensor  # (B, T) int64: the inputs the captured pass reads
    y: Tensor  # (B, T) int64: its targets
    loss: Tensor  # () float32: where every replay writes the loss


class GraphedTrainer(Trainer):
    """Task 06's Trainer with its forward and backward pass replayed from a CUDA graph."""

    def __init__(self, cfg: GPTConfig, tc: TrainConfig, device: str = "cuda") -> None:
        super().__init__(cfg, tc, device)
        self.graphs: dict[tuple[int, ...], Captured] = {}  # (B, T) -> its graph

    def capture(self, x: Tensor, y: Tensor) -> Captured:
        """The graph of one forward and backward pass for inputs of x's shape."""
        # TODO(lab7/07) begin: warm up on a side stream, then capture into a graph over static inputs; about 10 lines
        raise NotImplementedError("lab7/07: capture")  # ~
        # TODO(lab7/07) end

    def forward_backward(self, x: Tensor, y: Tensor) -> Tensor:
        """The loss of batch (x, y) and its gradients in the grads arena, from a graph's replay."""
        # TODO(lab7/07) begin: the hook's eager path, the graph of the shape, fresh inputs, replay; about 10 lines
        raise NotImplementedError("lab7/07: forward_backward")  # ~
        # TODO(lab7/07) end

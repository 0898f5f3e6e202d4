"""Lab 7 task 06 · the training step: one arena of parameters, your operators, your AdamW.

Implement: the bodies marked TODO(lab7/06): the memory check (`check_fits`), which parameters
           decay (`decays`), the step's parts
           (`Trainer.forward_backward`, `Trainer.check_finite`, `Trainer.optimizer_step`) and the
           step itself (`Trainer.step`). The chapter's section "Task 06: a GPT step through your
           kernels" explains them; the arena, the model (gpt/model.py) and the data are given.
Contract:  `Trainer(cfg, tc)` (given) checks the shapes against the kernels' contracts and that the
           run fits in the GPU's free memory (DoesNotFitError, before anything is allocated), then lays
           every parameter out in arenas, task 05's way: one float32 master, exp_avg and exp_avg_sq,
           one bf16 weights and one bf16 grads arena, parameter `name` the elements
           [offset, offset + size) of each, offsets multiples of 8 (16 bytes of bf16). The model's
           parameters (`trainer.params[name]`) are bf16 views of the weights arena; each one's .grad
           is the view of the grads arena at the same place. Two pairs of int64 device tables list
           the tensors that decay and those that do not.
           `forward_backward(x, y)`: the gradients of this batch alone (the grads arena holds
           nothing of an earlier step), from the model's loss through gpt.ops; returns the loss (a
           float32 CUDA scalar, nothing synchronised).
           `check_finite(loss)`: raises NonFiniteError naming the step (1 for the first) and the
           tensor, "loss" or the first parameter (in the arena's order) whose gradient holds a NaN or
           an inf, after one synchronisation; returns None when everything is finite.
           `optimizer_step()`: the step counter advances (1 for the first update), then AdamW with
           the learning rate of that step (`lr_at`), betas, eps from TrainConfig and weight decay
           on the 2-D weights only (the embeddings and the matrices, GPT-2's convention; biases and
           layer norms' weights never decay): two launches of lab7::adamw_, one per table. The bf16
           weights are then the rounded float32 master. No gradient clipping.
           `step(x, y) -> float`: forward_backward, check_finite (a non-finite step raises before
           any parameter changes), optimizer_step; the loss as a Python float.
           Everything on the caller's current stream.
Test:      make test-lab7 TASK=06
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from gpt import data, model, ops
from gpt.model import GPTConfig

ALIGN = 8  # elements: every tensor starts on the 16-byte grid of the bf16 arenas (task 03's rule)
GiB = 1 << 30


@dataclass(frozen=True)
class TrainConfig:
    """The run: 300 steps of 16 sequences of the model's context (4096 tokens a step)."""

    steps: int = 300
    batch: int = 16
    lr: float = 1e-3
    warmup: int = 20
    min_lr_ratio: float = 0.1  # cosine decay to a tenth of lr over the steps
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    seed: int = 0  # the parameters' initialisation and the batches


def lr_at(step: int, tc: TrainConfig) -> float:
    """The learning rate of update `step` (1 for the first): linear warm-up, then cosine (given)."""
    if step <= tc.warmup:
        return tc.lr * step / tc.warmup
    progress = min(1.0, (step - tc.warmup) / max(1, tc.steps - tc.warmup))
    return tc.lr * (tc.min_lr_ratio + (1 - tc.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


class NonFiniteError(RuntimeError):
    """A NaN or an inf in the loss or a gradient: `step` and the `tensor` it was found in."""

    def __init__(self, step: int, tensor: str, detail: str = "") -> None:
        self.step, self.tensor = step, tensor
        super().__init__(
            f"step {step}: {tensor} is not finite{': ' + detail if detail else ''}; stopped before the update"
        )


class DoesNotFitError(RuntimeError):
    """The run needs more GPU memory than is free: said before anything is allocated."""


@dataclass(frozen=True)
class Slot:
    """Where one parameter lives in the arenas."""

    name: str
    shape: tuple[int, ...]
    offset: int
    size: int


def decays(name: str, shape: tuple[int, ...]) -> bool:
    """Whether AdamW's weight decay applies to this parameter."""
    # TODO(lab7/06) begin: GPT-2's convention; see the chapter's section "The arena"
    return len(shape) >= 2
    # ~ raise NotImplementedError("lab7/06: decays")
    # TODO(lab7/06) end


def layout(shapes: dict[str, tuple[int, ...]]) -> tuple[list[Slot], int]:
    """Each parameter's slot, in order, offsets rounded up to ALIGN; and the arena's length (given)."""
    slots, end = [], 0
    for name, shape in shapes.items():
        offset = -(-end // ALIGN) * ALIGN
        size = math.prod(shape)
        slots.append(Slot(name, tuple(shape), offset, size))
        end = offset + size
    return slots, -(-end // ALIGN) * ALIGN


def memory_needed(cfg: GPTConfig, tc: TrainConfig) -> int:
    """Bytes a run of this shape needs at its peak, an estimate on the high side (given): 16 bytes a
    parameter (float32 master, exp_avg, exp_avg_sq; bf16 weights and grads), the activations the
    backward pass keeps (bf16, per layer about 24 C a token, the attention's copies included), the
    logits three times over (logits, dlogits, the gradient), and 256 MiB of workspace (cuBLASLt's
    32 MiB, torch's allocator)."""
    _, n = layout(model.parameter_shapes(cfg))
    tokens = tc.batch * cfg.context
    activations = cfg.n_layer * tokens * cfg.d_model * 24 * 2
    logits = 3 * tokens * cfg.vocab_size * 2 + tokens * 4 * 2
    return 16 * n + activations + logits + (256 << 20)


def check_fits(cfg: GPTConfig, tc: TrainConfig, device: str) -> None:
    """DoesNotFitError, before anything is allocated, when a run needs more than the GPU has free."""
    if torch.device(device).type != "cuda":
        return
    # TODO(lab7/06) begin: memory_needed against torch.cuda.mem_get_info; name both in GiB; about 8 lines
    need = memory_needed(cfg, tc)
    free, total = torch.cuda.mem_get_info(torch.device(device))
    if need > free:
        raise DoesNotFitError(
            f"a step of batch {tc.batch} x context {cfg.context} with {cfg.n_layer} layers of {cfg.d_model} needs "
            f"about {need / GiB:.1f} GiB; the GPU has {free / GiB:.1f} GiB free of {total / GiB:.1f}: lower batch"
            " or context"
        )
    # ~ pass
    # TODO(lab7/06) end


class Trainer:
    """The model's parameters in arenas, and the training step through gpt.ops."""

    def __init__(self, cfg: GPTConfig, tc: TrainConfig, device: str = "cuda") -> None:
        # given (but check_fits): the checks, the arenas and the tables
        cfg.check_shapes()
        check_fits(cfg, tc, device)
        self.cfg, self.tc, self.device = cfg, tc, device
        self.slots, n = layout(model.parameter_shapes(cfg))
        self.master = torch.zeros(n, dtype=torch.float32, device=device)
        self.exp_avg = torch.zeros_like(self.master)
        self.exp_avg_sq = torch.zeros_like(self.master)
        self.weights = torch.zeros(n, dtype=torch.bfloat16, device=device)
        self.grads = torch.zeros(n, dtype=torch.bfloat16, device=device)
        init = model.init_parameters(cfg, tc.seed)
        self.params: dict[str, torch.nn.Parameter] = {}
        for s in self.slots:
            self.master[s.offset : s.offset + s.size] = init[s.name].reshape(-1).to(device)
            self.params[s.name] = torch.nn.Parameter(self.weights[s.offset : s.offset + s.size].view(s.shape))
            self.params[s.name].grad = self.grads[s.offset : s.offset + s.size].view(s.shape)
        self.weights.copy_(self.master)  # bf16 of the master, rounded to nearest even
        self.tables = {}  # True: the tensors that decay; False: the others
        for decay in (True, False):
            group = [s for s in self.slots if decays(s.name, s.shape) == decay]
            offsets = torch.tensor([s.offset for s in group], dtype=torch.int64, device=device)
            sizes = torch.tensor([s.size for s in group], dtype=torch.int64, device=device)
            self.tables[decay] = (offsets, sizes)
        self.step_count = 0  # updates made so far
        self.adamw = ops.adamw_  # task 05's kernel through gpt.ops: one launch per table
        self.logits_hook: Callable[[Tensor], Tensor] | None = None  # tests only: see model.loss

    def grad(self, name: str) -> Tensor:
        """The gradient of parameter `name`: its view of the grads arena (given)."""
        s = next(s for s in self.slots if s.name == name)
        return self.grads[s.offset : s.offset + s.size].view(s.shape)

    def forward_backward(self, x: Tensor, y: Tensor) -> Tensor:
        """The loss of batch (x, y) and its gradients in the grads arena."""
        # TODO(lab7/06) begin: the grads arena must hold this batch's gradients alone; about 5 lines
        self.grads.zero_()  # autograd adds into each .grad: one memset for them all
        loss = model.loss(self.cfg, self.params, x, y, self.logits_hook)
        loss.backward()
        return loss.detach()
        # ~ raise NotImplementedError("lab7/06: forward_backward")
        # TODO(lab7/06) end

    def check_finite(self, loss: Tensor) -> None:
        """NonFiniteError naming the step and the tensor, if the loss or a gradient is not finite."""
        # TODO(lab7/06) begin: one synchronisation for the loss and the whole grads arena; about 10 lines
        step = self.step_count + 1
        # the largest |g| is NaN or inf exactly when some g is: one reduction over the arena, where
        # isfinite(grads).all() writes and reads a bool per element first (0.19 ms against 0.64 on an H200)
        largest = torch.linalg.vector_norm(self.grads, float("inf")).float()
        loss_ok, grads_ok = torch.isfinite(torch.stack([loss, largest])).tolist()
        if not loss_ok:
            raise NonFiniteError(step, "loss", f"{loss.item()}")
        if not grads_ok:
            for s in self.slots:  # only on the way out: name the first tensor with a bad value
                if not bool(torch.isfinite(self.grad(s.name)).all()):
                    raise NonFiniteError(step, f"the gradient of {s.name}")
            raise NonFiniteError(step, "the gradients")  # the arena's padding: never written
        # ~ raise NotImplementedError("lab7/06: check_finite")
        # TODO(lab7/06) end

    def optimizer_step(self) -> None:
        """One AdamW update of every parameter from the grads arena: two launches of lab7::adamw_."""
        # TODO(lab7/06) begin: advance the step, then one adamw_ per table; about 10 lines
        self.step_count += 1
        tc = self.tc
        lr = lr_at(self.step_count, tc)
        for decay, (offsets, sizes) in self.tables.items():
            self.adamw(
                self.master, self.grads, self.exp_avg, self.exp_avg_sq, self.weights, offsets, sizes,
                lr, tc.beta1, tc.beta2, tc.eps, tc.weight_decay if decay else 0.0, self.step_count,
            )  # fmt: skip
        # ~ raise NotImplementedError("lab7/06: optimizer_step")
        # TODO(lab7/06) end

    def step(self, x: Tensor, y: Tensor) -> float:
        """One training step on batch (x, y); its loss."""
        # TODO(lab7/06) begin: gradients, the check before anything changes, the update; about 5 lines
        loss = self.forward_backward(x, y)
        self.check_finite(loss)
        self.optimizer_step()
        return float(loss.item())
        # ~ raise NotImplementedError("lab7/06: step")
        # TODO(lab7/06) end


def train(
    cfg: GPTConfig | None = None, tc: TrainConfig | None = None, log: Callable[[str], None] | None = print
) -> list[float]:
    """`tc.steps` steps of the model on lab 5's stories; the loss of every step (given)."""
    cfg, tc = cfg or GPTConfig(), tc or TrainConfig()
    stream, vocab = data.tokens()
    if vocab > cfg.vocab_size:
        raise ValueError(f"the tokenizer has {vocab} tokens, the model {cfg.vocab_size}")
    batches = data.Batches(stream, tc.batch, cfg.context, tc.seed)
    trainer = Trainer(cfg, tc)
    losses: list[float] = []
    t0 = time.perf_counter()
    for k in range(tc.steps):
        losses.append(trainer.step(*batches[k]))
        if log and (k % 50 == 0 or k == tc.steps - 1):
            log(f"step {k + 1:4d}/{tc.steps}  loss {losses[-1]:.4f}  ({time.perf_counter() - t0:.1f} s)")
    return losses


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="train lab 7's GPT through your kernels")
    parser.add_argument("--steps", type=int, default=TrainConfig.steps)
    parser.add_argument("--batch", type=int, default=TrainConfig.batch)
    args = parser.parse_args(argv)
    train(tc=TrainConfig(steps=args.steps, batch=args.batch))


if __name__ == "__main__":
    main()

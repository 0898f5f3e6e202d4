"""Checks for lab7/gpt/graphed.py: task 06's forward and backward pass replayed from a CUDA graph.

What runs. GraphedTrainer (yours) is task 06's Trainer (gpt/train.py and gpt/ops.py: yours too, or
the references with --solutions) with forward_backward replaced: one graph per input shape,
captured after eager warm-up passes, replayed with the batch copied into its static inputs. The
comparison is task 06's own Trainer, eager, on the same weights and batches: a graph of the same
kernels in the same order gives the same numbers (on an H200 the two agreed bit for bit over six
steps; dQ's float32 atomics in task 04 may change the last bits, hence the tolerances below).

Checks (GPU; skipped where there is none), on task 06's small model (2 layers of d_model 128, 2
heads of 64, context 64, batch 4, random tokens):
- `test_replays_task_06s_pass`: four steps in lockstep with the eager Trainer, each on its own
  batch: every step's loss within 1e-4 of eager's (relative; the batches' losses differ by far
  more), and the master weights after the four updates within 1e-4 of eager's, normwise. A replay
  that reads the batch it was captured with, or a pass that adds into last step's gradients,
  drifts from the second step on.
- `test_each_call_returns_its_own_loss`: two calls on two batches, then both losses read: each is
  its own batch's (the graph's output tensor is written again by every replay).
- `test_a_new_shape_is_captured_again`: batches of 4, 2 and 4 rows: each loss is eager's, and two
  graphs are kept.
- `test_the_hook_runs_eagerly`: once a graph exists, a logits hook that scales the logits by inf
  must reach the loss: the step raises NonFiniteError naming the loss, no parameter changes, and
  without the hook the next step is finite again.
- `test_it_replays_a_graph`: after the capture, three calls of the same shape: three replays
  (torch.cuda.CUDAGraph.replay counted) and not one call of a lab7 operator's kernels from the
  host (gpt.ops._call counted): the work is the graph's.
- `test_on_the_callers_stream`: a graph captured on one batch, then a call on a side stream whose
  first work is a slow kernel and then the copy of another batch: the gradients must be that
  batch's (eager's on the default stream), within 1e-2 normwise. A replay on another stream runs
  before the batch exists and computes the capture batch's gradients again.
Not checked here: speed (`python lab7/bench_gpt.py` times the graphed step at GPT-2 small's shape).

The point tests import the lab's code inside their bodies: the grading process loads this file too
and must not run student code.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from grader.tasks import PythonTask

MISTAKES = {
    "results replayed": "test_replays_task_06s_pass: a replay that never copies the new batch into the graph's"
    " inputs computes the capture batch's loss and gradients again",
    "snapshot returned": "test_each_call_returns_its_own_loss: the graph's own loss tensor, returned, holds the"
    " last replay's loss by the time it is read",
    "one graph for every shape": "test_a_new_shape_is_captured_again: a batch of another size needs its own graph",
    "hook ignored": "test_the_hook_runs_eagerly: a graph replays what it recorded, never the Python of a hook",
    "no graph": "test_it_replays_a_graph: the eager pass every time is task 06 again",
    "wrong stream": "test_on_the_callers_stream: a replay on another stream than the caller's",
}

TASK = PythonTask(
    lab="lab7",
    number="07",
    title="the step replayed from a CUDA graph",
    sources=["gpt/graphed.py"],
    packages=["gpt", "../lab5/tiny"],
    builds_on=[
        "01_cross_entropy.cu",
        "02_norm_backward.cu",
        "03_matmul_backward.cu",
        "04_attention_backward.cu",
        "05_adamw.cu",
        "gpt/ops.py",
        "gpt/train.py",
    ],
    gpu=True,
    timeout=600,  # a cold build of the five task files, then small models only
    mistakes=MISTAKES,
)

LOSS_RTOL = 1e-4
SLEEP_CYCLES = 100_000_000  # torch.cuda._sleep: tens of milliseconds, far past the host's queueing


def _small() -> tuple[Any, Any]:
    from gpt.model import GPTConfig
    from gpt.train import TrainConfig

    return GPTConfig(context=64, n_layer=2, n_head=2, d_model=128), TrainConfig(steps=10, batch=4, warmup=2)


def _batch(cfg: Any, rows: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(700 + k)
    tokens = torch.randint(0, cfg.vocab_size, (rows, cfg.context + 1), generator=gen).cuda()
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    return (got - want).norm().item() / max(want.norm().item(), 1e-30)


def _pair() -> tuple[Any, Any, Any]:
    """Task 06's Trainer and yours, from the same weights; and the config."""
    from gpt.graphed import GraphedTrainer
    from gpt.train import Trainer

    cfg, tc = _small()
    return Trainer(cfg, tc), GraphedTrainer(cfg, tc), cfg


def _same_loss(got: float, want: float, what: str) -> None:
    assert math.isfinite(got) and abs(got - want) <= LOSS_RTOL * abs(want), (
        f"{what}: loss {got:.6f}, task 06's eager pass {want:.6f}"
    )


@pytest.mark.gpu
@pytest.mark.points(3)
def test_replays_task_06s_pass():
    eager, graphed, cfg = _pair()
    for k in range(4):
        x, y = _batch(cfg, 4, k)
        want = eager.step(x, y)
        _same_loss(graphed.step(x, y), want, f"step {k + 1} (a new batch)")
    err = _rel(graphed.master, eager.master)
    assert err <= 1e-4, f"after four steps the master weights are {err:.3g} off task 06's (normwise)"


@pytest.mark.gpu
@pytest.mark.points(1)
def test_each_call_returns_its_own_loss():
    eager, graphed, cfg = _pair()
    (x1, y1), (x2, y2) = _batch(cfg, 4, 10), _batch(cfg, 4, 11)
    mine = [graphed.forward_backward(x1, y1), graphed.forward_backward(x2, y2)]
    want = [float(eager.forward_backward(x1, y1)), float(eager.forward_backward(x2, y2))]
    for k in range(2):
        _same_loss(float(mine[k]), want[k], f"call {k + 1}'s loss, read after both calls")


@pytest.mark.gpu
@pytest.mark.points(1)
def test_a_new_shape_is_captured_again():
    eager, graphed, cfg = _pair()
    for k, rows in enumerate((4, 2, 4)):
        x, y = _batch(cfg, rows, 20 + k)
        _same_loss(float(graphed.forward_backward(x, y)), float(eager.forward_backward(x, y)), f"{rows} rows")
    assert len(graphed.graphs) == 2, f"{len(graphed.graphs)} graphs kept for two shapes"


@pytest.mark.gpu
@pytest.mark.points(1)
def test_the_hook_runs_eagerly():
    from gpt.train import NonFiniteError

    _, graphed, cfg = _pair()
    graphed.step(*_batch(cfg, 4, 30))  # the graph exists now
    before = graphed.master.clone()
    graphed.logits_hook = lambda logits: logits * math.inf
    with pytest.raises(NonFiniteError) as err:
        graphed.step(*_batch(cfg, 4, 31))
    assert err.value.tensor == "loss", f"the step stopped at {err.value.tensor}, not at the loss"
    assert torch.equal(graphed.master, before), "the parameters changed in a step that stopped"
    graphed.logits_hook = None
    assert math.isfinite(graphed.step(*_batch(cfg, 4, 32))), "without the hook the step is not finite again"


@pytest.mark.gpu
@pytest.mark.points(2)
def test_it_replays_a_graph(monkeypatch):
    from gpt import ops

    _, graphed, cfg = _pair()
    x, y = _batch(cfg, 4, 40)
    graphed.forward_backward(x, y)  # captures
    replays, calls = [0], [0]
    replay, call = torch.cuda.CUDAGraph.replay, ops._call

    def counted_replay(self: torch.cuda.CUDAGraph) -> None:
        replays[0] += 1
        replay(self)

    def counted_call(*args: Any) -> None:
        calls[0] += 1
        call(*args)

    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", counted_replay)
    monkeypatch.setattr(ops, "_call", counted_call)
    for k in range(3):
        graphed.forward_backward(*_batch(cfg, 4, 41 + k))
    torch.cuda.synchronize()
    assert replays[0] == 3 and calls[0] == 0, (
        f"three calls of a captured shape: {replays[0]} graph replays and {calls[0]} kernel calls from the host"
        " (expected 3 and 0)"
    )


@pytest.mark.gpu
@pytest.mark.points(2)
def test_on_the_callers_stream():
    eager, graphed, cfg = _pair()
    graphed.forward_backward(*_batch(cfg, 4, 50))  # captured with this batch
    x, y = _batch(cfg, 4, 51)
    eager.forward_backward(x, y)
    torch.cuda.synchronize()  # task 03's calls on two streams must not overlap (one cuBLASLt workspace)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        xs, ys = torch.zeros_like(x), torch.zeros_like(y)
        xs.copy_(x)  # the batch exists only once the sleep is over
        ys.copy_(y)
        graphed.forward_backward(xs, ys)
    torch.cuda.synchronize()
    worst = max(((_rel(graphed.grad(s.name), eager.grad(s.name)), s.name) for s in graphed.slots), key=lambda e: e[0])
    assert worst[0] <= 1e-2, (
        f"forward_backward on a busy stream of the caller's: the gradient of {worst[1]} is {worst[0]:.3g} off the"
        " same batch's (normwise): replay on torch.cuda.current_stream(), after the copies"
    )


def test_graphed_step(grade):
    grade(TASK)

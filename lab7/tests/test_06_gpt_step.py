"""Checks for lab7/gpt/ops.py and lab7/gpt/train.py: a GPT trained through your kernels of tasks 01
to 05 (with --solutions, the reference of each), as torch.library operators with autograd.

What runs. gpt/kernels.py builds the five task files into one library (cuBLAS and cuBLASLt linked
for task 03); gpt/ops.py wraps each entry point as a `lab7::` operator; gpt/model.py (given) writes
a GPT-2-shaped model with them; gpt/train.py keeps the parameters in task 05's arenas and makes
the step. The forward passes of layer norm, the matmuls and attention are torch's; every gradient
and every update is yours. The model trained: 4 layers, d_model 256, 4 heads of 64, context 256, batch 16,
lab 5's BPE of 512 tokens on lab 5's stories (3.4M parameters, 4096 tokens a step).

The reference (this file, not the student's): the same model in plain PyTorch, F.layer_norm,
F.linear, F.gelu(approximate="tanh"), F.scaled_dot_product_attention(is_causal=True) (its flash
backend on an H100/H200: the same forward kernel as lab7::attention's) and F.cross_entropy of the
logits in float32 (what autocast does; task 01's kernel also computes in float32), with bf16
weights and activations, float32 master weights updated by torch.optim.AdamW(fused=True) with the
same hyper-parameters, two parameter groups (weight decay on the 2-D weights only) and the same
learning rate per step, the bf16 weights copied from the master after every step, the same
initialisation and the same batches.

Checks (GPU; the whole task is skipped where there is none), the small ones on a 2-layer model of
d_model 128 (2 heads of 64), context 64, batch 4, random tokens:
- `test_opcheck`: torch.library.opcheck of every operator on small shapes (rows 96, C 64, M 40, a
  causal attention of T = 100, a loss over V = 264): the schema, the fake against the real op
  (shapes, dtypes, devices, strides), the autograd registration, and an AOT-traced run with
  dynamic shapes. A fake with a wrong shape or dtype, or an op that returns an alias of an input,
  fails here.
- `test_backward_matches_autograd`: each differentiable operator's gradients against torch's
  autograd of the same function in float32 on the same bf16 inputs, with a random upstream
  gradient (not ones: a backward that ignores it fails), loss scaled by 2.5 for the cross-entropy.
  Judged by the relative error of each gradient's norm, ||got - want|| / ||want|| <= 5e-2: bf16
  outputs carry 2^-9 relative (one rounding), the attention's P and dS operands rounded to bf16
  about 2^-8 each, so the reference kernels stay near 1e-2; but task 04 accepts a kernel up to
  6u + 2u |x| off element by element (u = 2^-8: 2.3% of a unit value), and one that passes there
  must pass here. A swapped operand, a missing term or a gradient of the wrong input is off by
  30% to 100%, an ignored upstream gradient by 60% (a factor 2.5).
- `test_gradients_against_pytorch`: the small model's gradients after forward_backward (the
  grads arena, read through `trainer.grad(name)`), for two steps on two batches with the same
  parameters, against the reference's autograd gradients: each tensor within 0.1 of its norm.
  The bf16 roundings of the two runs differ (cuBLASLt and cuBLAS sum in other orders, the two
  attention backwards round P and dS at other places): on a CPU emulation of the kernels the
  worst tensor was 1.8% off, and a task 04 kernel at the edge of its tolerance (above) may add a
  few percent through two layers; 0.1 covers both. The loss's 1/N scale (a factor of 256 here),
  gradients accumulated across steps (the second step's are off by about 100%), gradients not in
  the arena (zero: 100%), and swapped layer norm statistics (100%) are each off by far more.
- `test_optimizer_matches_torch`: three optimizer steps on random bf16 gradients written into the
  grads arena (lr 3e-2, weight decay 0.3, warm-up of one step), against torch.optim.AdamW(fused=True)
  with the two groups on float32 copies of the master: master within 1e-6 + 1e-5 |p| (float32
  arithmetic of three steps, a few units of 6e-8 each; decay on a layer norm's weight moves it by
  lr wd = 9e-3, a step counter that stays at 1 changes the bias corrections by 10% and more),
  and the bf16 weights bit for bit the rounded master.
- `test_on_the_callers_stream`: the small model's forward_backward on a side stream whose first
  work is a slow kernel (torch.cuda._sleep) and then the copy of the batch: the gradients must be
  those of the same step on the default stream, within 1e-2 of their norm (dQ's atomics make the
  last bits differ; a launch on any other stream reads inputs that do not exist yet). Then
  optimizer_step on the side stream behind a sleep and the copy of the gradients: master and
  weights bit for bit those of the same update on the default stream.
- `test_nonfinite_loss_stops_the_step`: two good steps, then logits scaled by inf (a test hook):
  step 3 raises NonFiniteError naming step 3 and the loss, and no parameter has changed.
- `test_nonfinite_gradient_stops_the_step`: a hook makes h.1.mlp.c_fc.weight's gradient NaN (the
  loss stays finite): step 1 raises naming that tensor, and no parameter has changed.
- `test_does_not_fit_says_so_first`: batch 2^20 of the full model: DoesNotFitError, with the GiB
  needed and free, and not a byte allocated.
- `test_loss_curve_matches_pytorch`: the full model, 300 steps on lab 5's stories, against the
  reference: every step's loss within 1% of the reference's, and both curves fall (the last loss
  below 60% of the first). Why 1%: the two runs start from the same bf16 weights and read the same
  batches, and differ only in rounding (the order of cuBLASLt's sums, the two attention backwards,
  task 05's float32 AdamW against torch's fused one). Such differences grow slowly and do not
  compound into a different curve at this size: a float32 CPU twin of the model (2 layers of 32,
  context 16), tests/test_lab7_tolerances.py, trains twice with every operation's result rounded to
  bf16 from float32 and from float64 arithmetic, and the two curves stay within 0.05% of each other
  for 300 steps (the check there asks for 0.25%). A wrong gradient or a wrong loss scale moves the
  curve by far more than 1%; a small mistake (decay on the layer norms' weights) may not move it at
  all, which is why the checks above judge the gradients and the optimizer on their own.
Not checked here: a CUDA graph of the pass (task 07 captures it), and performance (task 07's
bench_gpt.py times a GPT-2 124M step).

The point tests import the lab's code inside their bodies: the grading process loads this file too
and must not run student code.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 - torch's own spelling

from grader.tasks import PythonTask

KERNELS = [
    "01_cross_entropy.cu",
    "02_norm_backward.cu",
    "03_matmul_backward.cu",
    "04_attention_backward.cu",
    "05_adamw.cu",
]

MISTAKES = {
    "fake tensor": "test_opcheck: each op's fake against the real op (shape, dtype, device), under an AOT trace",
    "incoming gradient": "test_backward_matches_autograd: a random upstream gradient (loss x 2.5 for the"
    " cross-entropy): a backward that ignores it, or uses ones, is off by its size",
    "wrong gradient": "test_backward_matches_autograd: every input's gradient of every op against torch's"
    " autograd (a swapped operand, the wrong bias gradient, a missing term)",
    "layout": "test_backward_matches_autograd and test_gradients_against_pytorch: the attention's upstream"
    " gradient arrives transposed (non-contiguous); the kernels take contiguous tensors",
    "loss scale": "test_gradients_against_pytorch: the mean's 1/N (1/256 here) in dloss",
    "gradients accumulated": "test_gradients_against_pytorch: a second step's gradients are that batch's alone",
    "gradients outside the arena": "test_gradients_against_pytorch: read through the grads arena, which the"
    " optimizer reads: a .grad replaced by a fresh tensor leaves it zero",
    "bias correction step": "test_optimizer_matches_torch: three steps, each with its own bias corrections and"
    " learning rate",
    "weight decay groups": "test_optimizer_matches_torch: the layer norms' weights and the biases never decay,"
    " the 2-D weights do (lr wd = 9e-3 a step there)",
    "wrong stream": "test_on_the_callers_stream: the caller's stream is busy behind a slow kernel",
    "non-finite loss": "test_nonfinite_loss_stops_the_step: logits times inf at step 3",
    "non-finite gradient": "test_nonfinite_gradient_stops_the_step: a NaN gradient with a finite loss",
    "update before the check": "test_nonfinite_*: the parameters must be unchanged when the step stops",
    "does not fit": "test_does_not_fit_says_so_first: batch 2^20, refused before any allocation",
}

TASK = PythonTask(
    lab="lab7",
    number="06",
    title="a GPT training step through your kernels",
    sources=["gpt/ops.py", "gpt/train.py"],
    packages=["gpt", "../lab5/tiny"],
    builds_on=KERNELS,
    gpu=True,
    timeout=900,  # a cold build of the five task files, then two 300-step runs
    mistakes=MISTAKES,
)

BF16 = torch.bfloat16
GRAD_RTOL = 5e-2  # an op's gradient against autograd in float32, normwise
MODEL_GRAD_RTOL = 1e-1  # the model's gradients against the reference's, normwise per tensor
CURVE_RTOL = 1e-2  # per-step loss against the reference's


def _small() -> tuple[Any, Any]:
    from gpt.model import GPTConfig
    from gpt.train import TrainConfig

    return GPTConfig(context=64, n_layer=2, n_head=2, d_model=128), TrainConfig(steps=10, batch=4, warmup=2)


def _batch(cfg: Any, tc: Any, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + k)
    rows = torch.randint(0, cfg.vocab_size, (tc.batch, cfg.context + 1), generator=gen).cuda()
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want|| in float64 (0 when both are 0)."""
    got, want = got.double(), want.double()
    den = want.norm().item()
    num = (got - want).norm().item()
    return num / den if den > 0 else num


# --- the reference: the same model in plain PyTorch ---------------------------------------------------


def reference_loss(cfg: Any, p: dict[str, torch.Tensor], idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    B, T = idx.shape
    C, H = cfg.d_model, cfg.n_head
    D = C // H
    x = F.embedding(idx, p["wte"]) + p["wpe"][:T]
    for i in range(cfg.n_layer):
        h = f"h.{i}."
        y = F.layer_norm(x, (C,), p[h + "ln_1.weight"], p[h + "ln_1.bias"], cfg.eps)
        qkv = F.linear(y, p[h + "attn.c_attn.weight"], p[h + "attn.c_attn.bias"])
        q, k, v = qkv.view(B, T, 3, H, D).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + F.linear(o, p[h + "attn.c_proj.weight"], p[h + "attn.c_proj.bias"])
        y = F.layer_norm(x, (C,), p[h + "ln_2.weight"], p[h + "ln_2.bias"], cfg.eps)
        a = F.gelu(F.linear(y, p[h + "mlp.c_fc.weight"], p[h + "mlp.c_fc.bias"]), approximate="tanh")
        x = x + F.linear(a, p[h + "mlp.c_proj.weight"], p[h + "mlp.c_proj.bias"])
    y = F.layer_norm(x, (C,), p["ln_f.weight"], p["ln_f.bias"], cfg.eps)
    logits = F.linear(y, p["wte"])  # tied
    return F.cross_entropy(logits.float().view(B * T, -1), targets.reshape(-1))


class Reference:
    """bf16 weights, a float32 master, torch's fused AdamW with two groups (decay on 2-D weights)."""

    def __init__(self, cfg: Any, tc: Any) -> None:
        from gpt import model

        self.cfg, self.tc, self.steps = cfg, tc, 0
        self.master = {n: t.cuda() for n, t in model.init_parameters(cfg, tc.seed).items()}
        self.weights = {n: t.to(BF16).requires_grad_() for n, t in self.master.items()}
        groups = [
            {"params": [t for t in self.master.values() if t.dim() >= 2], "weight_decay": tc.weight_decay},
            {"params": [t for t in self.master.values() if t.dim() < 2], "weight_decay": 0.0},
        ]
        self.opt = torch.optim.AdamW(groups, lr=tc.lr, betas=(tc.beta1, tc.beta2), eps=tc.eps, fused=True)

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for w in self.weights.values():
            w.grad = None
        loss = reference_loss(self.cfg, self.weights, x, y)
        loss.backward()
        return loss.detach()

    def optimizer_step(self, grads: dict[str, torch.Tensor] | None = None) -> None:
        from gpt.train import lr_at

        self.steps += 1
        for group in self.opt.param_groups:
            group["lr"] = lr_at(self.steps, self.tc)
        for n, m in self.master.items():
            m.grad = (grads[n] if grads is not None else self.weights[n].grad).float()
        self.opt.step()
        with torch.no_grad():
            for n, w in self.weights.items():
                w.copy_(self.master[n])

    def step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        loss = self.forward_backward(x, y)
        self.optimizer_step()
        return float(loss)


def _master_of(trainer: Any, name: str) -> torch.Tensor:
    s = next(s for s in trainer.slots if s.name == name)
    return trainer.master[s.offset : s.offset + s.size].view(s.shape)


def _weights_of(trainer: Any, name: str) -> torch.Tensor:
    s = next(s for s in trainer.slots if s.name == name)
    return trainer.weights[s.offset : s.offset + s.size].view(s.shape)


# --- the operators on their own ----------------------------------------------------------------------


def _rand(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen) * scale).to(BF16).cuda()


def _targets(rows: int, vocab: int, seed: int) -> torch.Tensor:
    return torch.randint(0, vocab, (rows,), generator=torch.Generator().manual_seed(seed)).cuda()


def _op_cases() -> dict[str, tuple[Any, ...]]:
    """name -> (op, inputs, float32 reference function of the same inputs)."""
    from gpt import ops

    N, C, M = 96, 64, 40
    x = _rand(N, C, seed=1)
    w, b = (1 + 0.3 * _rand(C, seed=2).float()).to(BF16), _rand(C, seed=3, scale=0.3)
    W, bias = _rand(M, C, seed=4, scale=0.2), _rand(M, seed=5, scale=0.3)
    h = _rand(N, C, seed=6, scale=2.0)  # across GELU's bend
    q, k, v = (_rand(2, 2, 100, 64, seed=s) for s in (7, 8, 9))
    logits, targets = _rand(50, 264, seed=10, scale=3.0), _targets(50, 264, seed=15)
    return {
        "layer_norm": (
            lambda x, w, b: ops.layer_norm(x, w, b, 1e-5)[0],
            (x, w, b),
            lambda x, w, b: F.layer_norm(x, (C,), w, b, 1e-5),
        ),
        "linear": (ops.linear, (x, W, bias), F.linear),
        "linear without bias": (lambda x, W: ops.linear(x, W, None), (x, W), F.linear),
        "gelu_linear": (
            lambda h, W, b: ops.gelu_linear(h, W, b)[0],
            (h, W, bias),
            lambda h, W, b: F.linear(F.gelu(h, approximate="tanh"), W, b),
        ),
        "attention": (
            lambda q, k, v: ops.attention(q, k, v)[0],
            (q, k, v),
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        ),
        "cross_entropy": (
            lambda z: 2.5 * ops.cross_entropy(z, targets)[0],
            (logits,),
            lambda z: 2.5 * F.cross_entropy(z, targets),
        ),
    }


def _opcheck_cases() -> list[tuple[str, Any, tuple[Any, ...]]]:
    from gpt import ops

    cases = _op_cases()
    out = []
    for name, (_, args, _) in cases.items():
        grads = tuple(a.detach().clone().requires_grad_() for a in args)
        op = {
            "layer_norm": ops.layer_norm,
            "linear": ops.linear,
            "linear without bias": ops.linear,
            "gelu_linear": ops.gelu_linear,
            "attention": ops.attention,
            "cross_entropy": ops.cross_entropy,
        }[name]
        if name == "layer_norm":
            grads = (*grads, 1e-5)
        elif name == "linear without bias":
            grads = (*grads, None)
        elif name == "cross_entropy":
            grads = (*grads, _targets(50, 264, seed=16))
        out.append((name, op, grads))
    return out


OPS = ["layer_norm", "linear", "linear without bias", "gelu_linear", "attention", "cross_entropy"]


@pytest.mark.gpu
@pytest.mark.points(1)
@pytest.mark.parametrize("name", OPS)
def test_opcheck(name):
    """torch.library.opcheck: schema, fake, autograd registration, an AOT-traced run (dynamic shapes)."""
    op, args = next((op, args) for n, op, args in _opcheck_cases() if n == name)
    torch.library.opcheck(op, args)


@pytest.mark.gpu
@pytest.mark.points(1)
def test_opcheck_backward_ops_and_adamw():
    """The backward operators and adamw_ on their own: their fakes and schemas (no autograd)."""
    from gpt import ops

    N, C, M = 96, 64, 40
    x, W, dy = _rand(N, C, seed=1), _rand(M, C, seed=4, scale=0.2), _rand(N, M, seed=11)
    _, mean, rstd = ops.layer_norm(x, _rand(C, seed=2), _rand(C, seed=3), 1e-5)
    torch.library.opcheck(ops.layer_norm_backward, (_rand(N, C, seed=12), x, _rand(C, seed=2), mean, rstd))
    torch.library.opcheck(ops.linear_backward, (x, W, dy))
    h = _rand(N, C, seed=6, scale=2.0)
    torch.library.opcheck(ops.gelu_linear_backward, (F.gelu(h, approximate="tanh"), h, W, dy))
    q, k, v = (_rand(2, 2, 100, 64, seed=s) for s in (7, 8, 9))
    o, lse = ops.attention(q, k, v)
    torch.library.opcheck(ops.attention_backward, (q, k, v, o, _rand(2, 2, 100, 64, seed=13), lse))
    n = 64 + 40
    master = torch.randn(n, device="cuda")
    offsets = torch.tensor([0, 64], dtype=torch.int64, device="cuda")
    sizes = torch.tensor([64, 40], dtype=torch.int64, device="cuda")
    args = (master, _rand(n, seed=14), torch.zeros(n, device="cuda"), torch.zeros(n, device="cuda"))
    args = (*args, master.to(BF16), offsets, sizes, 1e-3, 0.9, 0.95, 1e-8, 0.1, 1)
    torch.library.opcheck(ops.adamw_, args, test_utils=("test_schema", "test_faketensor"))


@pytest.mark.gpu
@pytest.mark.points(3)
@pytest.mark.parametrize("name", OPS)
def test_backward_matches_autograd(name):
    """Each op's input gradients against torch's autograd in float32, random upstream gradient."""
    fn, args, ref = _op_cases()[name]
    mine = [a.detach().clone().requires_grad_() for a in args]
    theirs = [a.detach().float().requires_grad_() for a in args]
    out = fn(*mine)
    want = ref(*theirs)
    gen = torch.Generator().manual_seed(20)
    up = torch.randn(tuple(want.shape), generator=gen).cuda() if want.dim() else torch.tensor(1.0, device="cuda")
    out.backward(up.to(out.dtype))
    want.backward(up)
    for i, (m, t) in enumerate(zip(mine, theirs, strict=True)):
        assert m.grad is not None, f"{name}: input {i} got no gradient"
        assert m.grad.dtype == m.dtype, f"{name}: input {i}'s gradient is {m.grad.dtype}, the input {m.dtype}"
        err = _rel(m.grad, t.grad)
        assert err <= GRAD_RTOL, (
            f"{name}: the gradient of input {i} {tuple(m.shape)} is {err:.3g} off torch's autograd (norm-wise;"
            f" allowed {GRAD_RTOL})"
        )


# --- the model's step --------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.points(3)
def test_gradients_against_pytorch():
    """forward_backward's gradients, read from the grads arena, against the reference's autograd,
    two batches in a row with the same parameters (no update in between)."""
    from gpt.train import Trainer

    cfg, tc = _small()
    trainer, ref = Trainer(cfg, tc), Reference(cfg, tc)
    for k in range(2):
        x, y = _batch(cfg, tc, k)
        loss = trainer.forward_backward(x, y)
        want = ref.forward_backward(x, y)
        assert abs(float(loss) - float(want)) <= CURVE_RTOL * float(want), (
            f"batch {k + 1}: loss {float(loss):.5f}, PyTorch's {float(want):.5f}"
        )
        worst = max(((_rel(trainer.grad(n), ref.weights[n].grad), n) for n in ref.weights), key=lambda e: e[0])
        got, want = trainer.grad(worst[1]), ref.weights[worst[1]].grad
        assert worst[0] <= MODEL_GRAD_RTOL, (
            f"batch {k + 1}: the gradient of {worst[1]} in the grads arena is {worst[0]:.3g} off PyTorch's"
            f" (norm-wise; allowed {MODEL_GRAD_RTOL}): its norm is {got.double().norm().item():.4g}, PyTorch's"
            f" {want.double().norm().item():.4g}"
        )


@pytest.mark.gpu
@pytest.mark.points(3)
def test_optimizer_matches_torch():
    """Three AdamW steps on random gradients in the grads arena against torch's fused AdamW."""
    from gpt.train import TrainConfig, Trainer

    cfg, _ = _small()
    tc = TrainConfig(steps=3, batch=4, lr=3e-2, warmup=1, weight_decay=0.3)
    trainer, ref = Trainer(cfg, tc), Reference(cfg, tc)
    for step in range(1, 4):
        gen = torch.Generator().manual_seed(30 + step)
        trainer.grads.copy_((torch.randn(trainer.grads.numel(), generator=gen) * 0.01).to(BF16))
        grads = {s.name: trainer.grad(s.name).clone() for s in trainer.slots}
        trainer.optimizer_step()
        ref.optimizer_step(grads)
        assert trainer.step_count == step, f"after {step} optimizer steps step_count is {trainer.step_count}"
        for s in trainer.slots:
            got, want = _master_of(trainer, s.name), ref.master[s.name]
            bad = (got - want).abs() > 1e-6 + 1e-5 * want.abs()
            if bool(bad.any()):
                i = int(bad.reshape(-1).nonzero()[0])
                raise AssertionError(
                    f"step {step}: the master of {s.name} {tuple(s.shape)} differs from torch's AdamW at element {i}:"
                    f" {got.reshape(-1)[i].item():.8g}, expected {want.reshape(-1)[i].item():.8g}"
                    f" ({int(bad.sum())} elements wrong; weight decay {'on' if len(s.shape) >= 2 else 'off'} here)"
                )
            assert torch.equal(_weights_of(trainer, s.name), got.to(BF16)), (
                f"step {step}: the bf16 weights of {s.name} are not the rounded master"
            )


SLEEP_CYCLES = 100_000_000  # torch.cuda._sleep: tens of milliseconds, far past the host's queueing


@pytest.mark.gpu
@pytest.mark.points(2)
def test_on_the_callers_stream():
    """A step queued on a busy side stream gives the step queued on the default stream."""
    from gpt.train import Trainer

    cfg, tc = _small()
    x, y = _batch(cfg, tc, 0)
    calm = Trainer(cfg, tc)
    calm.forward_backward(x, y)
    torch.cuda.synchronize()  # task 03's calls on two streams must not overlap (one cuBLASLt workspace)
    busy = Trainer(cfg, tc)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        xs, ys = torch.zeros_like(x), torch.zeros_like(y)
        xs.copy_(x)  # the batch exists only once the sleep is over
        ys.copy_(y)
        busy.forward_backward(xs, ys)
    torch.cuda.synchronize()
    worst = max(((_rel(busy.grad(s.name), calm.grad(s.name)), s.name) for s in busy.slots), key=lambda e: e[0])
    assert worst[0] <= 1e-2, (
        f"forward_backward on a busy stream of the caller's: the gradient of {worst[1]} is {worst[0]:.3g} off the"
        " same step on the default stream (norm-wise): launch on torch.cuda.current_stream()"
    )
    # the update from the same gradients, which exist on the busy stream only once its sleep is over
    calm.optimizer_step()
    busy.grads.zero_()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        busy.grads.copy_(calm.grads)
        busy.optimizer_step()
    torch.cuda.synchronize()
    assert torch.equal(busy.master, calm.master) and torch.equal(busy.weights, calm.weights), (
        "optimizer_step on a busy stream of the caller's updates differently from the same step on the default"
        " stream: launch on torch.cuda.current_stream()"
    )


@pytest.mark.gpu
@pytest.mark.points(2)
def test_nonfinite_loss_stops_the_step():
    from gpt.train import NonFiniteError, Trainer

    cfg, tc = _small()
    trainer = Trainer(cfg, tc)
    for k in range(2):
        trainer.step(*_batch(cfg, tc, k))
    master, weights = trainer.master.clone(), trainer.weights.clone()
    trainer.logits_hook = lambda t: t * float("inf")
    with pytest.raises(NonFiniteError) as err:
        trainer.step(*_batch(cfg, tc, 2))
    msg = str(err.value)
    assert err.value.step == 3 and "step 3" in msg, f"the third step stopped, the error says: {msg}"
    assert "loss" in msg, f"the message should name the loss: {msg}"
    assert torch.equal(trainer.master, master) and torch.equal(trainer.weights, weights), (
        "the step stopped, but the parameters changed: check before the update"
    )


@pytest.mark.gpu
@pytest.mark.points(2)
def test_nonfinite_gradient_stops_the_step():
    from gpt.train import NonFiniteError, Trainer

    cfg, tc = _small()
    trainer = Trainer(cfg, tc)
    master = trainer.master.clone()
    name = "h.1.mlp.c_fc.weight"
    trainer.params[name].register_hook(lambda g: g * float("nan"))
    with pytest.raises(NonFiniteError) as err:
        trainer.step(*_batch(cfg, tc, 0))
    msg = str(err.value)
    assert err.value.step == 1 and "step 1" in msg, f"the first step stopped, the error says: {msg}"
    assert name in msg, f"the message should name {name}, whose gradient is NaN (the loss is finite): {msg}"
    assert torch.equal(trainer.master, master), "the step stopped, but the parameters changed"


@pytest.mark.gpu
@pytest.mark.points(1)
def test_does_not_fit_says_so_first():
    from gpt.model import GPTConfig
    from gpt.train import DoesNotFitError, TrainConfig, Trainer

    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    with pytest.raises(DoesNotFitError) as err:
        Trainer(GPTConfig(), TrainConfig(batch=1 << 20))
    msg = str(err.value)
    assert "GiB" in msg and "free" in msg, f"say how much is needed and how much is free: {msg}"
    assert torch.cuda.memory_allocated() == before, "memory was allocated before the run was refused"


@pytest.mark.gpu
@pytest.mark.points(5)
def test_loss_curve_matches_pytorch(record_property):
    """300 steps of the full model on lab 5's stories: every step's loss within 1% of PyTorch's."""
    from gpt import data
    from gpt.model import GPTConfig
    from gpt.train import TrainConfig, Trainer

    cfg, tc = GPTConfig(), TrainConfig()
    stream, vocab = data.tokens()
    assert vocab <= cfg.vocab_size
    batches = data.Batches(stream, tc.batch, cfg.context, tc.seed)
    trainer = Trainer(cfg, tc)
    mine = [trainer.step(*batches[k]) for k in range(tc.steps)]
    del trainer
    ref = Reference(cfg, tc)
    theirs = [ref.step(*batches[k]) for k in range(tc.steps)]
    worst = max(range(tc.steps), key=lambda k: abs(mine[k] - theirs[k]) / theirs[k])
    err = abs(mine[worst] - theirs[worst]) / theirs[worst]
    record_property(
        "note",
        f"loss {mine[0]:.4f} -> {mine[-1]:.4f} in {tc.steps} steps (PyTorch's {theirs[0]:.4f} -> {theirs[-1]:.4f});"
        f" farthest at step {worst + 1}, {100 * err:.3f}% off (allowed {100 * CURVE_RTOL:g}%)",
    )
    assert err <= CURVE_RTOL, (
        f"step {worst + 1}: loss {mine[worst]:.4f}, PyTorch's {theirs[worst]:.4f} ({100 * err:.2f}% off; allowed"
        f" {100 * CURVE_RTOL:g}%); first and last: {mine[0]:.4f} -> {mine[-1]:.4f}, PyTorch's {theirs[0]:.4f} ->"
        f" {theirs[-1]:.4f}"
    )
    assert theirs[-1] < 0.6 * theirs[0] and mine[-1] < 0.6 * mine[0], "the model did not learn"
    assert all(math.isfinite(v) for v in mine)


def test_gpt_step(grade):
    grade(TASK)

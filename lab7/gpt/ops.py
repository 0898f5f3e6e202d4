"""Lab 7 task 06 · your kernels as PyTorch operators: torch.library custom ops with fakes and autograd.

Implement: the bodies marked TODO(lab7/06): the operators that call your kernels (the backward
           operators, the loss and adamw_: their outputs allocated, the entry point called through
           the given `_call` on the caller's stream), every operator's fake (register_fake), and the
           autograd formulas (setup_context and backward, register_autograd) of the five
           differentiable operators. The chapter's section "Task 06: a GPT step through your kernels" explains
           them. The operators' declarations (names, schemas) and the forward passes are given:
           the forwards are torch's (lab 5 is where forward kernels are written); every gradient
           and every optimizer update is yours.
Contract:  every tensor is a CUDA tensor, contiguous; activations and weights bfloat16, row
           statistics and the log-sum-exp float32 (each op checks this before any launch and
           raises ValueError). Rows are N = B * T tokens.
           lab7::layer_norm(x (N, C), weight (C,), bias (C,), eps) -> (y (N, C), mean (N,), rstd (N,))
           lab7::layer_norm_backward(dy, x, weight, mean, rstd) -> (dx, dweight, dbias)   task 02
           lab7::linear(x (N, K), weight (M, K), bias (M,) or None) -> y (N, M) = x weightᵀ + bias
           lab7::linear_backward(x, weight, dy) -> (dx, dweight, dbias)                   task 03
           lab7::gelu_linear(h (N, K), weight (M, K), bias (M,)) -> (y (N, M), a (N, K)): a = gelu(h)
             (tanh form), y = a weightᵀ + bias; a is returned for the backward pass, not differentiable
           lab7::gelu_linear_backward(a, h, weight, dy) -> (dh, dweight, dbias)           task 03
           lab7::attention(q, k, v (B, H, T, D)) -> (o (B, H, T, D), lse (B, H, T) float32): causal,
             scale 1 / sqrt(D), D = 64 or 128; lse is the forward's log-sum-exp, not differentiable
           lab7::attention_backward(q, k, v, o, do, lse) -> (dq, dk, dv)                  task 04
           lab7::cross_entropy(logits (N, V), targets (N,) int64) -> (loss () float32, dlogits (N, V)):
             loss = the mean over the N rows of task 01's loss; dlogits = its gradient (dloss = 1/N a
             row), computed in the same launch and not differentiable; the backward pass is
             dlogits times the incoming gradient                                          task 01
           lab7::adamw_(master, grads, exp_avg, exp_avg_sq, weights, offsets, sizes, lr, beta1,
             beta2, eps, weight_decay, step) -> None: one launch of task 05's adamw_bf16_master over
             the tensors of the tables, updating master, exp_avg, exp_avg_sq and weights in place
           Gradients come back in the dtype of what they are the gradient of (bf16), every one
           freshly allocated (never accumulated into). Every launch goes to torch's current stream
           (the caller's): pass kernels.stream(); a CUDA error raises kernels.KernelError naming
           the entry point. The fakes give every output's shape, dtype and device and run nothing.
Test:      make test-lab7 TASK=06
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from gpt import kernels
from gpt.kernels import check, ptr

DEVICE = "cuda"
BF16, F32 = torch.bfloat16, torch.float32
IGNORE_INDEX = -100  # no row is ignored here: every target is a token


def _need(t: Tensor, name: str, dtype: torch.dtype, shape: tuple[int, ...] | None = None) -> None:
    """A ValueError before any launch when `t` is not what the kernels take (given)."""
    if t.device.type != DEVICE:
        raise ValueError(f"{name} is on {t.device}: the kernels take {DEVICE} tensors")
    if t.dtype != dtype:
        raise ValueError(f"{name} is {t.dtype}, expected {dtype}")
    if not t.is_contiguous():
        raise ValueError(f"{name} is not contiguous (strides {t.stride()})")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(shape)}")


def _call(entry: str, *args: Any) -> None:
    """Calls the library's entry point `entry`: tensors passed as their device addresses (None as a
    null pointer), numbers as they are; raises KernelError naming it when it returns an error (given)."""
    fn = getattr(kernels.lib(), entry)
    check(fn(*(ptr(a) if a is None or isinstance(a, Tensor) else a for a in args)), entry)


def _no_grads(ctx: Any, *outputs: Tensor) -> None:
    """Marks outputs that are saved for the backward pass but never differentiated (given)."""
    ctx.mark_non_differentiable(*outputs)
    ctx.set_materialize_grads(False)  # their gradients arrive as None, not as tensors of zeros


# --- layer norm: torch's forward, task 02's backward ------------------------------------------------


@torch.library.custom_op("lab7::layer_norm", mutates_args=())
def layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """torch's layer norm over the rows of x, with the statistics it saved (given)."""
    _need(x, "x", BF16)
    y, mean, rstd = torch.ops.aten.native_layer_norm(x, [x.shape[-1]], weight, bias, eps)
    return y, mean.reshape(-1).to(F32), rstd.reshape(-1).to(F32)


@layer_norm.register_fake
def _(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    # TODO(lab7/06) begin: y like x; mean and rstd one float32 per row; see the chapter's section "Fakes"
    raise NotImplementedError("lab7/06: layer_norm's fake")  # ~
    # TODO(lab7/06) end


@torch.library.custom_op("lab7::layer_norm_backward", mutates_args=())
def layer_norm_backward(
    dy: Tensor, x: Tensor, weight: Tensor, mean: Tensor, rstd: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """dx, dweight, dbias of a layer norm (task 02's layernorm_backward_bf16), the last two bf16."""
    # TODO(lab7/06) begin: check, allocate dx, float32 dweight, dbias, scratch; call the entry; about 12 lines
    raise NotImplementedError("lab7/06: layer_norm_backward")  # ~
    # TODO(lab7/06) end


@layer_norm_backward.register_fake
def _(dy: Tensor, x: Tensor, weight: Tensor, mean: Tensor, rstd: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    # TODO(lab7/06) begin: dx like x, dweight and dbias like weight; see the chapter's section "Fakes"
    raise NotImplementedError("lab7/06: layer_norm_backward's fake")  # ~
    # TODO(lab7/06) end


def _layer_norm_setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor, Tensor]) -> None:
    # TODO(lab7/06) begin: save what the backward needs; mean and rstd are not differentiable; about 4 lines
    raise NotImplementedError("lab7/06: layer_norm's setup_context")  # ~
    # TODO(lab7/06) end


def _layer_norm_grad(ctx: Any, dy: Tensor, _dmean: Tensor | None, _drstd: Tensor | None) -> tuple[Any, ...]:
    # TODO(lab7/06) begin: one gradient per input of layer_norm (eps has none); about 3 lines
    raise NotImplementedError("lab7/06: layer_norm's backward")  # ~
    # TODO(lab7/06) end


layer_norm.register_autograd(_layer_norm_grad, setup_context=_layer_norm_setup)


# --- linear layers: cuBLAS's forward, task 03's backward ---------------------------------------------


@torch.library.custom_op("lab7::linear", mutates_args=())
def linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """y = x weightᵀ + bias by torch's matmul (given)."""
    _need(x, "x", BF16)
    return torch.nn.functional.linear(x, weight, bias)


@linear.register_fake
def _(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    # TODO(lab7/06) begin: y is (N, M) in x's dtype, on x's device; see the chapter's section "Fakes"
    raise NotImplementedError("lab7/06: linear's fake")  # ~
    # TODO(lab7/06) end


@torch.library.custom_op("lab7::linear_backward", mutates_args=())
def linear_backward(x: Tensor, weight: Tensor, dy: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """dx = dy W, dW = dyᵀ x and db = Σ_rows dy (task 03's linear_backward_bf16)."""
    # TODO(lab7/06) begin: check, allocate dx, dW, db (always: the epilogue writes it); call; about 10 lines
    raise NotImplementedError("lab7/06: linear_backward")  # ~
    # TODO(lab7/06) end


@linear_backward.register_fake
def _(x: Tensor, weight: Tensor, dy: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    # TODO(lab7/06) begin: dx like x, dW like weight, db (M,); see the chapter's section "Fakes"
    raise NotImplementedError("lab7/06: linear_backward's fake")  # ~
    # TODO(lab7/06) end


def _linear_setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    # TODO(lab7/06) begin: save x and weight, and whether there is a bias; about 3 lines
    raise NotImplementedError("lab7/06: linear's setup_context")  # ~
    # TODO(lab7/06) end


def _linear_grad(ctx: Any, dy: Tensor) -> tuple[Any, ...]:
    # TODO(lab7/06) begin: one gradient per input (None for a missing bias); about 3 lines
    raise NotImplementedError("lab7/06: linear's backward")  # ~
    # TODO(lab7/06) end


linear.register_autograd(_linear_grad, setup_context=_linear_setup)


@torch.library.custom_op("lab7::gelu_linear", mutates_args=())
def gelu_linear(h: Tensor, weight: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
    """a = gelu(h) (tanh form), y = a weightᵀ + bias, by torch (given); a is kept for the backward."""
    _need(h, "h", BF16)
    a = torch.nn.functional.gelu(h, approximate="tanh")
    return torch.nn.functional.linear(a, weight, bias), a


@gelu_linear.register_fake
def _(h: Tensor, weight: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
    # TODO(lab7/06) begin: y (N, M) and a like h; see the chapter's section "Fakes"
    raise NotImplementedError("lab7/06: gelu_linear's fake")  # ~
    # TODO(lab7/06) end


@torch.library.custom_op("lab7::gelu_linear_backward", mutates_args=())
def gelu_linear_backward(a: Tensor, h: Tensor, weight: Tensor, dy: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """dh = gelu'(h) ⊙ (dy W), dW = dyᵀ a, db = Σ_rows dy (task 03's gelu_linear_backward_bf16)."""
    # TODO(lab7/06) begin: as linear_backward; c_fc's backward computes dbh, so pass none; about 11 lines
    raise NotImplementedError("lab7/06: gelu_linear_backward")  # ~
    # TODO(lab7/06) end


@gelu_linear_backward.register_fake
def _(a: Tensor, h: Tensor, weight: Tensor, dy: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    # TODO(lab7/06) begin: dh like h, dW like weight, db (M,); see the chapter's section "Fakes"
    raise NotImplementedError("lab7/06: gelu_linear_backward's fake")  # ~
    # TODO(lab7/06) end


def _gelu_linear_setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor]) -> None:
    # TODO(lab7/06) begin: save a, h and weight; a is not differentiable; about 4 lines
    raise NotImplementedError("lab7/06: gelu_linear's setup_context")  # ~
    # TODO(lab7/06) end


def _gelu_linear_grad(ctx: Any, dy: Tensor, _da: Tensor | None) -> tuple[Any, ...]:
    # TODO(lab7/06) begin: the gradients of h, weight and bias; about 3 lines
    raise NotImplementedError("lab7/06: gelu_linear's backward")  # ~
    # TODO(lab7/06) end


gelu_linear.register_autograd(_gelu_linear_grad, setup_context=_gelu_linear_setup)


# --- causal attention: torch's fused forward, task 04's backward -------------------------------------


_CUDNN_FORWARD = [True]  # until cuDNN's kernel refuses once; then FlashAttention-2's for the process


def attention_forward(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """torch's causal attention forward: O and each query row's log-sum-exp, natural log, (B, H, T)
    (given). cuDNN's fused kernel where it runs (on an H200 at GPT-2 small's shape 0.084 ms a layer
    against 0.132 for the flash kernel, the same log-sum-exp within 2e-6), else FlashAttention-2's."""
    if _CUDNN_FORWARD[0]:
        try:
            out = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, True)
            return out[0], out[1].reshape(q.shape[:3])
        except RuntimeError:  # no cuDNN attention for this card or build
            _CUDNN_FORWARD[0] = False
    out = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True)
    return out[0], out[1][:, :, : q.shape[2]]


@torch.library.custom_op("lab7::attention", mutates_args=())
def attention(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Causal attention by torch's fused forward, which also returns each row's log-sum-exp (given)."""
    for t, name in ((q, "q"), (k, "k"), (v, "v")):
        _need(t, name, BF16, tuple(q.shape))
    o, lse = attention_forward(q, k, v)
    return o.contiguous(), lse.contiguous()  # O laid out (B, H, T, D) in memory too


@attention.register_fake
def _(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    # TODO(lab7/06) begin: o like q; lse float32 (B, H, T); see the chapter's section "Fakes"
    raise NotImplementedError("lab7/06: attention's fake")  # ~
    # TODO(lab7/06) end


@torch.library.custom_op("lab7::attention_backward", mutates_args=())
def attention_backward(
    q: Tensor, k: Tensor, v: Tensor, o: Tensor, do: Tensor, lse: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv of causal attention (task 04's attention_backward_bf16)."""
    # TODO(lab7/06) begin: check, allocate dq, dk, dv and the float32 dq32 and Delta; call; about 12 lines
    raise NotImplementedError("lab7/06: attention_backward")  # ~
    # TODO(lab7/06) end


@attention_backward.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, o: Tensor, do: Tensor, lse: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    # TODO(lab7/06) begin: dq, dk, dv like q, k, v; see the chapter's section "Fakes"
    raise NotImplementedError("lab7/06: attention_backward's fake")  # ~
    # TODO(lab7/06) end


def _attention_setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor]) -> None:
    # TODO(lab7/06) begin: save q, k, v, o and lse; lse is not differentiable; about 4 lines
    raise NotImplementedError("lab7/06: attention's setup_context")  # ~
    # TODO(lab7/06) end


def _attention_grad(ctx: Any, do: Tensor, _dlse: Tensor | None) -> tuple[Any, ...]:
    # TODO(lab7/06) begin: the gradients of q, k and v; about 2 lines
    raise NotImplementedError("lab7/06: attention's backward")  # ~
    # TODO(lab7/06) end


attention.register_autograd(_attention_grad, setup_context=_attention_setup)


# --- the loss: task 01's fused forward and backward --------------------------------------------------


@torch.library.custom_op("lab7::cross_entropy", mutates_args=())
def cross_entropy(logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """The mean cross-entropy over the rows, and its gradient, from one launch of task 01's kernel."""
    # TODO(lab7/06) begin: per-row losses and dlogits with dloss = 1/N a row; return their mean; about 12 lines
    raise NotImplementedError("lab7/06: cross_entropy")  # ~
    # TODO(lab7/06) end


@cross_entropy.register_fake
def _(logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    # TODO(lab7/06) begin: a float32 scalar and dlogits like logits; see the chapter's section "Fakes"
    raise NotImplementedError("lab7/06: cross_entropy's fake")  # ~
    # TODO(lab7/06) end


def _cross_entropy_setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor]) -> None:
    # TODO(lab7/06) begin: save dlogits, which is not differentiable; about 3 lines
    raise NotImplementedError("lab7/06: cross_entropy's setup_context")  # ~
    # TODO(lab7/06) end


def _cross_entropy_grad(ctx: Any, dloss: Tensor, _ddlogits: Tensor | None) -> tuple[Any, ...]:
    # TODO(lab7/06) begin: the chain rule through the mean: the saved gradient times dloss; about 3 lines
    raise NotImplementedError("lab7/06: cross_entropy's backward")  # ~
    # TODO(lab7/06) end


cross_entropy.register_autograd(_cross_entropy_grad, setup_context=_cross_entropy_setup)


# --- the optimizer: task 05's multi-tensor AdamW, in place ---------------------------------------


@torch.library.custom_op("lab7::adamw_", mutates_args=("master", "exp_avg", "exp_avg_sq", "weights"))
def adamw_(
    master: Tensor,
    grads: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    weights: Tensor,
    offsets: Tensor,
    sizes: Tensor,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    step: int,
) -> None:
    """One AdamW step (task 05's adamw_bf16_master) over the tensors of the tables, in one launch."""
    # TODO(lab7/06) begin: check the arenas and the tables, then one call; about 10 lines
    raise NotImplementedError("lab7/06: adamw_")  # ~
    # TODO(lab7/06) end


@adamw_.register_fake
def _(
    master: Tensor,
    grads: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    weights: Tensor,
    offsets: Tensor,
    sizes: Tensor,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    step: int,
) -> None:
    # TODO(lab7/06) begin: an op that only mutates its inputs returns nothing; see the chapter's section "Fakes"
    raise NotImplementedError("lab7/06: adamw_'s fake")  # ~
    # TODO(lab7/06) end

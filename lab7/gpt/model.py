"""A GPT-2-shaped model written with lab 7's operators (given).

Token and learned position embeddings, `n_layer` pre-LN blocks (causal self-attention, then a GELU
MLP, each added to the residual stream), a final layer norm and an output layer tied to the token
embedding, as GPT-2 and nanoGPT have it. Every layer norm, linear layer, attention and the loss go
through gpt.ops (your kernels in the backward pass); the embedding lookup and its backward (a
scatter-add into the table), the residual adds and the reshapes are torch's.

    GPTConfig                     the shapes; `check_shapes` tests them against the kernels' contracts
    parameter_shapes(cfg)         name -> shape, in the order of the arena
    init_parameters(cfg, seed)    GPT-2's initialisation in float32 on the CPU, name -> tensor
    loss(params, idx, targets)    the mean cross-entropy of a batch, through gpt.ops
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from gpt import ops


@dataclass(frozen=True)
class GPTConfig:
    """The default is the model task 06 trains: 3.4M parameters, 300 steps in seconds on an H100."""

    vocab_size: int = 512  # lab 5's BPE tokenizer
    context: int = 256  # T
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 256  # C; head dimension C / n_head = 64
    eps: float = 1e-5  # layer norm's

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    def check_shapes(self) -> None:
        """ValueError unless every kernel's contract holds at these shapes (given): task 03's
        K and M multiples of 8 (C, 3C, 4C and the vocabulary), task 02's C <= 16384, task 04's D of
        64 or 128 and T <= 65535."""
        C, V = self.d_model, self.vocab_size
        problems = []
        if C % self.n_head:
            problems.append(f"d_model {C} is not a multiple of n_head {self.n_head}")
        elif self.head_dim not in (64, 128):
            problems.append(f"head dimension {self.head_dim}: task 04 takes 64 or 128")
        for what, n in (("d_model", C), ("vocab_size", V)):
            if n < 8 or n % 8:
                problems.append(f"{what} {n} is not a multiple of 8 (task 03's K and M)")
        if C > 16384:
            problems.append(f"d_model {C} is past task 02's 16384")
        if not 1 <= self.context <= 65535:
            problems.append(f"context {self.context} is outside task 04's 1..65535")
        if problems:
            raise ValueError("the model's shapes break the kernels' contracts: " + "; ".join(problems))


def parameter_shapes(cfg: GPTConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter's name and shape, in the arena's order (the output layer is wte: tied)."""
    C, V = cfg.d_model, cfg.vocab_size
    shapes: dict[str, tuple[int, ...]] = {"wte": (V, C), "wpe": (cfg.context, C)}
    for i in range(cfg.n_layer):
        h = f"h.{i}."
        shapes |= {
            h + "ln_1.weight": (C,),
            h + "ln_1.bias": (C,),
            h + "attn.c_attn.weight": (3 * C, C),
            h + "attn.c_attn.bias": (3 * C,),
            h + "attn.c_proj.weight": (C, C),
            h + "attn.c_proj.bias": (C,),
            h + "ln_2.weight": (C,),
            h + "ln_2.bias": (C,),
            h + "mlp.c_fc.weight": (4 * C, C),
            h + "mlp.c_fc.bias": (4 * C,),
            h + "mlp.c_proj.weight": (C, 4 * C),
            h + "mlp.c_proj.bias": (C,),
        }
    return shapes | {"ln_f.weight": (C,), "ln_f.bias": (C,)}


def init_parameters(cfg: GPTConfig, seed: int = 0) -> dict[str, Tensor]:
    """GPT-2's initialisation, float32 on the CPU: weights N(0, 0.02), the residual projections'
    N(0, 0.02 / sqrt(2 n_layer)), biases 0, layer norms' weights 1. Seeded: the same every call."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in parameter_shapes(cfg).items():
        if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
            out[name] = torch.ones(shape)
        elif len(shape) == 1:
            out[name] = torch.zeros(shape)
        else:
            std = 0.02 / math.sqrt(2 * cfg.n_layer) if name.endswith("c_proj.weight") else 0.02
            out[name] = torch.randn(shape, generator=gen) * std
    return out


def loss(
    cfg: GPTConfig,
    params: Mapping[str, Tensor],
    idx: Tensor,
    targets: Tensor,
    logits_hook: Callable[[Tensor], Tensor] | None = None,
) -> Tensor:
    """The mean cross-entropy of next-token prediction over the batch: idx and targets (B, T) int64,
    params bf16 (name -> tensor). `logits_hook` (tests only) may change the logits before the loss."""
    B, T = idx.shape
    C, H, D = cfg.d_model, cfg.n_head, cfg.head_dim
    p = params
    x = torch.nn.functional.embedding(idx, p["wte"]) + p["wpe"][:T]  # (B, T, C)
    x = x.reshape(B * T, C)
    for i in range(cfg.n_layer):
        h = f"h.{i}."
        y, _, _ = ops.layer_norm(x, p[h + "ln_1.weight"], p[h + "ln_1.bias"], cfg.eps)
        qkv = ops.linear(y, p[h + "attn.c_attn.weight"], p[h + "attn.c_attn.bias"])  # (B T, 3C)
        # 3 x (B, H, T, D), each copied out of qkv seen as (B, T, 3, H, D): unbound before the copies,
        # so that the backward pass stacks their gradients straight into qkv's layout, in one copy
        q, k, v = (t.transpose(1, 2).contiguous() for t in qkv.view(B, T, 3, H, D).unbind(2))
        o, _ = ops.attention(q, k, v)  # (B, H, T, D)
        o = o.transpose(1, 2).reshape(B * T, C)
        x = x + ops.linear(o, p[h + "attn.c_proj.weight"], p[h + "attn.c_proj.bias"])
        y, _, _ = ops.layer_norm(x, p[h + "ln_2.weight"], p[h + "ln_2.bias"], cfg.eps)
        u = ops.linear(y, p[h + "mlp.c_fc.weight"], p[h + "mlp.c_fc.bias"])  # (B T, 4C), GELU's input
        mlp, _ = ops.gelu_linear(u, p[h + "mlp.c_proj.weight"], p[h + "mlp.c_proj.bias"])
        x = x + mlp
    y, _, _ = ops.layer_norm(x, p["ln_f.weight"], p["ln_f.bias"], cfg.eps)
    logits = ops.linear(y, p["wte"], None)  # (B T, V): the output layer is the token embedding
    if logits_hook is not None:
        logits = logits_hook(logits)
    value, _ = ops.cross_entropy(logits, targets.reshape(B * T))
    return value

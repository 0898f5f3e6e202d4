"""Lab 6 task 05 · tensor-parallel LLaMA: one rank's share of the weights, and the graph that runs it.

Implement: `shard_weights` (the refusal, the local configuration and the slices) and the body of
           one decoder layer in `build_tp_graph`, in the TODO regions. The chapter's sections
           "Splitting the weights" and "The tensor-parallel graph" explain them.
Contract:  `shard_weights(config, weights, rank, world)` returns (local_config, local_weights) for
           rank `rank` of `world`. It raises ValueError naming the field, its value and the world
           when n_heads, n_kv_heads or hidden_dim is not divisible by world. local_config is a
           ShardConfig (given, below): the config's fields with n_heads / world, n_kv_heads / world
           and hidden_dim / world, the same dim and head_dim, and rank and world. local_weights has
           the checkpoint's names (llama.checkpoint's list), each tensor contiguous:
               wq, wk, wv   column-parallel: the rows of the rank's heads. Rank r keeps query heads
                            r*H/W .. (r+1)*H/W - 1 and kv heads r*Hkv/W .. (r+1)*Hkv/W - 1, whole
                            heads of head_dim rows each, in the checkpoint's RoPE layout (either
                            layout keeps a head's rows together)
               w1, w3       column-parallel: rows r*F/W .. (r+1)*F/W - 1 of the hidden_dim F
               wo, w2       row-parallel: the columns that match (wo: the rank's query heads'
                            columns, w2: its hidden columns)
               the rest     replicated: the norms, tok_embeddings and output, the caller's tensors
                            themselves (a tied classifier stays the embedding's tensor).
           `build_tp_graph(local_config, local_weights, n_tokens=T, max_seq=S)` is lab 5's
           build_graph for one rank: the same inputs, constants and output (the logits F[T, V],
           every rank's the same), caches `layers.{i}.k_cache` / `v_cache` of F[S, Hkv/W, Dh] (the
           rank's kv heads only), and per layer exactly two all_reduce nodes: one on the attention's
           output projection and one on the MLP's down projection, each before its residual add:
               x = x + all_reduce(linear(attention(...) as (T, H/W * Dh), wo))
               x = x + all_reduce(linear(silu(linear(h, w1)) * linear(h, w3), w2))
Test:      make test-lab6 TASK=05
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

import torch

import kiln
from llama.checkpoint import check_weights
from llama.config import ConfigError, LlamaConfig
from llama.model import rope_inv_freq


@dataclass(frozen=True)
class ShardConfig(LlamaConfig):
    """One rank's share of a LlamaConfig (given): n_heads, n_kv_heads and hidden_dim are the rank's
    (the model's divided by world), dim is the model's. head_dim stays the model's: a head is never
    split, so it is dim / (n_heads * world), not dim / n_heads. Everything lab 5 derives from a
    config then describes the rank's share: llama.checkpoint.expected_shapes gives the local
    weights' shapes, kv_dim the width of the rank's keys."""

    rank: int = 0
    world: int = 1

    def __post_init__(self) -> None:
        if not (isinstance(self.world, int) and self.world >= 1 and 0 <= self.rank < self.world):
            raise ConfigError(f"rank {self.rank!r} of world {self.world!r}: need 0 <= rank < world")
        if self.dim % (self.n_heads * self.world):
            raise ConfigError(f"dim ({self.dim}) must be divisible by n_heads * world ({self.n_heads * self.world})")
        super().__post_init__()

    @property
    def head_dim(self) -> int:
        return self.dim // (self.n_heads * self.world)

    @classmethod
    def of(cls, config: LlamaConfig, *, rank: int, world: int, **local: int) -> ShardConfig:
        """config's fields with `local` replacing some (n_heads=..., ...), for rank of world."""
        values = {f.name: getattr(config, f.name) for f in fields(LlamaConfig)}
        return cls(**(values | local), rank=rank, world=world)


def shard_weights(
    config: LlamaConfig, weights: Mapping[str, torch.Tensor], rank: int, world: int
) -> tuple[ShardConfig, dict[str, torch.Tensor]]:
    """Rank `rank`'s configuration and weights (see the header)."""
    check_weights(config, weights)
    # TODO(lab6/05) begin: refusal, local config, slices (~20 lines); see the chapter's section "Splitting the weights"
    for field in ("n_heads", "n_kv_heads", "hidden_dim"):
        value = getattr(config, field)
        if value % world:
            raise ValueError(f"{field} = {value} is not divisible by world = {world}: no equal share per rank")
    local = ShardConfig.of(
        config,
        rank=rank,
        world=world,
        n_heads=config.n_heads // world,
        n_kv_heads=config.n_kv_heads // world,
        hidden_dim=config.hidden_dim // world,
    )
    dh = config.head_dim

    def share(n: int) -> slice:
        """The rank's block of n: rows (or columns) rank*n .. (rank+1)*n - 1."""
        return slice(rank * n, (rank + 1) * n)

    # the rank's query heads r*H/W.. map onto kv heads r*Hkv/W..: head h reads kv head h // (H/Hkv),
    # and H/W is a whole number of groups because Hkv is divisible by W
    q, kv, f = share(local.n_heads * dh), share(local.n_kv_heads * dh), share(local.hidden_dim)
    out = dict(weights)  # the replicated tensors as they are: a tied classifier stays one tensor
    for i in range(config.n_layers):
        p = f"layers.{i}."
        for key, rows in (("wq", q), ("wk", kv), ("wv", kv), ("w1", f), ("w3", f)):
            out[p + key] = weights[p + key][rows].contiguous()  # (rows of the rank, dim)
        out[p + "wo"] = weights[p + "wo"][:, q].contiguous()  # (dim, the rank's H/W * Dh)
        out[p + "w2"] = weights[p + "w2"][:, f].contiguous()  # (dim, F/W)
    return local, out
    # ~ raise NotImplementedError("lab6/05: shard_weights")
    # TODO(lab6/05) end


def build_tp_graph(
    config: ShardConfig,
    weights: Mapping[str, torch.Tensor],
    *,
    n_tokens: int,
    max_seq: int,
    name: str = "llama_tp",
) -> kiln.Graph:
    """One rank's model for runs of `n_tokens` tokens over its share of a KV cache of `max_seq` rows."""
    check_weights(config, weights)  # the local shapes: ShardConfig's expected_shapes
    if not 1 <= n_tokens <= max_seq:
        raise ValueError(f"n_tokens {n_tokens} must be in 1..max_seq ({max_seq})")
    b = kiln.Builder(name)
    tokens = b.input("tokens", (n_tokens,), "int64")
    pos = b.input("pos", (1,), "int64")
    inv_freq = b.constant("rope.inv_freq", rope_inv_freq(config))  # head_dim is the model's
    made: dict[int, kiln.Tensor] = {}  # id(weight tensor) -> its constant (a tied classifier: one)

    def w(key: str) -> kiln.Tensor:
        if id(weights[key]) not in made:
            made[id(weights[key])] = b.constant(key, weights[key])
        return made[id(weights[key])]

    def rmsnorm(x: kiln.Tensor, key: str) -> kiln.Tensor:
        return b.op("rmsnorm", x, w(key), eps=config.norm_eps)

    def linear(x: kiln.Tensor, key: str) -> kiln.Tensor:
        return b.op("linear", x, w(key))

    def rope(x: kiln.Tensor) -> kiln.Tensor:
        return b.op("rope", x, pos, inv_freq, layout=config.rope_layout)

    def all_reduce(x: kiln.Tensor) -> kiln.Tensor:
        return b.op("all_reduce", x, op="sum")

    x = b.op("embedding", w("tok_embeddings"), tokens)  # (T, D), every rank the same
    # TODO(lab6/05) begin: the layers, two all-reduces each (18 lines); see "The tensor-parallel graph"
    t, h, hkv, dh = n_tokens, config.n_heads, config.n_kv_heads, config.head_dim  # h, hkv: the rank's
    for i in range(config.n_layers):
        p = f"layers.{i}."
        k_cache = b.buffer(p + "k_cache", (max_seq, hkv, dh), config.dtype)  # (S, Hkv/W, Dh)
        v_cache = b.buffer(p + "v_cache", (max_seq, hkv, dh), config.dtype)
        hn = rmsnorm(x, p + "attention_norm")  # (T, D), replicated
        q = rope(linear(hn, p + "wq").reshape(t, h, dh))  # (T, H/W, Dh)
        k = rope(linear(hn, p + "wk").reshape(t, hkv, dh))  # (T, Hkv/W, Dh)
        v = linear(hn, p + "wv").reshape(t, hkv, dh)
        kc = b.op("kv_update", k_cache, k, pos)
        vc = b.op("kv_update", v_cache, v, pos)
        a = b.op("attention", q, kc, vc, pos, scale=dh**-0.5).reshape(t, h * dh)  # (T, H/W * Dh)
        # wo's columns are the rank's heads: a partial sum of the projection, completed across ranks
        x = x + all_reduce(linear(a, p + "wo"))  # (T, D), replicated again
        hn = rmsnorm(x, p + "ffn_norm")
        g = linear(hn, p + "w1").silu() * linear(hn, p + "w3")  # (T, F/W): SwiGLU is per column
        x = x + all_reduce(linear(g, p + "w2"))
    # ~ raise NotImplementedError("lab6/05: the tensor-parallel layers")
    # TODO(lab6/05) end
    logits = linear(rmsnorm(x, "norm"), "output")  # (T, V): the replicated classifier
    return b.output(logits)

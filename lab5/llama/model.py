"""Lab 5 task 05 · the LLaMA graph: a whole model in kiln's IR, and the prefill/decode loop around it.

Implement: the body of one decoder layer in `build_graph`, and `LlamaModel.prefill` / `decode`
           (which executor runs, what it is fed, how the position advances), in the TODO regions.
           The chapter's sections "The LLaMA graph" and "Prefill and decode" explain them.
Contract:  `build_graph(config, weights, n_tokens=T, max_seq=S)` is a kiln.Graph of batch 1 with
           inputs `tokens` i64[T] and `pos` i64[1] (the cache rows already filled: the absolute
           position of token 0), one buffer `layers.{i}.k_cache` / `layers.{i}.v_cache` per layer
           of F[S, Hkv, Dh], the checkpoint's weights as constants under their names (plus
           `rope.inv_freq`, f32[Dh/2], as Hugging Face computes it) and one output, the logits
           F[T, V] of every position. One layer is
               h = rmsnorm(x, attention_norm)                    # (T, D)
               q = rope(linear(h, wq) as (T, H, Dh)); k = rope(linear(h, wk) as (T, Hkv, Dh))
               v = linear(h, wv) as (T, Hkv, Dh)
               kc, vc = kv_update(k_cache, k, pos), kv_update(v_cache, v, pos)
               x = x + linear(attention(q, kc, vc, pos) as (T, H * Dh), wo)
               h = rmsnorm(x, ffn_norm)
               x = x + linear(silu(linear(h, w1)) * linear(h, w3), w2)
           `LlamaModel` compiles the one-token (decode) graph first; it owns the weights and the
           caches, and the graph of each prompt length, compiled when first needed, shares them.
           `prefill(tokens)` runs the prompt from `pos` and returns float32 logits [T, V] on the
           CPU (`last=True`: [V] of the last position); `decode(token)` runs one token and
           returns float32 logits [V]; both advance `pos` and refuse to run past max_seq.
           `reset()` starts a new sequence (pos = 0).
Test:      make test-lab5 TASK=05
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

import kiln
import kiln_llm
from llama.checkpoint import check_weights
from llama.config import LlamaConfig


class ContextFullError(ValueError):
    """A run that would write past the KV cache's last row (pos + T > max_seq)."""


def rope_inv_freq(config: LlamaConfig) -> torch.Tensor:
    """RoPE's head_dim/2 frequencies in float32, computed as Hugging Face computes them (torch, fp32):
    config.inv_freq() works in float64, and its rounding to fp32 can differ in the last bit, which
    at position 2000 turns a pair by a different 1e-4 rad."""
    dh = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dh, 2, dtype=torch.int64).float() / dh))
    s = config.rope_scaling
    if s is None:
        return inv_freq
    # Llama 3.1's scaling, as transformers' _compute_llama3_parameters (the same float32 steps)
    old = s.original_max_position_embeddings
    low_wavelen, high_wavelen = old / s.low_freq_factor, old / s.high_freq_factor
    wavelen = 2 * torch.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (old / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def build_graph(
    config: LlamaConfig, weights: Mapping[str, torch.Tensor], *, n_tokens: int, max_seq: int, name: str = "llama"
) -> kiln.Graph:
    """The model for runs of `n_tokens` tokens over a KV cache of `max_seq` rows (see the header)."""
    check_weights(config, weights)
    if not 1 <= n_tokens <= max_seq:
        raise ValueError(f"n_tokens {n_tokens} must be in 1..max_seq ({max_seq})")
    b = kiln.Builder(name)
    tokens = b.input("tokens", (n_tokens,), "int64")
    pos = b.input("pos", (1,), "int64")
    inv_freq = b.constant("rope.inv_freq", rope_inv_freq(config))
    made: dict[int, kiln.Tensor] = {}  # id(weight tensor) -> its constant

    def w(key: str) -> kiln.Tensor:
        """The constant of checkpoint tensor `key`. One tensor under two names (tied embeddings:
        `output` is `tok_embeddings`) becomes one constant, so a device holds it once."""
        if id(weights[key]) not in made:
            made[id(weights[key])] = b.constant(key, weights[key])
        return made[id(weights[key])]

    def rmsnorm(x: kiln.Tensor, key: str) -> kiln.Tensor:
        return b.op("rmsnorm", x, w(key), eps=config.norm_eps)

    def linear(x: kiln.Tensor, key: str) -> kiln.Tensor:
        return b.op("linear", x, w(key))

    def rope(x: kiln.Tensor) -> kiln.Tensor:
        return b.op("rope", x, pos, inv_freq, layout=config.rope_layout)

    x = b.op("embedding", w("tok_embeddings"), tokens)  # (T, D)
    # TODO(lab5/05) begin: the layers and their caches, as the header writes them (16 lines); see "The LLaMA graph"
    raise NotImplementedError("lab5/05: the decoder layers")  # ~
    # TODO(lab5/05) end
    logits = linear(rmsnorm(x, "norm"), "output")  # (T, V)
    return b.output(logits)


def _buffers(executor: Any) -> dict[str, torch.Tensor]:
    """An executor's persistent state by name: the KV caches (CPUExecutor keeps them by name,
    CudaExecutor by node)."""
    if isinstance(getattr(executor, "buffers", None), dict):
        return executor.buffers
    return {n.attrs["name"]: executor.tensors[n] for n in executor.graph.buffers}


def _shapes_only(weights: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The same names, shapes and dtypes on the meta device (no memory); one tensor under two
    names (tied embeddings) stays one tensor."""
    out: dict[int, torch.Tensor] = {}
    for t in weights.values():
        out.setdefault(id(t), torch.empty(t.shape, dtype=t.dtype, device="meta"))
    return {k: out[id(t)] for k, t in weights.items()}


# The share of a decode step's launches the first of its two CUDA graphs holds (given code, StepGraphs).
HEAD_SHARE = 16


@dataclass
class StepGraphs:
    """A decode step as two CUDA graphs that hold its copies too (given): `head` copies the token
    and pos in from pinned `ids` and runs the first 1/HEAD_SHARE of the launches, `tail` the rest,
    then copies the logits out into pinned `row`. A step is then two graph launches and nothing else.
    Why not run()'s or replay()'s way: each copy queued from Python costs tens of microseconds of
    host time while the GPU idles, and so does a graph launch, about a quarter of a microsecond per
    node; with two graphs the GPU runs the short head while the host launches the long tail."""

    ids: torch.Tensor  # pinned i64[2]: the token, then pos
    row: torch.Tensor  # pinned F[V]: the step's logits, in the model's dtype
    head: torch.cuda.CUDAGraph
    tail: torch.cuda.CUDAGraph

    @classmethod
    def capture(cls, executor: Any) -> StepGraphs:
        """The graphs of a one-token CUDA executor whose own graph is captured (its kernels are
        loaded and its launches checked)."""
        from kiln.cuda import collection_paused, error_string
        from kiln.runtime import KilnRunError

        ids = torch.zeros(2, dtype=torch.int64, pin_memory=True)
        out = executor.output_slot()  # (1, V)
        row = torch.empty(out.shape[-1], dtype=out.dtype, pin_memory=True)
        launches = executor.launches
        split = max(1, len(launches) // HEAD_SHARE)
        graphs = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        failed = None
        with collection_paused():  # as in the executor's own capture
            for graph, part, first in ((graphs[0], launches[:split], True), (graphs[1], launches[split:], False)):
                with torch.cuda.graph(graph, stream=executor.stream):
                    if first:
                        executor.input_slot("tokens").copy_(ids[:1], non_blocking=True)
                        executor.input_slot("pos").copy_(ids[1:], non_blocking=True)
                    for node, launch in part:
                        rc = launch()
                        if rc != 0:  # end the capture first, then say which launch failed
                            failed = f"%{node.name} ({node.op}) while capturing a decode step: {error_string(rc)}"
                            break
                    if not first:
                        row.copy_(out[-1], non_blocking=True)
                if failed is not None:
                    break
        if failed is not None:
            raise KilnRunError(failed)
        return cls(ids, row, *graphs)

    def replay(self, stream: torch.cuda.Stream, token: int, pos: int) -> torch.Tensor:
        """One step: float32 logits [V] on the CPU."""
        self.ids.numpy()[:] = (token, pos)  # read by the head's copy when the GPU runs it
        with torch.cuda.stream(stream):
            self.head.replay()
            self.tail.replay()
        stream.synchronize()
        return self.row.to(torch.float32, copy=True)  # a copy: the next step rewrites the row


class LlamaModel:
    """A LLaMA checkpoint compiled by kiln: prefill a prompt, then decode one token at a time.

    `pos` is the number of positions already in the KV cache: the next token sits there. On the GPU
    a model the CUDA kernels cannot run (config.cuda_limits(): a head_dim past 256, say) is refused
    with a ConfigError that names it, before anything is compiled.
    """

    def __init__(
        self,
        config: LlamaConfig,
        weights: Mapping[str, torch.Tensor],
        *,
        device: str = "cpu",
        max_seq: int | None = None,
        fuse: bool = True,
        use_graph: bool = True,
    ) -> None:
        check_weights(config, weights)
        if device != "cpu":
            config.check_cuda()
        self.config = config
        self.weights = dict(weights)
        self.device = device
        self.max_seq = config.max_seq_len if max_seq is None else max_seq
        if self.max_seq < 1:
            raise ValueError(f"max_seq must be positive, got {self.max_seq}")
        self.fuse, self.use_graph = fuse, use_graph
        self.pos = 0
        # pinned host memory a GPU run of T tokens copies through, made once per T: (ids i64[T + 1]
        # for the tokens and pos, the last row of logits F[V])
        self.staging: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.step: StepGraphs | None = None  # the decode step's graphs, captured on first use (GPU)
        # the decode executor comes first and owns the weights and caches; every prefill
        # executor (one per prompt length, made when first needed) uses them in place
        self.decoder = self._compile(1)
        self.prefillers: dict[int, Any] = {1: self.decoder}
        # the decoder holds the weights now; later graphs take them from it and need only their
        # shapes and dtypes, so the caller's copies (13 GB for a 7B model) can be freed
        self.weights = _shapes_only(self.weights)

    def _compile(self, n_tokens: int, share_with: Any = None) -> Any:
        graph = build_graph(
            self.config, self.weights, n_tokens=n_tokens, max_seq=self.max_seq, name=f"llama_t{n_tokens}"
        )
        return kiln_llm.compile(graph, self.device, fuse=self.fuse, use_graph=self.use_graph, share_with=share_with)

    def _prefiller(self, n_tokens: int) -> Any:
        """The executor for prompts of n_tokens, compiled on first use."""
        if n_tokens not in self.prefillers:
            self.prefillers[n_tokens] = self._compile(n_tokens, share_with=self.decoder)
        return self.prefillers[n_tokens]

    def _check(self, tokens: Sequence[int]) -> list[int]:
        tokens = [int(x) for x in tokens]
        if not tokens:
            raise ValueError("no tokens to run")
        bad = [x for x in tokens if not 0 <= x < self.config.vocab_size]
        if bad:
            raise ValueError(f"token {bad[0]} is outside the vocabulary [0, {self.config.vocab_size})")
        if self.pos + len(tokens) > self.max_seq:
            raise ContextFullError(
                f"{len(tokens)} token(s) at position {self.pos} need {self.pos + len(tokens)} cache rows; "
                f"max_seq is {self.max_seq} (reset() starts a new sequence)"
            )
        return tokens

    def _run(self, executor: Any, tokens: list[int], last: bool) -> torch.Tensor:
        """Runs `tokens` (checked) from self.pos on `executor` and advances self.pos: float32
        logits (T, V) on the CPU, or (V,) of the last position only when `last`."""
        # TODO(lab5/05) begin: feed tokens and pos, run, advance pos; GPU: self.step, the slots, self.staging (30 lines)
        raise NotImplementedError("lab5/05: run tokens from pos")  # ~
        # TODO(lab5/05) end

    def prefill(self, tokens: Sequence[int], *, last: bool = False) -> torch.Tensor:
        """Runs a prompt (or any chunk of tokens) from `pos`: float32 logits [T, V], or [V] of
        the last position (the one that predicts the next token) when `last`."""
        tokens = self._check(tokens)
        # TODO(lab5/05) begin: the executor for this many tokens, which shares the decoder's state (1 line)
        raise NotImplementedError("lab5/05: prefill")  # ~
        # TODO(lab5/05) end

    def decode(self, token: int) -> torch.Tensor:
        """Runs one token at `pos`: float32 logits [V]."""
        token = self._check([token])[0]
        # TODO(lab5/05) begin: the one-token executor (1 line)
        raise NotImplementedError("lab5/05: decode")  # ~
        # TODO(lab5/05) end

    def reset(self) -> None:
        """A new sequence: position 0. The caches keep their rows; attention never reads past
        the filled prefix, so the next run overwrites them before any read."""
        self.pos = 0

    def memory_bytes(self) -> int:
        """Bytes the executors hold: on the GPU each arena (the decode executor's holds the weights
        and caches, a prefill executor's only its activations); on the CPU the weights and caches
        (activations live only during a run). Memory shared by two executors counts once."""
        storages: dict[int, int] = {}
        for ex in self.prefillers.values():
            arena = getattr(ex, "arena", None)
            held = [arena] if arena is not None else [*ex.constants.values(), *ex.buffers.values()]
            for t in held:
                s = t.untyped_storage()
                storages[s.data_ptr()] = s.nbytes()
        return sum(storages.values())

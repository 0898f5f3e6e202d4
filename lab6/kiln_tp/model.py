"""Tensor-parallel LLaMA on the ranks of a process group: lab 5's model and generation loop on one
rank's share (given code).

    local_config, local_weights = shard_weights(config, weights, rank, world)   # task 05
    model = TPLlamaModel(local_config, local_weights)        # lab 5's LlamaModel, build_tp_graph's graphs
    decode_loop(model, prompt, RankZeroSampler(Sampler()), max_new_tokens=16, eos_id=None)

On the GPU (device="cuda", ranks started by launch(..., device="cuda")) each rank's model is lab 5's
CUDA model on its own GPU: the same executors, the same decode step captured in CUDA graphs, with
the all_reduce nodes lowered to NCCL (task 4, kiln_tp/cuda.py).

Every rank runs the same calls in the same order: each prefill and decode runs the rank's graph,
whose all-reduces meet the other ranks'. So every rank must also feed the same next token.

Why rank 0's token is broadcast rather than each rank taking its own arg-max: the ranks' logits are
the same only if every rank's all-reduce returns the same bits. Gloo's and NCCL's ring algorithms
happen to (each sum is made on one rank and copied to the others), but an all-reduce is only
promised to return the sum, to rounding: a one-shot all-reduce in which each GPU adds its peers'
buffers in its own order (task 3) gives each rank a sum rounded its own way. At a near tie two
ranks would then pick different tokens, and from that step on each rank's KV cache holds another
conversation: the all-reduces go on adding partial products of different texts, and nothing fails,
the output is just wrong. A sampler with a temperature would need every rank's random generator in
the same state too. Broadcasting rank 0's choice costs one 8-byte collective per token, beside the
2 * n_layers all-reduces of dim floats each a step already makes, and makes the ranks agree by
construction.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

import kiln_llm
from kiln_tp.shard import ShardConfig, build_tp_graph, shard_weights
from llama.config import LlamaConfig
from llama.generate import Sampler, decode_loop
from llama.model import LlamaModel


class TPLlamaModel(LlamaModel):
    """lab 5's LlamaModel on one rank's share: the same prefill, decode, reset and pos, each graph
    built by build_tp_graph. device="cpu" runs lab 4's CPU executor (the all-reduce through gloo);
    device="cuda" lab 5's CUDA executors on the rank's GPU (the all-reduce through NCCL, task 4),
    which needs the ranks started by launch(..., device="cuda")."""

    def __init__(self, config: ShardConfig, weights: Mapping[str, torch.Tensor], **options: Any) -> None:
        if not isinstance(config, ShardConfig):
            raise TypeError(f"TPLlamaModel takes one rank's ShardConfig (shard_weights'), not {type(config).__name__}")
        super().__init__(config, weights, **options)

    def _compile(self, n_tokens: int, share_with: Any = None) -> Any:
        graph = build_tp_graph(
            self.config, self.weights, n_tokens=n_tokens, max_seq=self.max_seq, name=f"llama_tp_t{n_tokens}"
        )
        return kiln_llm.compile(graph, self.device, fuse=self.fuse, use_graph=self.use_graph, share_with=share_with)

    def cache_shapes(self) -> dict[str, tuple[int, ...]]:
        """The rank's KV caches by name, with their shapes (the CPU executor keeps them by name, the
        CUDA executor as buffer nodes of its graph)."""
        held = getattr(self.decoder, "buffers", None)
        if isinstance(held, dict):
            return {name: tuple(t.shape) for name, t in held.items()}
        return {n.attrs["name"]: tuple(n.type.shape) for n in self.decoder.graph.buffers}


class RankZeroSampler:
    """Rank 0's sampler's choice, broadcast to every rank (see the header for why). The token is a
    CPU tensor, so it goes through gloo also when the model runs on GPUs (launch's
    "cpu:gloo,cuda:nccl" group): the logits are on the host already, and nothing waits on a GPU."""

    def __init__(self, sampler: Callable[[torch.Tensor], int]) -> None:
        self.sampler = sampler

    def __call__(self, logits: torch.Tensor) -> int:
        token = torch.zeros(1, dtype=torch.int64)
        if dist.get_rank() == 0:
            token[0] = self.sampler(logits)
        dist.broadcast(token, src=0)
        return int(token)


class _Recorded:
    """A model whose every prefill and decode result is kept (for the checks)."""

    def __init__(self, model: LlamaModel) -> None:
        self.model = model
        self.rows: list[torch.Tensor] = []

    def prefill(self, tokens: Sequence[int], *, last: bool = False) -> torch.Tensor:
        self.rows.append(self.model.prefill(tokens, last=last))
        return self.rows[-1]

    def decode(self, token: int) -> torch.Tensor:
        self.rows.append(self.model.decode(token))
        return self.rows[-1]


def greedy(
    rank: int,
    world: int,
    config: LlamaConfig,
    weights: Mapping[str, torch.Tensor],
    prompt: Sequence[int],
    steps: int,
    max_seq: int,
    device: str = "cpu",
) -> dict[str, Any]:
    """On one rank of a launch: the whole model sharded for this rank, the prompt's logits [T, V],
    then `steps` greedy tokens by lab 5's decode_loop with rank 0's token broadcast, on `device`
    (the launch's). Returns the logits of the prompt ("prefill") and of each decode step ("steps"),
    the tokens, the rank's cache shapes, and "spread": the largest difference between any rank's
    logits and rank 0's (all of them float32 on the CPU)."""
    local_config, local_weights = shard_weights(config, weights, rank, world)
    model = TPLlamaModel(local_config, local_weights, max_seq=max_seq, device=device)
    prefill = model.prefill(prompt)  # (T, V)
    model.reset()
    recorded = _Recorded(model)
    loop = decode_loop(recorded, prompt, RankZeroSampler(Sampler(temperature=0.0)), max_new_tokens=steps, eos_id=None)
    steps_logits = torch.stack(recorded.rows[1:]) if len(recorded.rows) > 1 else torch.empty(0)
    mine = torch.cat([prefill.reshape(-1), steps_logits.reshape(-1)])
    theirs = mine.clone()
    dist.broadcast(theirs, src=0)
    spread = (mine - theirs).abs().max().reshape(1)
    dist.all_reduce(spread, op=dist.ReduceOp.MAX)
    return {
        "prefill": prefill,
        "steps": steps_logits,
        "tokens": loop.tokens,
        "caches": model.cache_shapes(),
        "spread": float(spread),
        "captured": model.step is not None,  # on the GPU: the decode steps replayed lab 5's step graphs
    }


def greedy_cases(
    rank: int,
    world: int,
    path: str,
    cases: Sequence[str],
    prompt: Sequence[int],
    steps: int,
    device: str = "cpu",
) -> dict:
    """greedy() for several models in one launch (a launch costs seconds of process start-up): the
    file at `path` holds {case: (config, weights)} (torch.save)."""
    models = torch.load(path, weights_only=False)
    out = {}
    for c in cases:
        out[c] = greedy(rank, world, *models[c], prompt, steps, max_seq=len(prompt) + steps, device=device)
        gc.collect()  # the case's executors (reference cycles) and their GPU memory, before the next
    return out


# --- for the checks of task 04: one all_reduce node, compiled alone --------------------------------

LATE_S = 0.2  # how long the last rank sleeps before run 1: far longer than any launch takes to run


def reduce_input(rank: int, run: int, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """Rank `rank`'s input to run `run` of all_reduce_runs: whole numbers from -8 to 8 (on the CPU),
    whose sums over a few ranks are exact in float32, float16 and bfloat16 alike."""
    g = torch.Generator().manual_seed(1000 * run + rank)
    return torch.randint(-8, 9, tuple(shape), generator=g).to(dtype)


def all_reduce_runs(
    rank: int,
    world: int,
    shapes: Sequence[Sequence[int]],
    dtypes: Sequence[str],
    runs: int,
    device: str = "cuda",
) -> dict[str, Any]:
    """On one rank of a launch, for each shape, dtype and use_graph (True, then False), the graph

        y = all_reduce(x);  z = y + x          (outputs y and z)

    compiled by kiln_llm for `device` and run `runs` times on reduce_input(rank, run, ...); before
    run 1 the last rank sleeps LATE_S on the host. Returns
    {"results": {(shape, dtype, use_graph): [(y, z) of each run, on the CPU]}, "nccl_calls": how
    many times torch.distributed.all_reduce was called meanwhile (by the lowerings' launches: in the
    captures and the plain runs; a replay calls nothing)}."""
    import kiln

    calls = [0]
    plain = dist.all_reduce

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return plain(*args, **kwargs)

    results: dict[tuple, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    dist.all_reduce = counted
    try:
        for shape in shapes:
            for name in dtypes:
                dtype = getattr(torch, name)
                for use_graph in (True, False):
                    b = kiln.Builder("one_all_reduce")
                    x = b.input("x", tuple(shape), name)
                    y = b.op("all_reduce", x, op="sum")
                    ex = kiln_llm.compile(b.output(y, y + x), device, use_graph=use_graph)
                    runs_out = []
                    for run in range(runs):
                        fed = reduce_input(rank, run, shape, dtype).to(device)
                        if run == 1 and rank == world - 1 and world > 1:
                            # the last rank late: the others' reductions wait for it, and so must
                            # every launch queued after theirs (one not made to wait runs now)
                            time.sleep(LATE_S)
                        got_y, got_z = ex.run({"x": fed})
                        runs_out.append((got_y.cpu(), got_z.cpu()))
                    results[(tuple(shape), name, use_graph)] = runs_out
                    del ex
                    gc.collect()
    finally:
        dist.all_reduce = plain
    return {"results": results, "nccl_calls": calls[0]}

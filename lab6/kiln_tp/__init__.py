"""kiln_tp: lab 6's tensor parallelism for lab 5's LLaMA, on top of lab 4's compiler kiln.

    from kiln_tp import launch, shard_weights, TPLlamaModel
    result = launch(2, my_rank_function, *args)                 # 2 processes, gloo, rank 0's return value
    result = launch(2, my_rank_function, *args, device="cuda")  # on GPUs 0 and 1, NCCL for CUDA tensors

Lab 6 adds to kiln the way lab 5 did, through its registries: one operator, `all_reduce`, with its
CPU kernel (ops.py) and its CUDA lowering (cuda.py). The modules:

    ops.py      the all_reduce operator: its type and its CPU kernel over torch.distributed (given)
    cuda.py     all_reduce's CUDA lowering: NCCL on the executor's stream, captured with the step (task 04)
    shard.py    one rank's share of a checkpoint, and the graph that runs it (task 05)
    model.py    TPLlamaModel (lab 5's LlamaModel on one rank's share) and greedy generation
                over the ranks, rank 0's token broadcast (given)
    launch.py   `launch`: world processes, one process group, rank 0's result, a failing rank named (given)
    ipc.py      tasks 02 and 03's libraries from Python: CUDA IPC buffers, their checks and timings (given)
    own_all_reduce.py  all_reduce lowered to tasks 02 and 03's libraries instead of NCCL (given)
    generate.py `make generate GPUS=N`: lab 5's generation on N ranks, rank 0's text (given)

kiln is lab 4's package and kiln_llm and llama are lab 5's: the grader stages all three beside
kiln_tp; run from lab6/ directly, the sibling labs' folders are put on sys.path.
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    import kiln_llm  # noqa: F401 (the grader and the scripts stage lab 4's and lab 5's packages first)
    import llama  # noqa: F401
except ImportError:  # run from lab6/ directly: the sibling labs' folders
    _ROOT = Path(__file__).resolve().parents[2]
    sys.path += [str(_ROOT / "lab4"), str(_ROOT / "lab5")]

from kiln_tp import cuda, ops  # noqa: F401 (register all_reduce, its CPU kernel and its CUDA lowering)
from kiln_tp.launch import LaunchError, launch
from kiln_tp.model import RankZeroSampler, TPLlamaModel
from kiln_tp.shard import ShardConfig, build_tp_graph, shard_weights

__all__ = [
    "LaunchError",
    "RankZeroSampler",
    "ShardConfig",
    "TPLlamaModel",
    "build_tp_graph",
    "launch",
    "shard_weights",
]

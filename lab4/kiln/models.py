"""Small models built with kiln's Builder, shared by the lab's tests, lab4/bench_graph.py and the
notebook (given code). Each one stresses one thing: reads shared by many nodes, a buffer written
at run-time offsets, or a long chain of small launches."""

from __future__ import annotations

import torch

from kiln.frontend import Builder
from kiln.ir import Graph


def fibonacci(levels: int) -> Graph:
    """t[i] = t[i-1] + t[i-2] over two inputs a, b (8,): every node is read twice, by the next two."""
    b = Builder("fib")
    prev, cur = b.input("a", (8,), "float32"), b.input("b", (8,), "float32")
    for _ in range(levels):
        prev, cur = cur, prev + cur
    b.output(cur)
    return b.graph


def kv_cache(scale: float | None = None) -> Graph:
    """A (4, 6, 3) buffer `cache`: input v (1, 2, 3), times `scale` when given, is written at the
    run-time offsets `pos` (3,) int64; the output is the whole cache."""
    b = Builder("cache")
    cache = b.buffer("cache", (4, 6, 3), "float32")
    v = b.input("v", (1, 2, 3), "float32")
    pos = b.input("pos", (3,), "int64")
    b.output(cache.slice_update(v if scale is None else v * scale, pos))
    return b.graph


def chain(nodes: int, shape: tuple[int, int] = (4, 64)) -> Graph:
    """`nodes` pointwise nodes (a multiple of 5) on x of `shape`: every 4 steps * scale, + shift,
    silu, relu + x (the skip is 2 nodes). Small tensors: the time is in the launches."""
    if nodes % 5:
        raise ValueError(f"chain: nodes must be a multiple of 5, not {nodes}")
    g = torch.Generator().manual_seed(0)
    b = Builder("chain")
    x = b.input("x", shape, "float32")
    scale = b.constant("scale", torch.randn(shape[1], generator=g) * 0.1 + 1.0)  # (C,)
    shift = b.constant("shift", torch.randn(shape[0], 1, generator=g) * 0.1)  # (B, 1)
    t = x
    for i in range(nodes * 4 // 5):
        kind = i % 4
        t = t * scale if kind == 0 else t + shift if kind == 1 else t.silu() if kind == 2 else t.relu() + x
    b.output(t)
    return b.graph


def adds(nodes: int, shape: tuple[int, int] = (4, 64)) -> Graph:
    """`nodes` small adds in a chain: t = t + x."""
    b = Builder("adds")
    x = b.input("x", shape, "float32")
    t = x
    for _ in range(nodes):
        t = t + x
    b.output(t)
    return b.graph

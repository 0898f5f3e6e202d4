"""The CUDA lowerings of lab 5's operators, and the kernels they launch (given code).

Importing this module registers, with lab 4's `kiln.cuda.register_cuda`, one lowering per
operator of kiln_llm/ops.py except `fused` (codegen.py lowers that one): embedding, rmsnorm, rope,
kv_update, attention, rope_kv_update, attention_rope, attention_append, attention_append_qkv (task
02's kernels, kernels/llama.cu) and linear, linear_add, linear_swiglu, rmsnorm_linear,
rmsnorm_linear_swiglu, rmsnorm_linear_qkv (task 03's, kernels/linear.cu). Every kernel exists for
f32, f16 and bf16; the node's dtype picks the symbol (kiln_rmsnorm_f16 for an f16 node). The entry
points and their contracts are in kernels/llm_kernels.h.

The lowerings follow lab 4's rules (lab4/kiln/cuda.py): a lowering runs once, when the executor is
built, and fixes every pointer (into the executor's arena) and every size; the launch it returns
only calls the kernel on the executor's stream and returns the cudaError_t. What changes from run
to run, the position `pos` and the token ids, are DEVICE tensors of the arena (the graph's inputs)
that the kernels read when they run, so a captured CUDA graph replays with the new values.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Any

from kiln.cuda import CudaExecutor, Launch, build_kernels, ptr, register_cuda
from kiln.ir import Node
from kiln.runtime import KilnRunError

KERNELS = Path(__file__).parent / "kernels"
SUFFIXES = ("f32", "f16", "bf16")
LAYOUTS = {"half": 0, "interleaved": 1}  # kiln_rope's layout argument
EPILOGUES = {"linear": 0, "linear_add": 1, "linear_swiglu": 2}  # kiln_linear's epilogue argument
HEAD_DIMS = (8, 256)  # the attention kernels take every even head dim in this range (llm_kernels.h)

_P = ctypes.c_void_p
_I64 = ctypes.c_int64
_F32 = ctypes.c_float
_INT = ctypes.c_int
# the entry points of kernels/llm_kernels.h without their suffix: (argtypes), each returns cudaError_t
_ARGTYPES: dict[str, list[Any]] = {
    "kiln_embedding": [_P, _P, _P, _I64, _I64, _I64, _P],
    "kiln_rmsnorm": [_P, _P, _P, _I64, _I64, _F32, _P],
    "kiln_rope": [_P, _P, _P, _P, _I64, _I64, _I64, _INT, _P],
    "kiln_kv_update": [_P, _P, _P, _I64, _I64, _I64, _P],
    "kiln_attention": [_P, _P, _P, _P, _P, _I64, _I64, _I64, _I64, _I64, _F32, _P],
    "kiln_rope_kv_update": [_P, _P, _P, _P, _I64, _I64, _I64, _I64, _INT, _P],
    "kiln_attention_rope": [_P, _P, _P, _P, _P, _P, _INT, _I64, _I64, _I64, _I64, _I64, _F32, _P],
    "kiln_attention_append": [_P, _P, _P, _P, _P, _P, _P, _P, _INT, _I64, _I64, _I64, _I64, _I64, _F32, _P],
    "kiln_linear": [_INT, _P, _P, _P, _P, _I64, _I64, _I64, _P],
    "kiln_rmsnorm_linear": [_INT, _P, _P, _P, _F32, _P, _P, _I64, _I64, _I64, _P],
    "kiln_rmsnorm_linear_qkv": [_P, _P, _P, _F32, _P, _P, _P, _I64, _I64, _I64, _I64, _I64, _P],
}
SIGNATURES: dict[str, list[Any]] = {f"{name}_{s}": args for name, args in _ARGTYPES.items() for s in SUFFIXES}


@functools.cache
def load_kernels() -> ctypes.CDLL:
    """Every kiln_llm/kernels/*.cu built into one shared library (lab 4's builder: the grader's
    cached nvcc build), each entry point of SIGNATURES checked and declared.

    Unlike lab 4's three small files, each of these instantiates every kernel for three dtypes and
    several head dims (llama.cu 48 kernels, linear.cu 183): nvcc takes a minute or more over one
    of them on one core, so they are built with split compilation, every core working on each."""
    return build_kernels(
        KERNELS,
        name="kiln_llm's kernels",
        group="lab5",
        stem="llm_kernels",
        signatures=SIGNATURES,
        split_compile=True,
    )


def kernel(name: str, node: Node) -> Any:
    """The entry point `name` for the node's dtype: kernel("kiln_rmsnorm", node) -> kiln_rmsnorm_f16,
    from lab 5's library (loaded once per process; lab 4's ex.lib holds lab 4's kernels)."""
    suffix = node.type.dtype.short
    if suffix not in SUFFIXES:
        raise KilnRunError(f"%{node.name} ({node.op}) is {node.type}: lab 5's kernels take f32, f16 or bf16")
    return getattr(load_kernels(), f"{name}_{suffix}")


def _tensors(ex: CudaExecutor, node: Node) -> list[ctypes.c_void_p]:
    """The node's output, then its inputs, as device pointers into the arena."""
    return [ptr(ex.tensors[node])] + [ptr(ex.tensors[i]) for i in node.inputs]


def _check_head_dim(node: Node) -> None:
    """A head dim the attention kernels refuse is said when the node is lowered, with its value, not
    as the cudaErrorInvalidValue of the first launch (seen only when the executor's graph is captured).
    Every attention node's output is (T, H, Dh)."""
    dh = node.type.shape[-1]
    low, high = HEAD_DIMS
    if dh % 2 or not low <= dh <= high:
        raise KilnRunError(
            f"%{node.name} ({node.op}): head_dim {dh}: the CUDA attention kernels take even head dims from {low}"
            f" to {high}"
        )


# --- task 02's kernels ------------------------------------------------------------------------------


@register_cuda("embedding")
def lower_embedding(ex: CudaExecutor, node: Node) -> Launch:
    out, table, tokens = _tensors(ex, node)
    vocab, d = node.inputs[0].type.shape
    n_tokens = node.inputs[1].type.shape[0]
    fn, stream = kernel("kiln_embedding", node), ex.stream_handle
    return lambda: fn(out, table, tokens, n_tokens, vocab, d, stream)


@register_cuda("rmsnorm")
def lower_rmsnorm(ex: CudaExecutor, node: Node) -> Launch:
    out, x, w = _tensors(ex, node)
    d = node.type.shape[-1]
    rows = node.type.numel // d  # every leading dim is a row: (T, D) or (B, T, D)
    eps = float(node.attrs["eps"])
    fn, stream = kernel("kiln_rmsnorm", node), ex.stream_handle
    return lambda: fn(out, x, w, rows, d, eps, stream)


@register_cuda("rope")
def lower_rope(ex: CudaExecutor, node: Node) -> Launch:
    out, x, pos, inv_freq = _tensors(ex, node)
    n_tokens, heads, dh = node.type.shape
    layout = LAYOUTS[node.attrs["layout"]]
    fn, stream = kernel("kiln_rope", node), ex.stream_handle
    return lambda: fn(out, x, pos, inv_freq, n_tokens, heads, dh, layout, stream)


@register_cuda("kv_update")
def lower_kv_update(ex: CudaExecutor, node: Node) -> Launch:
    # the node is a view of its cache (view_of=0): its output IS input 0's memory, written in place
    _, cache, value, pos = _tensors(ex, node)
    cache_rows, kv_heads, dh = node.inputs[0].type.shape
    n_tokens = node.inputs[1].type.shape[0]
    fn, stream = kernel("kiln_kv_update", node), ex.stream_handle
    return lambda: fn(cache, value, pos, cache_rows, n_tokens, kv_heads * dh, stream)


@register_cuda("attention")
@register_cuda("attention_rope")
def lower_attention(ex: CudaExecutor, node: Node) -> Launch:
    """attention (q, k, v, pos) and attention_rope (q, k, v, pos, inv_freq), which turns q as it loads it."""
    _check_head_dim(node)
    out, q, k, v, pos, *rope = _tensors(ex, node)  # k and v: the kv_update views, i.e. the caches
    n_tokens, heads, dh = node.inputs[0].type.shape
    cache_rows, kv_heads, _ = node.inputs[1].type.shape
    scale = float(node.attrs["scale"])
    stream = ex.stream_handle
    if not rope:
        fn = kernel("kiln_attention", node)
        return lambda: fn(out, q, k, v, pos, n_tokens, heads, kv_heads, dh, cache_rows, scale, stream)
    fn, layout = kernel("kiln_attention_rope", node), LAYOUTS[node.attrs["layout"]]
    return lambda: fn(out, q, k, v, pos, rope[0], layout, n_tokens, heads, kv_heads, dh, cache_rows, scale, stream)


@register_cuda("rope_kv_update")
def lower_rope_kv_update(ex: CudaExecutor, node: Node) -> Launch:
    _, cache, value, pos, inv_freq = _tensors(ex, node)  # a view of its cache, as kv_update
    cache_rows, kv_heads, dh = node.inputs[0].type.shape
    n_tokens = node.inputs[1].type.shape[0]
    layout = LAYOUTS[node.attrs["layout"]]
    fn, stream = kernel("kiln_rope_kv_update", node), ex.stream_handle
    return lambda: fn(cache, value, pos, inv_freq, cache_rows, n_tokens, kv_heads, dh, layout, stream)


def _append(ex: CudaExecutor, node: Node, pointers: tuple, sizes: tuple[int, ...]) -> Launch:
    """The kiln_attention_append launch of either form: pointers (out, q, k_new, v_new, cache_k,
    cache_v, pos, inv_freq), sizes (n_tokens, heads, kv_heads, dh, cache_rows)."""
    scale, layout = float(node.attrs["scale"]), LAYOUTS[node.attrs["layout"]]
    fn, stream = kernel("kiln_attention_append", node), ex.stream_handle
    args = (*pointers, layout, *sizes, scale, stream)
    return lambda: fn(*args)


@register_cuda("attention_append")
def lower_attention_append(ex: CudaExecutor, node: Node) -> Launch:
    """attention_append (q, k_new, v_new, cache_k, cache_v, pos, inv_freq): the kernel writes the new
    rows into the two caches (buffers, which outlive the run) and attends over them."""
    _check_head_dim(node)
    n_tokens, heads, dh = node.inputs[0].type.shape
    cache_rows, kv_heads, _ = node.inputs[3].type.shape
    return _append(ex, node, tuple(_tensors(ex, node)), (n_tokens, heads, kv_heads, dh, cache_rows))


@register_cuda("attention_append_qkv")
def lower_attention_append_qkv(ex: CudaExecutor, node: Node) -> Launch:
    """attention_append_qkv (qkv, cache_k, cache_v, pos, inv_freq): attention_append of one token
    whose q, k_new and v_new are the three parts of the row qkv, passed as pointers into it."""
    _check_head_dim(node)
    out, qkv, cache_k, cache_v, pos, inv_freq = _tensors(ex, node)
    _, heads, dh = node.type.shape
    cache_rows, kv_heads, _ = node.inputs[1].type.shape
    base, item = qkv.value, node.type.dtype.itemsize
    k_new, v_new = ctypes.c_void_p(base + heads * dh * item), ctypes.c_void_p(base + (heads + kv_heads) * dh * item)
    pointers = (out, qkv, k_new, v_new, cache_k, cache_v, pos, inv_freq)
    return _append(ex, node, pointers, (1, heads, kv_heads, dh, cache_rows))


# --- task 03's kernels ------------------------------------------------------------------------------


def _lower_linear(ex: CudaExecutor, node: Node) -> Launch:
    """linear (x, w), linear_add (x, w, r), linear_swiglu (x, w1, w3): one kiln_linear call, the
    third input (if any) is its `extra`; their rmsnorm_ forms read the norm's weight g after x and
    call kiln_rmsnorm_linear, the GEMV with the RMSNorm prologue (the fusion pass makes those for
    m <= 8 only)."""
    norm = node.op.startswith("rmsnorm_")
    out, x, *rest = _tensors(ex, node)
    g = rest.pop(0) if norm else None
    w, *rest = rest
    extra = rest[0] if rest else ctypes.c_void_p(None)
    m, k = node.inputs[0].type.shape
    n = node.inputs[2 if norm else 1].type.shape[0]
    epilogue = EPILOGUES[node.op.removeprefix("rmsnorm_")]
    stream = ex.stream_handle
    if not norm:
        fn = kernel("kiln_linear", node)
        return lambda: fn(epilogue, out, x, w, extra, m, n, k, stream)
    fn, eps = kernel("kiln_rmsnorm_linear", node), float(node.attrs["eps"])
    return lambda: fn(epilogue, out, x, g, eps, w, extra, m, n, k, stream)


for _op in ("linear", "linear_add", "linear_swiglu", "rmsnorm_linear", "rmsnorm_linear_swiglu"):
    register_cuda(_op)(_lower_linear)


@register_cuda("rmsnorm_linear_qkv")
def lower_rmsnorm_linear_qkv(ex: CudaExecutor, node: Node) -> Launch:
    """rmsnorm_linear_qkv (x, g, wq, wk, wv): one kiln_rmsnorm_linear_qkv, the GEMV over the three
    weights stacked."""
    out, x, g, wq, wk, wv = _tensors(ex, node)
    m, k = node.inputs[0].type.shape
    nq, nk, nv = (w.type.shape[0] for w in node.inputs[2:])
    fn, eps, stream = kernel("kiln_rmsnorm_linear_qkv", node), float(node.attrs["eps"]), ex.stream_handle
    return lambda: fn(out, x, g, eps, wq, wk, wv, m, nq, nk, nv, k, stream)


__all__ = ["SIGNATURES", "kernel", "load_kernels"]

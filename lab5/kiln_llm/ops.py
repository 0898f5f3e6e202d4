"""The operators lab 5 adds to kiln for LLaMA: what each takes, and its output type.

Registering them in kiln's operator registry is all the frontend, the text form, the shape
checker and the memory planner need: `b.op("rmsnorm", x, w, eps=1e-5)` builds a checked node, and
a mistake (a weight of the wrong width, a head count that does not divide) raises a ShapeError
naming the rule and the shapes at the line of the model that made it. The kernels are elsewhere:
kiln_llm/cpu.py (task 01) and kiln_llm/cuda.py.

Every float operand of one operator has the same dtype F (f32, f16 or bf16; kiln never promotes);
positions and tokens are i64; RoPE's frequencies are f32 whatever F is. Shapes, batch 1:

    embedding      table F[V, D], tokens i64[T]                        -> F[T, D]
    rmsnorm        x F[..., D], w F[D]                      {eps}      -> F[..., D]
    linear         x F[M, K], w F[N, K]                                -> F[M, N]    x @ w.T
    linear_add     x F[M, K], w F[N, K], r F[M, N]                     -> F[M, N]    x @ w.T + r
    linear_swiglu  x F[M, K], w1 F[N, K], w3 F[N, K]                   -> F[M, N]    silu(x @ w1.T) * (x @ w3.T)
    rope           x F[T, Hx, Dh], pos i64[1], inv_freq f32[Dh/2] {layout} -> F[T, Hx, Dh]
    kv_update      cache F[S, Hkv, Dh], value F[T, Hkv, Dh], pos i64[1] -> the cache (a view)
    attention      q F[T, H, Dh], k F[S, Hkv, Dh], v F[S, Hkv, Dh], pos i64[1] {scale} -> F[T, H, Dh]
    rmsnorm_linear         x F[M, K], g F[K], w F[N, K]            {eps} -> F[M, N]  linear(rmsnorm(x, g), w)
    rmsnorm_linear_swiglu  x F[M, K], g F[K], w1 F[N, K], w3 F[N, K] {eps} -> F[M, N]  linear_swiglu(rmsnorm(x, g), ...)
    rope_kv_update cache F[S, Hkv, Dh], value F[T, Hkv, Dh], pos i64[1], inv_freq f32[Dh/2] {layout} -> the cache
    attention_rope q F[T, H, Dh], k, v F[S, Hkv, Dh], pos i64[1], inv_freq f32[Dh/2] {scale, layout} -> F[T, H, Dh]
    attention_append q F[T, H, Dh], k_new, v_new F[T, Hkv, Dh], cache_k, cache_v F[S, Hkv, Dh], pos i64[1],
                   inv_freq f32[Dh/2] {scale, layout} -> F[T, H, Dh], and the caches written at rows pos + t
    rmsnorm_linear_qkv x F[M, K], g F[K], wq F[Nq, K], wk F[Nk, K], wv F[Nv, K] {eps} -> F[M, Nq + Nk + Nv]
                   the three rmsnorm_linear of one x side by side in each row
    attention_append_qkv qkv F[1, (H + 2 Hkv) Dh], cache_k, cache_v F[S, Hkv, Dh], pos i64[1],
                   inv_freq f32[Dh/2] {scale, layout} -> F[1, H, Dh]: attention_append of one token
                   whose q, k_new and v_new lie side by side in one row

The last seven are what the fusion pass makes (fusion.py): a decode step's RMSNorm folded into the
linears that read it (the normalized row stays in float32, unrounded, inside the GEMV), RoPE
folded into the cache write of the keys and into attention's loading of the queries, at decode
both cache writes folded into the attention that reads the caches, and a decode step's three
projections of one row stacked into one GEMV.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kiln.ir import DType, TensorType
from kiln.ops import OpDef, register
from kiln.shapes import ShapeError, fmt, make_type, require_float, same_dtype

ROPE_LAYOUTS = ("half", "interleaved")  # pairs (j, j + Dh/2) as Hugging Face; (2j, 2j + 1) as llama2.c


# --- the rules shared by several operators ---------------------------------------------------------


def _rank(t: TensorType, rank: int, what: str, dims: str) -> None:
    if t.rank != rank:
        raise ShapeError(f"{what} {t} must have rank {rank} ({dims})")


def _floats(types: Sequence[TensorType], sep: str = ", ") -> None:
    """All float, all one dtype: the operands an operator computes with."""
    for t in types:
        require_float(t)
    same_dtype(types, sep)


def _pos(t: TensorType, what: str = "pos") -> None:
    """A position is one i64 on the device, read at run time (a CUDA graph replays with new ones)."""
    if t.dtype is not DType.int64 or t.shape != (1,):
        raise ShapeError(f"{what} {t} must be i64[1] (the number of cache rows already filled)")


def _number(attrs: Mapping[str, Any], key: str, positive: bool = True) -> float:
    """A float attribute (an int is accepted, a bool is not)."""
    value = attrs[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (positive and not value > 0):
        raise ShapeError(f"attribute {key} = {value!r} must be a {'positive ' if positive else ''}number")
    return float(value)


def _heads(x: TensorType, what: str) -> tuple[int, int, int]:
    _rank(x, 3, what, "tokens, heads, head_dim")
    t, h, d = x.shape
    return t, h, d


# --- the operators ----------------------------------------------------------------------------------


def _embedding(inputs: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    table, tokens = inputs
    _rank(table, 2, "table", "vocab, dim")
    require_float(table, "table")
    if tokens.dtype is not DType.int64 or tokens.rank != 1:
        raise ShapeError(f"tokens {tokens} must be i64[T] (one token id per position)")
    return make_type((tokens.shape[0], table.shape[1]), table.dtype)


register(OpDef("embedding", 2, _embedding, doc="table[tokens]: rows of F[V, D] for i64[T] ids in [0, V)"))


def _rmsnorm(inputs: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    x, w = inputs
    _floats(inputs)
    if w.rank != 1 or w.shape[0] != x.shape[-1]:
        raise ShapeError(
            f"rmsnorm of {x} with weight {w}: the weight must be {x.dtype.short}[{x.shape[-1]}] (x's last dimension)"
        )
    _number(attrs, "eps")
    return x


register(
    OpDef(
        "rmsnorm",
        2,
        _rmsnorm,
        attrs=("eps",),
        doc="x * rsqrt(mean(x^2) + eps) over the last axis, rounded to F, times w (Hugging Face's order)",
    )
)


def _linear_shapes(x: TensorType, w: TensorType, what: str = "w") -> tuple[int, int]:
    _rank(x, 2, "x", "M, K")
    _rank(w, 2, what, "N, K: nn.Linear's [out, in]")
    if x.shape[1] != w.shape[1]:
        raise ShapeError(
            f"x {x} times {what}.T with {what} {w}: in-features differ: {x.shape[1]} != {w.shape[1]}"
            f" ({what} is [out, in], like nn.Linear's weight)"
        )
    return x.shape[0], w.shape[0]


def _linear(inputs: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    x, w = inputs
    _floats(inputs, " @ ")
    m, n = _linear_shapes(x, w)
    return make_type((m, n), x.dtype)


register(OpDef("linear", 2, _linear, doc="x @ w.T for x F[M, K], w F[N, K]; fp32 accumulation, one rounding"))


def _linear_add(inputs: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    x, w, r = inputs
    _floats(inputs)
    m, n = _linear_shapes(x, w)
    if r.shape != (m, n):
        raise ShapeError(f"linear_add: the residual {r} must be {x.dtype.short}{fmt((m, n))} (x @ w.T's shape)")
    return r


register(OpDef("linear_add", 3, _linear_add, doc="x @ w.T + r in fp32, one rounding (the residual epilogue)"))


def _linear_swiglu(inputs: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    x, w1, w3 = inputs
    _floats(inputs)
    if w1.shape != w3.shape:
        raise ShapeError(f"linear_swiglu: the gate {w1} and the up projection {w3} must have one shape")
    m, n = _linear_shapes(x, w1, "w1")
    return make_type((m, n), x.dtype)


register(OpDef("linear_swiglu", 3, _linear_swiglu, doc="silu(x @ w1.T) * (x @ w3.T) in fp32, one rounding (SwiGLU)"))


def _rmsnorm_linear(inputs: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    x, g, w = inputs
    return _linear([_rmsnorm([x, g], attrs), w], attrs)


register(
    OpDef(
        "rmsnorm_linear",
        3,
        _rmsnorm_linear,
        attrs=("eps",),
        doc="linear(rmsnorm(x, g), w): x * rsqrt(mean(x^2) + eps) * g in fp32, unrounded, then @ w.T, one rounding",
    )
)


def _rmsnorm_linear_swiglu(inputs: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    x, g, w1, w3 = inputs
    return _linear_swiglu([_rmsnorm([x, g], attrs), w1, w3], attrs)


register(
    OpDef(
        "rmsnorm_linear_swiglu",
        4,
        _rmsnorm_linear_swiglu,
        attrs=("eps",),
        doc="linear_swiglu(rmsnorm(x, g), w1, w3), the normalized x in fp32, unrounded",
    )
)


def _rope(inputs: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    x, pos, inv_freq = inputs
    _, _, dh = _heads(x, "x")
    require_float(x, "x")
    if dh % 2:
        raise ShapeError(f"rope of {x}: head_dim {dh} must be even (RoPE turns pairs of coordinates)")
    _pos(pos)
    if inv_freq.dtype is not DType.float32 or inv_freq.shape != (dh // 2,):
        raise ShapeError(f"rope of {x}: inv_freq {inv_freq} must be f32[{dh // 2}] (one frequency per pair)")
    layout = attrs["layout"]
    if layout not in ROPE_LAYOUTS:
        raise ShapeError(f"attribute layout = {layout!r} must be one of {', '.join(map(repr, ROPE_LAYOUTS))}")
    return x


register(
    OpDef(
        "rope",
        3,
        _rope,
        attrs=("layout",),
        doc="rotary embedding: token t at position pos + t turns pair j by (pos + t) * inv_freq[j]",
    )
)


def _kv_update(inputs: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    cache, value, pos = inputs
    s, hkv, dh = _heads(cache, "cache")
    t = _heads(value, "value")[0]
    _floats([cache, value])
    if value.shape[1:] != (hkv, dh):
        raise ShapeError(f"kv_update of {cache} with {value}: a row must be [{hkv}, {dh}] (kv_heads, head_dim)")
    if t > s:
        raise ShapeError(f"kv_update of {cache} with {value}: {t} new rows do not fit in a cache of {s}")
    _pos(pos)
    return cache


register(
    OpDef(
        "kv_update",
        3,
        _kv_update,
        view_of=0,
        writes=(0,),
        doc="cache[pos:pos+T] = value, pos read at run time; returns the cache (a view)",
    )
)


def _attention(inputs: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    q, k, v, pos = inputs
    t, h, dh = _heads(q, "q")
    s, hkv, dk = _heads(k, "k")
    _floats([q, k, v])
    if v.shape != k.shape:
        raise ShapeError(f"attention: k {k} and v {v} must have one shape (the two caches)")
    if dk != dh:
        raise ShapeError(f"attention of q {q} with k {k}: head_dim differs: {dh} != {dk}")
    if h % hkv:
        raise ShapeError(f"attention of q {q} with k {k}: {h} query heads do not split into groups over {hkv} kv heads")
    if t > s:
        raise ShapeError(f"attention of q {q} with k {k}: {t} queries cannot sit in a cache of {s} rows")
    _pos(pos)
    _number(attrs, "scale")
    return q


register(
    OpDef(
        "attention",
        4,
        _attention,
        attrs=("scale",),
        doc="causal GQA attention: query t (position pos + t) of head h reads cache rows 0..pos+t "
        "of kv head h // (H / Hkv)",
    )
)


def _rope_kv_update(inputs: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    cache, value, pos, inv_freq = inputs
    _rope([value, pos, inv_freq], attrs)
    return _kv_update([cache, value, pos], attrs)


register(
    OpDef(
        "rope_kv_update",
        4,
        _rope_kv_update,
        attrs=("layout",),
        view_of=0,
        writes=(0,),
        doc="kv_update(cache, rope(value, pos, inv_freq), pos): the new keys rotated on their way into the cache",
    )
)


def _attention_rope(inputs: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    q, k, v, pos, inv_freq = inputs
    _rope([q, pos, inv_freq], attrs)
    return _attention([q, k, v, pos], attrs)


register(
    OpDef(
        "attention_rope",
        5,
        _attention_rope,
        attrs=("scale", "layout"),
        doc="attention(rope(q, pos, inv_freq), k, v, pos): the queries rotated as the attention kernel loads them",
    )
)


def _attention_append(inputs: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    q, k_new, v_new, cache_k, cache_v, pos, inv_freq = inputs
    _rope_kv_update([cache_k, k_new, pos, inv_freq], attrs)
    _kv_update([cache_v, v_new, pos], attrs)
    if k_new.shape[0] != q.shape[0]:
        raise ShapeError(f"attention_append: {k_new.shape[0]} new keys for {q.shape[0]} queries (one per token)")
    return _attention_rope([q, cache_k, cache_v, pos, inv_freq], attrs)


# With attention_append_qkv below, the operators that write into inputs that are not their output:
# cache_k and cache_v must be buffers, whose memory outlives the run and which nothing else reads in
# it; the fusion pass makes them only under those conditions (kiln_llm/fusion.py, find_appends).
register(
    OpDef(
        "attention_append",
        7,
        _attention_append,
        attrs=("scale", "layout"),
        writes=(3, 4),  # the caches: the output is the attention, so the IR text says the writes
        doc="rope_kv_update(cache_k, k_new), kv_update(cache_v, v_new), then attention_rope(q, ...) over them: "
        "one decode kernel that writes the new rows into the caches as it reads them",
    )
)


def _rmsnorm_linear_qkv(inputs: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    x, g, wq, wk, wv = inputs
    outs = [_rmsnorm_linear([x, g, w], attrs) for w in (wq, wk, wv)]
    return make_type((x.shape[0], sum(o.shape[1] for o in outs)), x.dtype)


register(
    OpDef(
        "rmsnorm_linear_qkv",
        5,
        _rmsnorm_linear_qkv,
        attrs=("eps",),
        doc="[rmsnorm_linear(x, g, wq) | ...(wk) | ...(wv)]: three projections of one x as one GEMV, side by side",
    )
)


def _attention_append_qkv(inputs: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    qkv, cache_k, cache_v, pos, inv_freq = inputs
    _rank(qkv, 2, "qkv", "tokens, (heads + 2 kv_heads) * head_dim")
    _, kv_heads, dh = _heads(cache_k, "cache_k")
    t, width = qkv.shape
    if t != 1:
        raise ShapeError(
            f"attention_append_qkv: qkv {qkv} holds {t} tokens; it takes one (q, k and v of a longer"
            " run are not each one dense block)"
        )
    if width % dh != 0 or width // dh <= 2 * kv_heads:
        raise ShapeError(
            f"attention_append_qkv: qkv {qkv} is not (heads + 2 * {kv_heads}) heads of {dh} (cache_k {cache_k})"
        )
    q = make_type((t, width // dh - 2 * kv_heads, dh), qkv.dtype)
    new = make_type((t, kv_heads, dh), qkv.dtype)
    return _attention_append([q, new, new, cache_k, cache_v, pos, inv_freq], attrs)


# Writes the caches as attention_append does (fusion.py's find_stacks makes it from one).
register(
    OpDef(
        "attention_append_qkv",
        5,
        _attention_append_qkv,
        attrs=("scale", "layout"),
        writes=(1, 2),
        doc="attention_append of one token whose q, k_new and v_new are the three parts of one row "
        "(rmsnorm_linear_qkv's output)",
    )
)

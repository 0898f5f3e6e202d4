"""Checks for lab5/kiln_llm/cpu.py: LLaMA's operators on the CPU, graded on the CPU (no GPU needed).

Each operator is built into a small graph with kiln's Builder, run by lab 4's CPUExecutor and
compared with Hugging Face's own code where it has some (LlamaRMSNorm, LlamaRotaryEmbedding with
apply_rotary_pos_emb, eager attention with repeat_kv and a causal mask) and with an independent
torch formula otherwise (Meta's complex-number RoPE for the interleaved layout, a matmul in fp32
for the linears), in f32, f16 and bf16. Attention runs with 1, 2 and 4 query heads per kv head,
at position 0 and after a prefix, with 1e4 in every cache row past the run's last token: a kernel
that reads one of those rows is off by thousands. RoPE runs in both layouts with frequencies from
three bases, at positions up to 1000. kv_update writes at the run-time position into a buffer that
keeps earlier writes, and refuses rows past the cache; embedding refuses a token outside [0, V).

Attributes and magnitudes off LLaMA's usual values. RMSNorm also runs at eps 1e-6 and 0.1 on rows
of small spread (x of size 1e-3, so mean(x^2) is below eps): a hard-coded eps, or eps added after
the square root (x / (sqrt(mean) + eps)), is off by a factor of two or more there. Attention also
runs at scales 0.9 and 0.05 (not 1 / sqrt(Dh): a kernel that ignores its `scale` is caught), and on
queries and keys with a common offset that puts every score above 100 (exp of a score past 88
overflows float32: a softmax without the maximum subtracted gives NaN), where the scores must also
stay in float32 (rounded to f16 they move by 0.06, to bf16 by 0.5, and the weights by percents).

Tolerances. The contract computes in fp32 and rounds once to the dtype, so the reference is Hugging
Face's (or the formula's) result computed in fp32 from the same inputs and cast once: f32 within
rtol 1e-5 (a different summation order costs a few ulps of fp32), f16 and bf16 within one unit in
the last place (rtol 1e-3 / 8e-3; an error of one rounding step). RMSNorm is compared with
LlamaRMSNorm in the dtype itself: at most 1% of bf16 elements may differ, by one ulp, which a
different fp32 summation order allows and multiplying by the weight before rounding (two roundings
in another order) does not. A wrong pair layout, kv head or position is off by O(1).

The point tests import kiln inside their bodies: the grading process loads this file too and
must not run student code.
"""

from __future__ import annotations

import math

import pytest
import torch

from grader.tasks import PythonTask

TASK = PythonTask(
    lab="lab5",
    number="01",
    title="LLaMA's operators on the CPU",
    sources=["kiln_llm/cpu.py"],
    packages=["kiln_llm", "../lab4/kiln"],
    builds_on=["../lab4/kiln/cpu.py", "../lab4/kiln/planner.py"],
    mistakes={
        "rope layout": "test_rope_both_layouts: both layouts against HF's rotate_half and Meta's complex RoPE",
        "gqa heads": "test_attention_matches_hf: 2 and 4 query heads per kv head, against HF's repeat_kv",
        "reads past the prefix": "test_attention_matches_hf: cache rows past pos + T - 1 hold 1e4",
        "rounding order": "test_rmsnorm_matches_hf: at most 1% of bf16 elements may differ from LlamaRMSNorm, by"
        " one ulp",
        "position ignored": "test_rope_both_layouts and test_rope_reads_pos_at_run_time: positions up to 1000, "
        "pos changed between runs of one graph",
        "cache write position": "test_kv_update_at_pos: writes at pos 0, 4, 5 and 1 into one buffer",
        "attribute at its LLaMA value": "test_attention_scale_and_large_scores (scale 0.9 and 0.05) and "
        "test_rmsnorm_matches_hf (eps 1e-6 and 0.1 on rows of small spread)",
        "small variance": "test_rmsnorm_matches_hf: rows of size 1e-3, where eps outside the square root "
        "changes the result by a factor of two",
        "large scores": "test_attention_scale_and_large_scores: every score above 100, where exp overflows "
        "float32 unless the row's maximum is subtracted",
        "precision downgrade": "test_attention_scale_and_large_scores: scores near 100 rounded to f16 or bf16 "
        "move the weights by percents",
    },
)

FLOATS = [torch.float32, torch.float16, torch.bfloat16]
TOL = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-5},
    torch.float16: {"rtol": 1e-3, "atol": 1e-3},
    torch.bfloat16: {"rtol": 8e-3, "atol": 8e-3},
}
GARBAGE = 1e4  # what the cache holds past the filled prefix: never to be read


def rand(shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype)


def i64(*values):
    return torch.tensor(values, dtype=torch.int64)


def graph_of(op, tensors, **attrs):
    """`op(x0, x1, ...)` as a graph of inputs x0, x1, ...; returns (graph, feed)."""
    import kiln

    b = kiln.Builder(op)
    xs = [b.input(f"x{i}", tuple(t.shape), t.dtype) for i, t in enumerate(tensors)]
    b.output(b.op(op, *xs, **attrs))
    return b.graph, {f"x{i}": t for i, t in enumerate(tensors)}


def run_op(op, tensors, **attrs):
    import kiln_llm  # noqa: F401 (registers lab 5's operators and CPU kernels)
    from kiln.cpu import CPUExecutor

    graph, feed = graph_of(op, tensors, **attrs)
    (out,) = CPUExecutor(graph).run(feed)
    return out


def check(got, want, tol=None, what=""):
    assert isinstance(got, torch.Tensor), f"expected a torch tensor, got {type(got).__name__}"
    assert got.dtype == want.dtype, f"dtype {got.dtype}, expected {want.dtype}"
    assert tuple(got.shape) == tuple(want.shape), f"shape {list(got.shape)}, expected {list(want.shape)}"
    torch.testing.assert_close(got, want, **(tol or TOL[want.dtype]), msg=lambda m: f"{what}: {m}" if what else m)


# --- embedding ----------------------------------------------------------------------------------


@pytest.mark.points(1)
def test_embedding():
    for dtype in FLOATS:
        table = rand((11, 6), dtype, 1)
        tokens = i64(0, 10, 3, 3, 7)  # both ends of the vocabulary, a repeat
        check(run_op("embedding", [table, tokens]), table[tokens], {"rtol": 0, "atol": 0})


@pytest.mark.points(1)
def test_embedding_refuses_out_of_range():
    from kiln.runtime import KilnRunError

    table = rand((11, 6), torch.float32, 1)
    for bad in (11, -1, 1000):
        with pytest.raises(KilnRunError) as err:
            run_op("embedding", [table, i64(2, bad, 4)])
        assert str(bad) in str(err.value), f"the message should name the token {bad}: {err.value}"
    check(run_op("embedding", [table, i64(10)]), table[10:11], {"rtol": 0, "atol": 0})


# --- rmsnorm --------------------------------------------------------------------------------------


@pytest.mark.points(2)
def test_rmsnorm_matches_hf():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    # (shape, eps, size of x): unit-scale rows, then rows whose mean square is below eps (1e-6) or
    # near it (0.1 on x of 0.3): there eps decides the result, where it sits and what value it has
    cases = [
        ((6, 48), 1e-6, 1e-3),
        ((2, 40), 0.1, 0.3),
        ((4, 64), 1e-5, 3.0),
        ((1, 96), 1e-6, 3.0),
        ((3, 5, 32), 1e-5, 3.0),
        ((200, 128), 1e-6, 3.0),
    ]
    for k, (shape, eps, size) in enumerate(cases):
        for dtype in FLOATS:
            x = (rand(shape, torch.float32, k) * size).to(dtype)
            w = (1 + 0.5 * rand(shape[-1:], torch.float32, 100 + k)).to(dtype)
            hf = LlamaRMSNorm(shape[-1], eps=eps).to(dtype)
            with torch.no_grad():
                hf.weight.copy_(w)
                want = hf(x)
            got = run_op("rmsnorm", [x, w], eps=eps)
            check(got, want, what=f"{dtype} x of size {size:g}, eps={eps:g}")
            if dtype != torch.float32:
                # one ulp at most, and rarely: the rounding to F comes before the weight (HF's order)
                differ = (got != want).float().mean().item()
                assert differ <= 0.01, (
                    f"{dtype}: {differ:.1%} of the elements differ from LlamaRMSNorm; round x * rsqrt(...) "
                    "to the dtype first, then multiply by the weight in the dtype"
                )


# --- the linears ----------------------------------------------------------------------------------

LINEAR = [(1, 64, 48), (3, 32, 40), (17, 24, 8), (8, 128, 96)]  # (M, K, N): decode, small and odd sizes


@pytest.mark.points(2)
def test_linear_and_epilogues():
    silu = torch.nn.functional.silu
    for k, (m, kk, n) in enumerate(LINEAR):
        for dtype in FLOATS:
            x, w = rand((m, kk), dtype, 3 * k), rand((n, kk), dtype, 3 * k + 1) / math.sqrt(kk)
            w3, r = rand((n, kk), dtype, 3 * k + 2) / math.sqrt(kk), rand((m, n), dtype, 50 + k)
            xf, wf, w3f = x.float(), w.float(), w3.float()
            check(run_op("linear", [x, w]), (xf @ wf.T).to(dtype))
            check(run_op("linear_add", [x, w, r]), (xf @ wf.T + r.float()).to(dtype))
            check(run_op("linear_swiglu", [x, w, w3]), (silu(xf @ wf.T) * (xf @ w3f.T)).to(dtype))


# --- rope -----------------------------------------------------------------------------------------


def hf_rope(x, pos, theta):
    """Hugging Face's RoPE ("half" layout) of x (T, H, Dh) at positions pos.., in fp32."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    t, h, dh = x.shape
    cfg = LlamaConfig(hidden_size=h * dh, num_attention_heads=h, rope_theta=theta)
    rotary = LlamaRotaryEmbedding(cfg)
    xf = x.float().permute(1, 0, 2)[None]  # (1, H, T, Dh)
    cos, sin = rotary(xf, torch.arange(pos, pos + t)[None])  # (1, T, Dh) fp32
    out, _ = apply_rotary_pos_emb(xf, xf, cos, sin)
    return out[0].permute(1, 0, 2), rotary.inv_freq  # (T, H, Dh), f32[Dh/2]


def meta_rope(x, pos, inv_freq):
    """Meta's reference RoPE (interleaved layout, as llama2.c): pairs (2j, 2j+1) as complex numbers."""
    t, h, dh = x.shape
    angle = torch.arange(pos, pos + t).float()[:, None] * inv_freq[None, :]  # (T, Dh/2)
    turn = torch.polar(torch.ones_like(angle), angle)[:, None, :]  # (T, 1, Dh/2)
    z = torch.view_as_complex(x.float().reshape(t, h, dh // 2, 2).contiguous())
    return torch.view_as_real(z * turn).reshape(t, h, dh)


@pytest.mark.points(3)
def test_rope_both_layouts():
    cases = [((1, 4, 16), 0, 10000.0), ((5, 3, 32), 7, 10000.0), ((3, 2, 64), 1000, 500000.0), ((2, 1, 8), 33, 1e6)]
    for k, (shape, pos, theta) in enumerate(cases):
        for dtype in FLOATS:
            x = rand(shape, dtype, k)
            want, inv_freq = hf_rope(x, pos, theta)
            check(run_op("rope", [x, i64(pos), inv_freq], layout="half"), want.to(dtype))
            want = meta_rope(x, pos, inv_freq)
            check(run_op("rope", [x, i64(pos), inv_freq], layout="interleaved"), want.to(dtype))


@pytest.mark.points(1)
def test_rope_reads_pos_at_run_time():
    import kiln_llm  # noqa: F401
    from kiln.cpu import CPUExecutor

    x = rand((2, 2, 16), torch.float32, 9)
    want0, inv_freq = hf_rope(x, 0, 10000.0)
    graph, feed = graph_of("rope", [x, i64(0), inv_freq], layout="half")
    ex = CPUExecutor(graph)
    check(ex.run(feed)[0], want0)
    check(ex.run({**feed, "x1": i64(12)})[0], hf_rope(x, 12, 10000.0)[0])  # same graph, a later position


# --- kv_update ------------------------------------------------------------------------------------


def cache_graph(s, hkv, dh, t, dtype):
    """A buffer `cache` updated by kv_update(cache, value, pos); returns the executor."""
    import kiln
    import kiln_llm  # noqa: F401
    from kiln.cpu import CPUExecutor

    b = kiln.Builder("kv")
    cache = b.buffer("cache", (s, hkv, dh), dtype)
    value = b.input("value", (t, hkv, dh), dtype)
    pos = b.input("pos", (1,), "int64")
    b.output(b.op("kv_update", cache, value, pos))
    return CPUExecutor(b.graph)


@pytest.mark.points(2)
def test_kv_update_at_pos():
    for dtype in FLOATS:
        ex = cache_graph(8, 2, 4, 3, dtype)
        want = torch.zeros(8, 2, 4, dtype=dtype)
        for k, pos in enumerate([0, 4, 5, 1]):  # the last write overlaps the first
            v = rand((3, 2, 4), dtype, k)
            want[pos : pos + 3] = v
            (got,) = ex.run({"value": v, "pos": i64(pos)})
            check(got, want, {"rtol": 0, "atol": 0})


@pytest.mark.points(1)
def test_kv_update_refuses_rows_past_the_cache():
    from kiln.runtime import KilnRunError

    ex = cache_graph(8, 2, 4, 3, torch.float32)
    v = rand((3, 2, 4), torch.float32, 1)
    (before,) = ex.run({"value": v, "pos": i64(5)})  # rows 5..7: the last that fit
    for pos in (6, 8, 100, -1):
        with pytest.raises(KilnRunError) as err:
            ex.run({"value": v + 1, "pos": i64(pos)})
        assert str(pos) in str(err.value), f"the message should name pos {pos}: {err.value}"
    (after,) = ex.run({"value": v, "pos": i64(5)})
    check(after, before, {"rtol": 0, "atol": 0})  # a refused run wrote nothing


# --- attention ------------------------------------------------------------------------------------


def hf_attention(q, k, v, pos, scale):
    """Hugging Face's eager attention over cache rows 0..pos+T-1 with a causal mask, in fp32."""
    from types import SimpleNamespace

    from transformers.models.llama.modeling_llama import eager_attention_forward

    t, h, _ = q.shape
    n = pos + t
    hkv = k.shape[1]
    query = q.float().permute(1, 0, 2)[None]  # (1, H, T, Dh)
    key = k[:n].float().permute(1, 0, 2)[None]  # (1, Hkv, n, Dh)
    value = v[:n].float().permute(1, 0, 2)[None]
    allowed = torch.arange(n)[None, :] <= torch.arange(pos, n)[:, None]  # (T, n)
    mask = torch.zeros(t, n).masked_fill(~allowed, float("-inf"))[None, None]
    module = SimpleNamespace(num_key_value_groups=h // hkv, training=False)
    out, _ = eager_attention_forward(module, query, key, value, mask, scaling=scale)
    return out[0]  # (T, H, Dh)


def kv_cache(s, hkv, dh, filled, dtype, seed):
    """A cache whose rows past `filled` hold GARBAGE, as after a longer earlier conversation."""
    c = rand((s, hkv, dh), dtype, seed)
    c[filled:] = GARBAGE
    return c


# (T, pos, S, H, Hkv, Dh): decode and prefill, at 0 and after a prefix, GQA ratios 1, 2 and 4
ATTENTION = [
    (1, 0, 16, 4, 4, 16),
    (1, 9, 16, 4, 2, 16),
    (6, 0, 16, 4, 1, 32),
    (4, 5, 16, 8, 2, 16),
    (3, 13, 16, 2, 2, 64),  # fills the cache to its last row
    (16, 0, 16, 4, 2, 8),
]


@pytest.mark.points(4)
def test_attention_matches_hf():
    for k, (t, pos, s, h, hkv, dh) in enumerate(ATTENTION):
        for dtype in FLOATS:
            q = rand((t, h, dh), dtype, 10 * k)
            kc = kv_cache(s, hkv, dh, pos + t, dtype, 10 * k + 1)
            vc = kv_cache(s, hkv, dh, pos + t, dtype, 10 * k + 2)
            scale = dh**-0.5
            want = hf_attention(q, kc, vc, pos, scale).to(dtype)
            got = run_op("attention", [q, kc, vc, i64(pos)], scale=scale)
            assert got.abs().max() < 100, (
                f"T={t} pos={pos}: outputs reach {got.abs().max():.0f}: rows past pos + T - 1 "
                f"(holding {GARBAGE:g}) were read"
            )
            check(got, want)


@pytest.mark.points(1)
def test_attention_reads_pos_at_run_time():
    import kiln_llm  # noqa: F401
    from kiln.cpu import CPUExecutor

    q = rand((2, 4, 16), torch.float32, 1)
    kc, vc = rand((12, 2, 16), torch.float32, 2), rand((12, 2, 16), torch.float32, 3)
    graph, feed = graph_of("attention", [q, kc, vc, i64(0)], scale=0.4)  # not 1 / sqrt(16)
    ex = CPUExecutor(graph)
    for pos in (0, 3, 10):
        check(ex.run({**feed, "x3": i64(pos)})[0], hf_attention(q, kc, vc, pos, 0.4))


@pytest.mark.points(2)
def test_attention_scale_and_large_scores():
    """Scales that are not 1 / sqrt(Dh), and scores far past exp's float32 range."""
    t, pos, s, h, hkv, dh = 3, 4, 12, 4, 2, 16
    for k, (scale, big) in enumerate([(0.9, False), (0.05, False), (dh**-0.5, True), (0.05, True)]):
        for dtype in FLOATS:
            q = rand((t, h, dh), torch.float32, 70 + k)
            kc = rand((s, hkv, dh), torch.float32, 80 + k)
            vc = rand((s, hkv, dh), torch.float32, 90 + k)
            tol = TOL[dtype]
            if big:
                # a common offset c in q and k: every score is about scale * Dh * c^2 = 140, spread
                # by a few units; the values sit near 1, so that the fp32 rounding of scores of 100
                # (a few 1e-5, either order of the sums) moves the output by less than 1e-5
                c = (140 / (scale * dh)) ** 0.5
                q, kc = q + c, kc + c
                vc = 1 + 0.25 * vc
                tol = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else tol
            kc[pos + t :], vc[pos + t :] = GARBAGE, GARBAGE
            q, kc, vc = q.to(dtype), kc.to(dtype), vc.to(dtype)
            if big:
                scores = torch.einsum("thd,shd->hts", q.float(), kc[: pos + t].float().repeat_interleave(2, 1))
                assert float(scores.min()) * scale > 88, "the test's scores must all pass exp's float32 range"
            want = hf_attention(q, kc, vc, pos, scale).to(dtype)
            got = run_op("attention", [q, kc, vc, i64(pos)], scale=scale)
            what = f"{dtype} scale={scale:.3g}" + (", every score above 100" if big else "")
            assert isinstance(got, torch.Tensor) and got.dtype == dtype, f"{what}: expected a {dtype} tensor"
            assert not got.isnan().any(), (
                f"{what}: NaN in the output: exp of a score past 88 overflows float32 (subtract the row's maximum)"
            )
            torch.testing.assert_close(got, want, **tol, msg=lambda m, what=what: f"{what}: {m}")


def test_llama_ops(grade):
    grade(TASK)

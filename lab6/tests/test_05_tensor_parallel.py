"""Checks for lab6/kiln_tp/shard.py: LLaMA split over 2 and 4 processes on the CPU (gloo).

Every model is made here: a LLaMA of 2 layers, dim 64 (head_dim 8), hidden_dim 96, vocab 64, fp32,
with seeded random weights at scale 1/sqrt(fan-in) (norms around 1), so that logits spread over
several units. The configurations:

    gqa              8 query heads over 2 kv heads (groups of 4), RoPE "half" (Hugging Face's rows)
    gqa_interleaved  the same model with wq and wk rows in the "interleaved" layout (llama2.c's)
    mha              4 heads, 4 kv heads
    gqa_w4           8 query heads over 4 kv heads, "interleaved", at world 4 (one kv head a rank)
    tied             4 query heads over 2 kv heads, tied embeddings (sliced, not run: a random tied
                     model's logits favour the token it was fed, and greedy repeats it)

Checked in this process (no other process needed): the all_reduce operator (its IR text, parsed back,
validated; an unknown reduction refused); shard_weights' slices, tensor by tensor, against the
checkpoint (the rank's whole query heads and the kv heads of their groups, wo's and w2's columns to
match, the replicated tensors, a tied classifier kept one tensor) and its local configuration; the
refusal, naming the numbers, of a model whose n_kv_heads or hidden_dim does not divide by the world;
a rank's graph: exactly two all_reduce nodes per layer and caches of F[S, Hkv/W, Dh].

Then each model runs on 2 processes (gqa_w4 on 4) started by kiln_tp.launch, each rank on its own
share, against the same model unsharded in this process (lab 5's LlamaModel): the prompt's logits
(a 5-token prefill), then 16 greedy tokens by lab 5's decode_loop with rank 0's token broadcast,
the logits of every decode step, the tokens, every rank's logits against rank 0's, and each rank's
KV caches, which must hold its own kv heads only (a rank holding the whole cache computes the right
logits with W times the memory, and fails there).

Tolerance: logits within 1e-4 (absolute and relative). The sharded model does the same roundings as
the unsharded one but for the order of two sums per layer: the output projection's and the down
projection's dot products are summed as W partial sums of K/W products each, then added by the
all-reduce, where the unsharded model adds all K products in one order. In fp32 each such sum moves
by a few ulps of its terms' magnitudes (K = 64 or 96, terms O(1): about 1e-6), and two layers and
the classifier carry that into logits of size ~1-10 as about 1e-5. A head matched to the wrong kv
head, a residual counted twice, a missing all-reduce or a RoPE layout lost move logits by O(0.1-1).
Greedy tokens must be equal; a step whose top two logits (unsharded) are within 1e-3 of each other
would be a near tie, where either token is right: the comparison stops there (the seeds here have
none: the smallest margin of the four models is 0.03).
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from grader.tasks import PythonTask

TASK = PythonTask(
    lab="lab6",
    number="05",
    title="tensor-parallel LLaMA on the CPU",
    sources=["kiln_tp/shard.py"],
    packages=["kiln_tp", "../lab5/kiln_llm", "../lab5/llama", "../lab4/kiln"],
    builds_on=[
        "../lab4/kiln/cpu.py",
        "../lab4/kiln/planner.py",
        "../lab5/kiln_llm/cpu.py",
        "../lab5/llama/model.py",
        "../lab5/llama/generate.py",
    ],
    timeout=180,
    mistakes={
        "gqa grouping": "test_shard_slices and test_world2_matches_unsharded[gqa]: a rank's query heads must find "
        "their kv head (h // (H / Hkv)) among the rank's own kv heads",
        "wo by rows": "test_shard_slices: wo (and w2) keep the rank's columns, the inputs its heads produce",
        "residual in the all-reduce": "test_world2_matches_unsharded: an all-reduce after the residual add counts "
        "the residual W times",
        "missing all-reduce": "test_graph_structure (two all_reduce nodes a layer) and the logits at world 2",
        "whole kv cache": "test_local_caches: each rank's caches hold its kv heads only, F[S, Hkv/W, Dh]",
        "rope layout": "test_shard_slices[gqa_interleaved] and test_world2_matches_unsharded[gqa_interleaved]: "
        "a llama2.c-ordered checkpoint",
        "sharded classifier": "test_shard_slices and the logits' shape: output (the classifier) is replicated",
        "indivisible accepted": "test_refuses_indivisible: n_kv_heads 2 or hidden_dim 90 over 4 ranks",
    },
)

TOL = {"rtol": 1e-4, "atol": 1e-4}
NEAR_TIE = 1e-3  # top-2 margin under which either token is right (100 times the expected rounding)
PROMPT = [5, 17, 42, 3, 63]
STEPS = 16

# name: (n_heads, n_kv_heads, rope layout, tied embeddings, seed, world)
MODELS = {
    "gqa": (8, 2, "half", False, 1, 2),
    "gqa_interleaved": (8, 2, "interleaved", False, 1, 2),
    "mha": (4, 4, "half", False, 7, 2),
    "gqa_w4": (8, 4, "interleaved", False, 2, 4),
    "tied": (4, 2, "half", True, 4, 2),  # sliced only: a tied random model repeats its last token
}
WORLD2 = ["gqa", "gqa_interleaved", "mha"]


def make_model(n_heads, n_kv_heads, layout, tied, seed, dim=64, hidden=96):
    """(LlamaConfig, weights): a random 2-layer LLaMA, drawn in the half layout, then converted."""
    import llama
    from llama.checkpoint import expected_shapes

    config = llama.LlamaConfig(
        dim=dim, n_layers=2, n_heads=n_heads, n_kv_heads=n_kv_heads, vocab_size=64, hidden_dim=hidden,
        max_seq_len=64, tie_embeddings=tied,
    )  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for name, shape in expected_shapes(config).items():
        if name == "output" and tied:
            weights[name] = weights["tok_embeddings"]
        elif len(shape) == 1:  # norms: around 1, so a norm left out shows
            weights[name] = 1 + 0.2 * torch.randn(shape, generator=gen)
        else:  # unit-variance outputs: logits O(1)
            weights[name] = torch.randn(shape, generator=gen) / (1 if name == "tok_embeddings" else math.sqrt(shape[1]))
    return llama.convert_rope_layout(config, weights, layout)


_MADE: dict[str, tuple] = {}


def model(name):
    if name not in _MADE:
        _MADE[name] = make_model(*MODELS[name][:-1])
    return _MADE[name]


_REFERENCE: dict[str, dict] = {}


def reference(name):
    """The unsharded model in this process: the prompt's logits, then greedy decode_loop."""
    if name not in _REFERENCE:
        from kiln_tp.model import _Recorded
        from llama.generate import Sampler, decode_loop
        from llama.model import LlamaModel

        m = LlamaModel(*model(name), max_seq=len(PROMPT) + STEPS)
        prefill = m.prefill(PROMPT)
        m.reset()
        rec = _Recorded(m)
        loop = decode_loop(rec, PROMPT, Sampler(0.0), max_new_tokens=STEPS, eos_id=None)
        rows = torch.stack(rec.rows)  # the logits each token was chosen from
        top2 = rows.topk(2, dim=-1).values
        _REFERENCE[name] = {
            "prefill": prefill,
            "steps": rows[1:],
            "tokens": loop.tokens,
            "margins": (top2[:, 0] - top2[:, 1]).tolist(),
        }
    return _REFERENCE[name]


def _launch(tmp_path_factory, names, world):
    from kiln_tp import launch

    path = tmp_path_factory.mktemp(f"tp{world}") / "models.pt"
    torch.save({n: model(n) for n in names}, path)
    from kiln_tp.model import greedy_cases

    return launch(world, greedy_cases, str(path), names, PROMPT, STEPS, timeout=120)


@pytest.fixture(scope="module")
def world2(tmp_path_factory):
    return _launch(tmp_path_factory, WORLD2, 2)


@pytest.fixture(scope="module")
def world4(tmp_path_factory):
    return _launch(tmp_path_factory, ["gqa_w4"], 4)


def compare(name, got):
    """Rank 0's results against the unsharded model's: logits, then tokens up to any near tie."""
    ref = reference(name)
    assert got["prefill"].shape == ref["prefill"].shape, (
        f"{name}: the prompt's logits are {list(got['prefill'].shape)}, the model's {list(ref['prefill'].shape)}"
    )
    torch.testing.assert_close(got["prefill"], ref["prefill"], **TOL, msg=lambda m: f"{name}, the prompt: {m}")
    tie = next((i for i, m in enumerate(ref["margins"]) if m < NEAR_TIE), len(ref["margins"]))
    want, tokens = ref["tokens"][:tie], got["tokens"][:tie]
    assert tokens == want, f"{name}: greedy tokens {got['tokens']}, unsharded {ref['tokens']}"
    n = max(0, min(tie, len(ref["steps"])))  # decode steps fed the same tokens on both sides
    torch.testing.assert_close(
        got["steps"][:n], ref["steps"][:n], **TOL, msg=lambda m: f"{name}, the decode steps' logits: {m}"
    )
    assert got["spread"] <= TOL["atol"] + TOL["rtol"] * float(ref["prefill"].abs().max()), (
        f"{name}: the ranks' logits differ from rank 0's by up to {got['spread']:.3g}"
    )


# --- in this process ----------------------------------------------------------------------------------


@pytest.mark.points(1)
def test_all_reduce_operator():
    import kiln
    import kiln_tp  # noqa: F401 (registers all_reduce)
    from kiln.shapes import ShapeError

    b = kiln.Builder("ar")
    x = b.input("x", (3, 8), "float32")
    g = b.output(b.op("all_reduce", x, op="sum"))
    text = kiln.to_text(g)
    assert re.search(r'= all_reduce\(%\w+\) \{op = "sum"\} : f32\[3, 8\]', text), text
    again = kiln.parse(text)
    again.validate()
    assert kiln.to_text(again) == text
    b = kiln.Builder("bad")
    with pytest.raises(ShapeError, match="op"):
        b.op("all_reduce", b.input("x", (2,), "float32"), op="max")


@pytest.mark.points(2)
def test_refuses_indivisible():
    from kiln_tp.shard import shard_weights

    for (heads, kv, hidden, world), field, value in (
        ((8, 2, 96, 4), "n_kv_heads", 2),
        ((8, 4, 90, 4), "hidden_dim", 90),
        ((4, 4, 96, 8), "n_heads", 4),
    ):
        config, weights = make_model(heads, kv, "half", False, 0, dim=8 * heads, hidden=hidden)
        with pytest.raises(ValueError, match=rf"{field}.*{value}|{value}.*{field}") as e:
            shard_weights(config, weights, 0, world)
        assert str(world) in str(e.value), f"the refusal must name the world ({world}): {e.value}"


@pytest.mark.points(3)
@pytest.mark.parametrize("name", list(MODELS))
def test_shard_slices(name):
    from kiln_tp.shard import ShardConfig, shard_weights

    config, weights = model(name)
    world = MODELS[name][-1]
    dh, hl, kl, fl = config.head_dim, config.n_heads // world, config.n_kv_heads // world, config.hidden_dim // world
    group = config.n_heads // config.n_kv_heads
    for rank in range(world):
        local, lw = shard_weights(config, weights, rank, world)
        assert isinstance(local, ShardConfig) and (local.rank, local.world) == (rank, world)
        got = (local.n_heads, local.n_kv_heads, local.hidden_dim, local.dim, local.head_dim, local.rope_layout)
        assert got == (hl, kl, fl, config.dim, dh, config.rope_layout), f"rank {rank}'s config: {local}"
        assert set(lw) == set(weights), "the checkpoint's names, no more, no fewer"
        heads = list(range(rank * hl, (rank + 1) * hl))
        kv_heads = sorted({h // group for h in heads})  # where the rank's query heads read
        assert kv_heads == list(range(rank * kl, (rank + 1) * kl))

        def rows(w, which, size):
            return torch.cat([w[i * size : (i + 1) * size] for i in which])

        for i in range(config.n_layers):
            p = f"layers.{i}."
            want = {
                "wq": rows(weights[p + "wq"], heads, dh),
                "wk": rows(weights[p + "wk"], kv_heads, dh),
                "wv": rows(weights[p + "wv"], kv_heads, dh),
                "wo": rows(weights[p + "wo"].T, heads, dh).T,
                "w1": weights[p + "w1"][rank * fl : (rank + 1) * fl],
                "w3": weights[p + "w3"][rank * fl : (rank + 1) * fl],
                "w2": weights[p + "w2"][:, rank * fl : (rank + 1) * fl],
            }
            for key, w in want.items():
                t = lw[p + key]
                assert t.shape == w.shape and torch.equal(t, w), (
                    f"rank {rank}'s {p + key}: {list(t.shape)}, not the {list(w.shape)} of "
                    + ("its query heads' rows" if key == "wq" else "its kv heads' rows" if key in "wkwv" else "")
                    + ("its heads' columns" if key == "wo" else "its share of hidden_dim" if key[1] in "123" else "")
                )
        norms = [f"layers.{i}.{n}" for i in range(config.n_layers) for n in ("attention_norm", "ffn_norm")]
        for key in ("tok_embeddings", "norm", "output", *norms):
            assert torch.equal(lw[key], weights[key]), f"{key} is replicated: every rank holds all of it"
        if config.tie_embeddings:
            assert lw["output"] is lw["tok_embeddings"], "a tied classifier stays the embedding's tensor"


@pytest.mark.points(1)
def test_graph_structure():
    import kiln
    from kiln_tp.shard import build_tp_graph, shard_weights

    config, weights = model("gqa")
    local, lw = shard_weights(config, weights, 1, 2)
    g = build_tp_graph(local, lw, n_tokens=5, max_seq=21)
    reduces = g.of_op("all_reduce")
    assert len(reduces) == 2 * config.n_layers, f"{len(reduces)} all_reduce nodes for {config.n_layers} layers"
    assert all(n.attrs == {"op": "sum"} for n in reduces)
    caches = {n.attrs["name"]: n.type.shape for n in g.buffers}
    assert set(caches.values()) == {(21, 1, 8)}, f"the rank's caches: {caches}"
    assert kiln.to_text(kiln.parse(kiln.to_text(g))) == kiln.to_text(g)


# --- on 2 and 4 processes ---------------------------------------------------------------------------


@pytest.mark.points(3)
@pytest.mark.parametrize("name", WORLD2)
def test_world2_matches_unsharded(name, world2):
    compare(name, world2[name])


@pytest.mark.points(2)
def test_world4_matches_unsharded(world4):
    compare("gqa_w4", world4["gqa_w4"])


@pytest.mark.points(2)
def test_local_caches(world2, world4):
    for name, result in [*world2.items(), *world4.items()]:
        config, world = model(name)[0], MODELS[name][-1]
        want = (len(PROMPT) + STEPS, config.n_kv_heads // world, config.head_dim)
        wrong = {k: s for k, s in result["caches"].items() if s != want}
        assert not wrong, f"{name} at world {world}: caches {wrong}, each rank's share is {want}"
        assert len(result["caches"]) == 2 * config.n_layers


def test_tensor_parallel(grade):
    grade(TASK)

"""Deliberately broken lab 6 submissions, written as edits to the reference solutions.

tests/test_broken_variants.py applies each edit, grades the result and expects the verdict given
here, as for the other labs. Task 05 (tensor-parallel LLaMA, its sharding and its graph) is graded
on the CPU with gloo, so its variants are graded on every machine, CI included. Each variant names
its class of mistake, one of those the task's spec lists in `mistakes`.
"""

from __future__ import annotations

from grader.instructor.broken import Variant

SHARD = "kiln_tp/shard.py"

VARIANTS: dict[str, Variant] = {
    "05_tensor_parallel.q_heads_round_robin": Variant(
        SHARD,
        [
            (
                "    q, kv, f = share(local.n_heads * dh), share(local.n_kv_heads * dh), share(local.hidden_dim)",
                "    # query heads dealt out like cards, head h to rank h % world (wo's columns follow them)\n"
                "    q = torch.arange(config.n_heads * dh).view(config.n_heads, dh)[rank::world].reshape(-1)\n"
                "    kv, f = share(local.n_kv_heads * dh), share(local.hidden_dim)",
            )
        ],
        {"wrong"},
        "test_world2_matches_unsharded[gqa]",
        "query heads dealt round-robin (h % world) while kv heads go in blocks: rank 0's head 2 belongs to kv "
        "group 0 at 8 heads over 2, head 6 to group 1, which rank 1 holds",
        mistake="gqa grouping",
    ),
    "05_tensor_parallel.wo_by_rows": Variant(
        SHARD,
        [('out[p + "wo"] = weights[p + "wo"][:, q].contiguous()', 'out[p + "wo"] = weights[p + "wo"][q].contiguous()')],
        {"wrong"},
        "test_shard_slices",
        "wo sliced like wq, by rows (its outputs), instead of by the columns the rank's heads feed",
        mistake="wo by rows",
    ),
    "05_tensor_parallel.residual_inside_the_all_reduce": Variant(
        SHARD,
        [('x = x + all_reduce(linear(a, p + "wo"))', 'x = all_reduce(x + linear(a, p + "wo"))')],
        {"wrong"},
        "test_world2_matches_unsharded",
        "the attention's all-reduce placed after the residual add: every rank's copy of x is summed, W times x",
        mistake="residual in the all-reduce",
    ),
    "05_tensor_parallel.mlp_not_reduced": Variant(
        SHARD,
        [('x = x + all_reduce(linear(g, p + "w2"))', 'x = x + linear(g, p + "w2")')],
        {"wrong"},
        "test_graph_structure",
        "the MLP's down projection not all-reduced: each rank adds only its own columns' partial sum",
        mistake="missing all-reduce",
    ),
    "05_tensor_parallel.whole_kv_cache": Variant(
        SHARD,
        [
            (
                "        n_kv_heads=config.n_kv_heads // world,",
                "        n_kv_heads=config.n_kv_heads,  # k and v are small under GQA: every rank keeps them whole",
            ),
            ('(("wq", q), ("wk", kv), ("wv", kv),', '(("wq", q), ("wk", slice(None)), ("wv", slice(None)),'),
            (
                '        a = b.op("attention", q, kc, vc, pos, scale=dh**-0.5)',
                "        mine = config.n_kv_heads // config.world\n"
                "        rows = {'starts': [0, config.rank * mine, 0], 'ends': [max_seq, (config.rank + 1) * mine, dh]}\n"  # noqa: E501
                "        kc, vc = b.op('slice', kc, **rows), b.op('slice', vc, **rows)  # the rank's kv heads\n"
                '        a = b.op("attention", q, kc, vc, pos, scale=dh**-0.5)',
            ),
        ],
        {"wrong"},
        "test_shard_slices",
        "k and v computed and cached whole on every rank, the rank's kv heads sliced out for attention: right "
        "logits at 8 heads over 2 with W times the cache memory (test_local_caches), but also whole wk/wv "
        "(test_shard_slices) and a local config of 2 heads over 4 kv heads that MHA refuses",
        mistake="whole kv cache",
    ),
    "05_tensor_parallel.interleaved_sliced_as_half": Variant(
        SHARD,
        [
            (
                "from llama.checkpoint import check_weights",
                "from llama.checkpoint import check_weights, convert_rope_layout",
            ),
            (
                "    dh = config.head_dim\n",
                "    dh = config.head_dim\n"
                '    _, weights = convert_rope_layout(config, weights, "half")  # one layout to slice\n',
            ),
        ],
        {"wrong"},
        "gqa_interleaved",
        "the checkpoint brought to the half layout before slicing, the local config still saying interleaved: "
        "RoPE turns the wrong pairs of a llama2.c checkpoint",
        mistake="rope layout",
    ),
    "05_tensor_parallel.classifier_sharded": Variant(
        SHARD,
        [
            (
                "    return local, out\n",
                '    out["output"] = weights["output"][share(config.vocab_size // world)].contiguous()\n'
                "    return local, out\n",
            )
        ],
        {"wrong"},
        "output",
        "the classifier split by vocabulary rows like a column-parallel linear, with no gather of the logits",
        mistake="sharded classifier",
    ),
    "05_tensor_parallel.hidden_dim_not_checked": Variant(
        SHARD,
        [('for field in ("n_heads", "n_kv_heads", "hidden_dim"):', 'for field in ("n_heads", "n_kv_heads"):')],
        {"wrong"},
        "test_refuses_indivisible",
        "hidden_dim not checked: 90 over 4 ranks gives each 22 columns, and 2 of the MLP's columns are dropped",
        mistake="indivisible accepted",
    ),
}

BATCHES = [[name] for name in VARIANTS]  # one task: a grading run holds one variant of it
SANITIZED: list[str] = []
AT_BUILD: list[str] = []
HUGE: list[str] = []
TIMED: list[str] = []

"""Deliberately broken lab 5 submissions, written as edits to the reference solutions.

tests/test_broken_variants.py applies each edit, grades the result and expects the verdict given
here, as for labs 1 to 4. Tasks 01, 04, 05 and 06 (the operators on the CPU, the fusion pass, the
model's graph, generation) are graded on the CPU, so their variants are graded on every machine, CI
included; the kernels' (02, 03) need a GPU. Each variant names its class of mistake, one of those
its task's spec lists in `mistakes`. Besides the first classes (RoPE with the wrong layout, GQA
repeating KV heads wrongly, a softmax that ignores the prefix length; a loader that accepts a
truncated file is given code, which tests/test_lab5_checkpoint.py checks), issue 22's: attributes
read as LLaMA's values (a scale of 1 / sqrt(Dh), an eps of 1e-5), eps outside the square root on
rows of small spread, a softmax without its maximum on scores past 88, scores rounded to f16/bf16,
half-precision models (caches and logits of the wrong dtype), a chain past the fused operator's
input limit, top-p at an exact boundary, an end token of id 0 and tokens streamed only at the end.
A variant of a CPU-graded task that only the task's GPU checks catch says `gpu=True`.
"""

from __future__ import annotations

from grader.instructor.broken import Variant

VARIANTS: dict[str, Variant] = {
    # --- lab 5 task 01 (LLaMA's operators on the CPU), graded on the CPU
    "01_llama_ops.rope_wrong_layout": Variant(
        "kiln_llm/cpu.py",
        [('if node.attrs["layout"] == "half":', 'if node.attrs["layout"] != "half":')],
        {"wrong"},
        "test_rope_both_layouts",
        "the two RoPE layouts swapped: half pairs (j, j + Dh/2) rotated as (2j, 2j + 1) and the other way",
        mistake="rope layout",
    ),
    "01_llama_ops.gqa_h_mod_hkv": Variant(
        "kiln_llm/cpu.py",
        [(".repeat_interleave(group, dim=1)", ".repeat(1, group, 1)")],
        {"wrong"},
        "test_attention_matches_hf",
        "query head h reads kv head h % Hkv instead of h // (H / Hkv)",
        mistake="gqa heads",
    ),
    "01_llama_ops.attends_past_the_prefix": Variant(
        "kiln_llm/cpu.py",
        [
            ("    n = p + t  # rows", "    n = k.shape[0]  # rows"),
            ("<= (p + torch.arange(t))[:, None]", "<= (n - t + torch.arange(t))[:, None]"),
        ],
        {"wrong"},
        "test_attention_matches_hf",
        "the softmax ignores the prefix length: all S cache rows are read, the run's tokens taken as the last T",
        mistake="reads past the prefix",
    ),
    "01_llama_ops.rmsnorm_weight_before_rounding": Variant(
        "kiln_llm/cpu.py",
        [("return w * y.to(x.dtype)", "return (w.float() * y).to(x.dtype)")],
        {"wrong"},
        "test_rmsnorm_matches_hf",
        "RMSNorm multiplies by the weight in fp32 and rounds after: not Hugging Face's order (often one ulp off in"
        " bf16)",
        mistake="rounding order",
    ),
    "01_llama_ops.rope_ignores_pos": Variant(
        "kiln_llm/cpu.py",
        [("p = (int(pos.item()) + torch.arange(t)).float()", "p = torch.arange(t).float()")],
        {"wrong"},
        "test_rope_both_layouts",
        "RoPE turns token t by t, not by pos + t: every decode step sits at position 0",
        mistake="position ignored",
    ),
    "01_llama_ops.kv_update_at_zero": Variant(
        "kiln_llm/cpu.py",
        [("cache[p : p + value.shape[0]].copy_(value)", "cache[: value.shape[0]].copy_(value)")],
        {"wrong"},
        "test_kv_update_at_pos",
        "kv_update writes at row 0 whatever pos says",
        mistake="cache write position",
    ),
    "01_llama_ops.attention_ignores_scale": Variant(
        "kiln_llm/cpu.py",
        [('kf) * node.attrs["scale"]', "kf) * q.shape[-1] ** -0.5")],
        {"wrong"},
        "test_attention_scale_and_large_scores",
        "attention scales the scores by 1 / sqrt(Dh), LLaMA's value, instead of its scale attribute",
        mistake="attribute at its LLaMA value",
    ),
    "01_llama_ops.rmsnorm_eps_outside_the_root": Variant(
        "kiln_llm/cpu.py",
        [
            (
                'y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + node.attrs["eps"])',
                'y = xf / (xf.pow(2).mean(-1, keepdim=True).sqrt() + node.attrs["eps"])',
            )
        ],
        {"wrong"},
        "test_rmsnorm_matches_hf",
        "RMSNorm divides by sqrt(mean(x^2)) + eps: the same at unit scale, twice too large on rows of small spread",
        mistake="small variance",
    ),
    "01_llama_ops.softmax_without_the_max": Variant(
        "kiln_llm/cpu.py",
        [
            (
                "    probs = torch.softmax(scores, dim=-1)  # (H, T, n)\n",
                "    e = scores.exp()  # masked scores give exp(-inf) = 0\n"
                "    probs = e / e.sum(-1, keepdim=True)  # (H, T, n)\n",
            )
        ],
        {"wrong"},
        "test_attention_scale_and_large_scores",
        "the softmax exponentiates the raw scores: exp overflows float32 past 88 and the row becomes NaN",
        mistake="large scores",
    ),
    "01_llama_ops.scores_rounded_to_the_dtype": Variant(
        "kiln_llm/cpu.py",
        [
            (
                'scores = scores.masked_fill(~causal, float("-inf"))',
                'scores = scores.to(q.dtype).float().masked_fill(~causal, float("-inf"))  # scores kept in F',
            )
        ],
        {"wrong"},
        "test_attention_scale_and_large_scores",
        "the scores are rounded to the model's dtype before the softmax: f16 and bf16 lose the weights' digits",
        mistake="precision downgrade",
    ),
    # --- lab 5 task 05 (the LLaMA graph), graded on the CPU
    "05_llama_graph.rope_layout_fixed_half": Variant(
        "llama/model.py",
        [("layout=config.rope_layout", 'layout="half"')],
        {"wrong"},
        "test_prefill_matches_hf",
        "the graph always uses the half layout: a llama2.c (interleaved) checkpoint gets wrong positions",
        mistake="rope layout",
    ),
    "05_llama_graph.no_attention_residual": Variant(
        "llama/model.py",
        [('x = x + linear(a, p + "wo")', 'x = linear(a, p + "wo")')],
        {"wrong"},
        "test_prefill_matches_hf",
        "the attention block's residual is dropped",
        mistake="missing residual",
    ),
    "05_llama_graph.pos_fed_zero": Variant(
        "llama/model.py",
        [("[*tokens, self.pos]", "[*tokens, 0]")],
        {"wrong"},
        "test_prefill_then_decode",
        "every run is fed pos 0: decode overwrites the first cache row and attends only to it",
        mistake="position",
    ),
    "05_llama_graph.prefill_not_shared": Variant(
        "llama/model.py",
        [("self._compile(n_tokens, share_with=self.decoder)", "self._compile(n_tokens)")],
        {"wrong"},
        "test_prefill_then_decode",
        "the prefill executor has caches of its own: decode never sees the prompt",
        mistake="caches not shared",
    ),
    "05_llama_graph.pos_not_advanced": Variant(
        "llama/model.py",
        [("self.pos += n\n", "pass  # pos never advances\n")],
        {"wrong"},
        "test_prefill_matches_hf",
        "pos never advances after a run",
        mistake="position",
    ),
    "05_llama_graph.caches_in_float32": Variant(
        "llama/model.py",
        [
            (
                'b.buffer(p + "k_cache", (max_seq, hkv, dh), config.dtype)',
                'b.buffer(p + "k_cache", (max_seq, hkv, dh))',
            ),
            (
                'b.buffer(p + "v_cache", (max_seq, hkv, dh), config.dtype)',
                'b.buffer(p + "v_cache", (max_seq, hkv, dh))',
            ),
        ],
        {"wrong"},
        "test_half_precision_models",
        "the KV caches are made without the model's dtype (kiln's default, f32): an f16 or bf16 model's"
        " kv_update mixes dtypes",
        mistake="model dtype",
    ),
    "05_llama_graph.logits_in_the_model_dtype": Variant(
        "llama/model.py",
        [
            (
                "            return (logits[-1] if last else logits).float()\n",
                "            return logits[-1] if last else logits\n",
            )
        ],
        {"wrong"},
        "test_half_precision_models",
        "the CPU path returns the graph's logits as they are: f16 or bf16 for a half-precision model, not float32",
        mistake="model dtype",
    ),
    # --- lab 5 task 04 (the fusion pass), graded on the CPU
    "04_fusion.chain_swallows_a_shared_node": Variant(
        "kiln_llm/fusion.py",
        [
            (
                "        if not all(u in members for u in users[p]):\n",
                "        if not any(u in members for u in users[p]):\n",
            )
        ],
        {"wrong"},
        "test_a_node_read_outside_the_chain_stays",
        "a chain takes a node that a reader outside the chain still needs",
        mistake="shared node swallowed",
    ),
    "04_fusion.epilogue_drops_the_residual": Variant(
        "kiln_llm/fusion.py",
        [('replace[n] = ("linear_add", (*lin.inputs, r), {})', 'replace[n] = ("linear", tuple(lin.inputs), {})')],
        {"wrong"},
        "test_fused_layer_computes_what_the_layer_does",
        "the residual add becomes the bare linear: x + linear(a, w) loses x",
        mistake="epilogue operands",
    ),
    "04_fusion.output_swallowed": Variant(
        "kiln_llm/fusion.py",
        [
            (
                "        if p in taken or not fusible(p) or id(p) in outputs:\n",
                "        if p in taken or not fusible(p):\n",
            )
        ],
        {"wrong"},
        "test_an_output_inside_a_chain_stays_an_output",
        "a graph output read inside a chain is swallowed by it",
        mistake="output swallowed",
    ),
    "04_fusion.swiglu_gate_and_up_swapped": Variant(
        "kiln_llm/fusion.py",
        [("(lin.inputs[0], lin.inputs[1], up.inputs[1])", "(lin.inputs[0], up.inputs[1], lin.inputs[1])")],
        {"wrong"},
        "test_fused_layer_computes_what_the_layer_does",
        "linear_swiglu gets (x, w3, w1): silu applied to the up projection",
        mistake="epilogue operands",
    ),
    "04_fusion.chain_ignores_the_input_limit": Variant(
        "kiln_llm/fusion.py",
        [
            (
                "        if len(grown) > limit:\n            continue\n        members.add(p)\n",
                "        members.add(p)\n",
            )
        ],
        {"wrong"},
        "test_a_chain_past_the_input_limit_is_split",
        "a chain grows over every fusible input, however many outside inputs it gathers: a chain over 33"
        " inputs becomes a fused node the operator refuses",
        mistake="input limit",
    ),
    "04_fusion.epilogue_takes_a_broadcast_residual": Variant(
        "kiln_llm/fusion.py",
        [
            (
                '                if lin.op == "linear" and only_for(lin, n) and r.type == lin.type:\n',
                '                if lin.op == "linear" and only_for(lin, n):\n',
            )
        ],
        {"wrong"},
        "test_epilogues_need_their_nodes_alone",
        "any add of a linear becomes linear_add, also one whose residual broadcasts (a bias of (N,)), which"
        " linear_add does not do",
        mistake="broadcast residual",
    ),
    # --- task 02 (the LLaMA kernels), on the GPU
    "02_llama_kernels.attention_ignores_pos": Variant(
        "kiln_llm/kernels/llama.cu",
        [
            (
                "    const int64_t p0 = pos[0];\n    const int64_t last = min64(p0 + n_tokens, cache_rows);",
                "    const int64_t p0 = cache_rows - n_tokens;  // pos ignored: the cache taken as full\n"
                "    const int64_t last = min64(p0 + n_tokens, cache_rows);",
            ),
            (
                "    const int64_t q0 = static_cast<int64_t>(blockIdx.x) * BQ;\n    const int64_t p0 = pos[0];\n",
                "    const int64_t q0 = static_cast<int64_t>(blockIdx.x) * BQ;\n"
                "    const int64_t p0 = cache_rows - n_tokens;  // pos ignored: the cache taken as full\n",
            ),
        ],
        {"wrong"},
        "attention",
        "attention ignores pos and reads the whole cache as if it were full: the garbage rows past the prefix"
        " swamp every output",
        mistake="reads past the prefix",
    ),
    "02_llama_kernels.gqa_modulo": Variant(
        "kiln_llm/kernels/llama.cu",
        [("kvh = h / (heads / kv_heads);", "kvh = h % kv_heads;")],
        {"wrong"},
        "attention",
        "query head h reads kv head h % Hkv instead of h / (H / Hkv): right for H == Hkv, wrong for every grouped case",
        mistake="gqa heads",
    ),
    "02_llama_kernels.rope_layouts_swapped": Variant(
        "kiln_llm/kernels/llama.cu",
        [
            ("(layout == 0 ? j : 2 * j)", "(layout == 1 ? j : 2 * j)"),
            ("(layout == 0 ? half : 1)", "(layout == 1 ? half : 1)"),
        ],
        {"wrong"},
        "rope",
        "layout 0 (half, Hugging Face) rotates interleaved pairs and layout 1 the halves",
        mistake="rope layout",
    ),
    "02_llama_kernels.rmsnorm_no_tail": Variant(
        "kiln_llm/kernels/llama.cu",
        [
            (
                "        const int64_t n = d / VEC<T>;\n",
                "        const int64_t n = d / VEC<T> / NORM_THREADS * NORM_THREADS;  // whole blocks only\n",
            ),
            (
                "        for (int64_t i = threadIdx.x; i < d; i += NORM_THREADS) {\n",
                "        for (int64_t i = threadIdx.x; i < d - d % NORM_THREADS; i += NORM_THREADS) {  // whole\n",
            ),
        ],
        {"wrong"},
        "kiln_rmsnorm",
        "rmsnorm covers only whole blocks of the row: the tail past the last multiple of the block is neither"
        " summed nor written",
        mistake="tail",
    ),
    "02_llama_kernels.kv_update_not_clipped": Variant(
        "kiln_llm/kernels/llama.cu",
        [
            (
                "            if (row >= 0 && row < limit) dst[row * row_units + u] = src[i];\n",
                "            dst[row * row_units + u] = src[i];\n",
            )
        ],
        {"wrong", "crash"},
        "kiln_kv_update",
        "kv_update writes every new row even where pos + t falls outside [0, S)",
        mistake="rows outside the cache",
    ),
    "02_llama_kernels.rope_kv_at_row_t": Variant(
        "kiln_llm/kernels/llama.cu",
        [("            shift = p0 * heads * dh;\n", "            shift = 0;  // row t, not pos + t\n")],
        {"wrong"},
        "kiln_rope_kv_update",
        "the rotated keys land in cache rows 0 .. T - 1 whatever pos is (their angles still use pos + t)",
        mistake="cache write position",
    ),
    "02_llama_kernels.append_reads_the_cache": Variant(
        "kiln_llm/kernels/llama.cu",
        [("min64(end, early ? p0 : last)", "min64(end, last)")],
        {"wrong"},
        "kiln_attention_append",
        "attention_append reads the step's rows back from the caches, which it never writes: k_new and v_new unused",
        mistake="append reads the cache",
    ),
    "02_llama_kernels.rows_strided_by_DH": Variant(
        "kiln_llm/kernels/llama.cu",
        [
            (
                "    const int64_t row_stride = static_cast<int64_t>(kv_heads) * dh;\n",
                "    const int64_t row_stride = static_cast<int64_t>(kv_heads) * DH;  // the instantiation's size\n",
            )
        ],
        {"wrong", "crash"},  # on the general path it reads the wrong rows, and past the cache for late rows
        "attention",
        "both attention kernels stride the caches' rows by DH, the size they were compiled for, where the row's"
        " dh belongs: right at 64 and 128, the wrong rows at every other head dim",
        mistake="head dim of the instantiation",
    ),
    "02_llama_kernels.attention_ignores_scale": Variant(
        "kiln_llm/kernels/llama.cu",
        [
            (
                "            for (int e = 0; e < V; ++e) qv[t][e] *= scale_log2;\n",
                "            for (int e = 0; e < V; ++e) qv[t][e] *= rsqrtf(static_cast<float>(dh)) * LOG2E;\n",
            ),
            (
                "        s_q[r][d] = qd * scale_log2;\n",
                "        s_q[r][d] = qd * (rsqrtf(static_cast<float>(dh)) * LOG2E);  // 1/sqrt(dh)\n",
            ),
        ],
        {"wrong"},
        "scale=0.05",
        "both attention paths scale the scores by 1 / sqrt(Dh), LLaMA's value, instead of the scale they are given",
        mistake="attribute at its LLaMA value",
    ),
    "02_llama_kernels.rmsnorm_eps_outside_the_root": Variant(
        "kiln_llm/kernels/llama.cu",
        [
            (
                "    const float r = rsqrtf(block_sum(sum) / static_cast<float>(d) + eps);\n",
                "    const float r = 1.0f / (sqrtf(block_sum(sum) / static_cast<float>(d)) + eps);\n",
            )
        ],
        {"wrong"},
        "rmsnorm",
        "RMSNorm divides by sqrt(mean(x^2)) + eps: right at unit scale, twice too large on a row of small spread",
        mistake="small variance",
    ),
    "02_llama_kernels.prefill_without_the_max": Variant(
        "kiln_llm/kernels/llama.cu",
        [
            (
                "            const float mn = fmaxf(m[r], warp_max(sv));\n",
                "            const float mn = 0.0f;  // no running maximum: exp2 of the raw scores\n",
            )
        ],
        {"wrong"},
        "scores near 110",
        "the prefill kernel's online softmax never subtracts a maximum: exp2 of scores past 128 (88 in e) is inf"
        " and the row NaN",
        mistake="large scores",
    ),
    "02_llama_kernels.prefill_scores_in_the_dtype": Variant(
        "kiln_llm/kernels/llama.cu",
        [
            (
                "            const float sv = ok ? s[r] : -INFINITY;\n",
                "            const float sv = ok ? to_f(from_f<T>(s[r])) : -INFINITY;  // the score held in T\n",
            )
        ],
        {"wrong"},
        "scores near 110",
        "the prefill kernel rounds each score to the model's dtype before the softmax: f16 and bf16 scores near"
        " 100 lose the weights' digits",
        mistake="precision downgrade",
    ),
    # --- task 03 (the linear kernels), on the GPU
    "03_linear.gemv_k_tail_ignored": Variant(
        "kiln_llm/kernels/linear.cu",
        [("    for (; k0 < k; k0 += STEP) {\n", "    for (; k0 < 0; k0 += STEP) {  // the tail of k is never read\n")],
        {"wrong"},
        "kiln_linear_f32",
        "the GEMV reads only whole pipeline stages of k: at k = 1 every sum is 0, and k = 1000 loses its tail",
        mistake="k tail",
    ),
    "03_linear.gemm_k_tail_ignored": Variant(
        "kiln_llm/kernels/linear.cu",
        [
            (
                "    const int64_t steps = (k + TC_BK - 1) / TC_BK;\n",
                "    const int64_t steps = k / TC_BK;  // whole steps only\n",
            )
        ],
        {"wrong"},
        "kiln_linear_f16",
        "the tensor-core GEMM drops the last k % 32 products",
        mistake="k tail",
    ),
    "03_linear.prefill_off_the_tensor_cores": Variant(
        "kiln_llm/kernels/linear.cu",
        [
            (
                "        launch_gemm<T, EPI>(vec, out, x, w, extra, m, n, k, stream);\n",
                "        launch_gemm<T, EPI>(false, out, x, w, extra, m, n, k, stream);\n",
            )
        ],
        {"rule violation"},
        "tensor-core instruction",
        "prefill always takes the CUDA-core GEMM: the tensor-core kernel is compiled, reached in the source and"
        " never launched (a text rule on mma_sync passed it)",
        mistake="tensor cores compiled, not used",
    ),
    "03_linear.epilogue_add_skipped": Variant(
        "kiln_llm/kernels/linear.cu",
        [
            (
                "                out[idx] = finish<T, EPI>(acc[i][r], acc[i][ROWS * (NW - 1) + r], extra, idx);\n",
                "                out[idx] = finish<T, EPI == 1 ? 0 : EPI>(acc[i][r], acc[i][ROWS * (NW - 1) + r],"
                " extra, idx);\n",
            )
        ],
        {"wrong"},
        "add",
        "the decode GEMV never adds the residual: epilogue 1 returns x @ w.T",
        mistake="epilogue",
    ),
    "03_linear.swiglu_reads_w_twice": Variant(
        "kiln_llm/kernels/linear.cu",
        [
            (
                "        rows[s] = s < ROWS ? w.row(rr, k) : extra + rr * k;\n",
                "        rows[s] = w.row(rr, k);\n",
            ),
            (
                "                if (inside) src = (r < BN ? w : w3) + gc * k + gk;\n",
                "                if (inside) src = (r < BN ? w : w) + gc * k + gk;\n",
            ),
        ],
        {"wrong"},
        "swiglu",
        "swiglu multiplies silu(x @ w.T) by x @ w.T instead of x @ w3.T",
        mistake="epilogue",
    ),
    "03_linear.gemv_last_rows_unwritten": Variant(
        "kiln_llm/kernels/linear.cu",
        [
            (
                "    const int64_t blocks = (n + rows_per_block - 1) / rows_per_block;\n",
                "    const int64_t blocks = n / rows_per_block;  // the last n % rows_per_block rows get no block\n",
            )
        ],
        {"wrong"},
        "kiln_linear_f32",
        "the GEMV launches n / rows_per_block blocks: the last rows stay unwritten when n is not a multiple",
        mistake="last rows",
    ),
    "03_linear.stack_read_as_one_matrix": Variant(
        "kiln_llm/kernels/linear.cu",
        [
            (
                "        rows[s] = s < ROWS ? w.row(rr, k) : extra + rr * k;\n",
                "        rows[s] = s < ROWS ? w.w + rr * k : extra + rr * k;\n",
            )
        ],
        {"wrong"},
        "kiln_rmsnorm_linear_qkv",
        "the GEMV finds row r of w at w.w + r * k: right for one matrix, but the stacked q, k and v weights"
        " are three, and the rows past wq's are read from whatever memory follows it",
        mistake="stacked weights",
    ),
    "03_linear.norm_sum_of_one_lane": Variant(
        "kiln_llm/kernels/linear.cu",
        [
            (
                "            for (int off = 16; off > 0; off /= 2)"
                " ss[i] += __shfl_xor_sync(0xffffffffu, ss[i], off);\n",
                "",
            )
        ],
        {"wrong"},
        "kiln_rmsnorm_linear",
        "the RMSNorm prologue scales each lane's share of the sums by the norm of that lane's packets of x"
        " alone: the sum of squares is never reduced over the warp",
        mistake="warp reduction",
    ),
    "03_linear.prologue_eps_hard_coded": Variant(
        "kiln_llm/kernels/linear.cu",
        [
            (
                "            const float r = rsqrtf(ss[i] / static_cast<float>(k) + eps);\n",
                "            const float r = rsqrtf(ss[i] / static_cast<float>(k) + 1e-5f);  // LLaMA's eps\n",
            )
        ],
        {"wrong"},
        "eps 0.001",
        "the RMSNorm prologue adds LLaMA's eps 1e-5 whatever eps it is given",
        mistake="attribute at its LLaMA value",
    ),
    # --- task 06 (generation), on the CPU
    "06_generate.top_p_in_vocabulary_order": Variant(
        "llama/generate.py",
        [
            (
                "        sorted_p, order = torch.sort(probs, descending=True)\n",
                "        sorted_p, order = probs, torch.arange(probs.numel())  # in vocabulary order\n",
            )
        ],
        {"wrong"},
        "test_top_p_keeps_exactly_the_nucleus",
        "top-p accumulates mass in vocabulary order, not by probability: it keeps unlikely tokens past the"
        " nucleus and drops likely ones",
        mistake="top-p order",
    ),
    "06_generate.sampling_ignores_the_seed": Variant(
        "llama/generate.py",
        [
            (
                "        return int(torch.multinomial(self.distribution(logits), 1, generator=self.generator))\n",
                "        return int(torch.multinomial(self.distribution(logits), 1))  # torch's global generator\n",
            )
        ],
        {"wrong"},
        "test_same_seed_same_tokens_other_seed_differs",
        "draws with torch's global generator: the same seed gives other text once anything else used it",
        mistake="global generator",
    ),
    "06_generate.top_p_keeps_one_past_the_boundary": Variant(
        "llama/generate.py",
        [
            (
                "before = torch.cumsum(sorted_p, dim=0) - sorted_p\n        kept = torch.where(before < self.top_p,",
                "before = torch.cumsum(sorted_p, dim=0) - sorted_p\n        kept = torch.where(before <= self.top_p,",
            )
        ],
        {"wrong"},
        "test_top_p_exact_boundaries",
        "top-p keeps a token whose preceding mass equals top_p exactly: one token more than the nucleus when a"
        " prefix reaches top_p on the dot",
        mistake="top-p boundary",
    ),
    "06_generate.end_token_zero_never_stops": Variant(
        "llama/generate.py",
        [("        if eos_id is not None and token == eos_id:\n", "        if eos_id and token == eos_id:\n")],
        {"wrong"},
        "test_decode_loop_end_token_zero",
        "the end test reads eos_id's truth: a tokenizer whose end token is id 0 never stops",
        mistake="end token 0",
    ),
    "06_generate.on_token_after_the_loop": Variant(
        "llama/generate.py",
        [
            ("        if on_token is not None:\n            on_token(token)\n", ""),
            (
                '    return out\n    # ~ raise NotImplementedError("lab5/06: decode_loop")',
                "    if on_token is not None:  # the tokens streamed once they are all known\n"
                "        for t in out.tokens:\n            on_token(t)\n"
                '    return out\n    # ~ raise NotImplementedError("lab5/06: decode_loop")',
            ),
        ],
        {"wrong"},
        "test_on_token_fires_as_each_token_is_chosen",
        "on_token gets every token, but only after the loop: nothing is streamed while the model generates",
        mistake="late streaming",
    ),
    "06_generate.softmax_in_the_logits_dtype": Variant(
        "llama/generate.py",
        [
            (
                'logits = logits.detach().to("cpu", torch.float32).reshape(-1)  # (V,)',
                'logits = logits.detach().to("cpu").reshape(-1)  # (V,)',
            )
        ],
        {"wrong"},
        "test_half_precision_logits",
        "the distribution is computed in the logits' dtype: f16 or bf16 probabilities, not float32",
        mistake="half logits",
    ),
    "05_llama_graph.gpu_decode_never_advances_pos": Variant(
        "llama/model.py",
        [
            (
                "            row = self.step.replay(executor.stream, tokens[0], self.pos)\n            self.pos += 1\n",
                "            row = self.step.replay(executor.stream, tokens[0], self.pos)\n",
            )
        ],
        {"wrong"},
        "test_gpu_steps_match_the_cpu",
        "the GPU decode step (the captured step graphs) never advances pos: every step writes and attends at the"
        " same cache row; the CPU path is right",
        mistake="gpu decode position",
        gpu=True,  # only the task's GPU checks run the captured decode step
    ),
}


# one grading run per batch; a batch holds each task at most once
BATCHES = [
    [
        "01_llama_ops.rope_wrong_layout",
        "05_llama_graph.rope_layout_fixed_half",
        "04_fusion.chain_swallows_a_shared_node",
        "02_llama_kernels.attention_ignores_pos",
        "03_linear.gemv_k_tail_ignored",
        "06_generate.top_p_in_vocabulary_order",
    ],
    [
        "01_llama_ops.gqa_h_mod_hkv",
        "05_llama_graph.no_attention_residual",
        "04_fusion.epilogue_drops_the_residual",
        "02_llama_kernels.gqa_modulo",
        "03_linear.gemm_k_tail_ignored",
        "06_generate.sampling_ignores_the_seed",
    ],
    [
        "01_llama_ops.attends_past_the_prefix",
        "05_llama_graph.pos_fed_zero",
        "04_fusion.output_swallowed",
        "02_llama_kernels.rope_layouts_swapped",
        "03_linear.epilogue_add_skipped",
        "06_generate.top_p_keeps_one_past_the_boundary",
    ],
    [
        "01_llama_ops.rmsnorm_weight_before_rounding",
        "05_llama_graph.prefill_not_shared",
        "04_fusion.swiglu_gate_and_up_swapped",
        "02_llama_kernels.rmsnorm_no_tail",
        "03_linear.swiglu_reads_w_twice",
        "06_generate.end_token_zero_never_stops",
    ],
    [
        "01_llama_ops.rope_ignores_pos",
        "05_llama_graph.pos_not_advanced",
        "04_fusion.chain_ignores_the_input_limit",
        "02_llama_kernels.kv_update_not_clipped",
        "03_linear.gemv_last_rows_unwritten",
        "06_generate.on_token_after_the_loop",
    ],
    [
        "01_llama_ops.kv_update_at_zero",
        "05_llama_graph.caches_in_float32",
        "04_fusion.epilogue_takes_a_broadcast_residual",
        "02_llama_kernels.rope_kv_at_row_t",
        "03_linear.norm_sum_of_one_lane",
        "06_generate.softmax_in_the_logits_dtype",
    ],
    [
        "01_llama_ops.attention_ignores_scale",
        "05_llama_graph.logits_in_the_model_dtype",
        "02_llama_kernels.append_reads_the_cache",
        "03_linear.stack_read_as_one_matrix",
    ],
    [
        "01_llama_ops.rmsnorm_eps_outside_the_root",
        "02_llama_kernels.attention_ignores_scale",
        "03_linear.prologue_eps_hard_coded",
    ],
    [
        "01_llama_ops.softmax_without_the_max",
        "02_llama_kernels.rmsnorm_eps_outside_the_root",
        "03_linear.prefill_off_the_tensor_cores",
    ],
    ["01_llama_ops.scores_rounded_to_the_dtype", "02_llama_kernels.prefill_without_the_max"],
    ["02_llama_kernels.prefill_scores_in_the_dtype"],
    ["02_llama_kernels.rows_strided_by_DH"],
    ["05_llama_graph.gpu_decode_never_advances_pos"],
]
SANITIZED: list[str] = []
AT_BUILD: list[str] = []
HUGE: list[str] = []
TIMED: list[str] = []

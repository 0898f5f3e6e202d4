"""Honest lab 7 solutions written differently from the reference: each must pass under every seed.

tests/test_honest_alternatives.py grades each one (grader/instructor/honest.py) with several values
of GRADER_SEED, on a GPU. They are edits to the reference solutions, so they follow it; each changes
what a student could legitimately choose otherwise.
"""

from __future__ import annotations

from grader.instructor.honest import Alternative

SRC = "01_cross_entropy.cu"

# the reference's first pass: one read of the row folded into an online (max, sum)
ONLINE_PASS = (
    "    MaxSum a{-FLT_MAX, 0.0f};\n"
    "    for (int j = tid; j < head; j += THREADS) a = fold(a, to_float(x[j]));\n"
    "    for (int i = tid; i < packs; i += THREADS)"
    " a = fold(a, *reinterpret_cast<const P*>(x + head + (size_t)i * N));\n"
    "    for (int j = tail + tid; j < V; j += THREADS) a = fold(a, to_float(x[j]));\n"
    "    a = block_merge<THREADS>(a, scratch);\n"
)

# the classic three passes: the max, then the sum of exp(x - max) (expf, no rescaling), then the
# gradient; the block's pairs are merged with the same block_merge (a sum of 0 carries the max alone)
TWO_PASSES = (
    "    float mx = -FLT_MAX;\n"
    "    for (int j = tid; j < head; j += THREADS) mx = fmaxf(mx, to_float(x[j]));\n"
    "    for (int i = tid; i < packs; i += THREADS) {\n"
    "        const P p = *reinterpret_cast<const P*>(x + head + (size_t)i * N);\n"
    "        for (int k = 0; k < N; ++k) mx = fmaxf(mx, to_float(p.v[k]));\n"
    "    }\n"
    "    for (int j = tail + tid; j < V; j += THREADS) mx = fmaxf(mx, to_float(x[j]));\n"
    "    const float m = block_merge<THREADS>(MaxSum{mx, 0.0f}, scratch).m;\n"
    "    __syncthreads();  // scratch is used again below\n"
    "    float s = 0.0f;\n"
    "    for (int j = tid; j < head; j += THREADS) s += expf(to_float(x[j]) - m);\n"
    "    for (int i = tid; i < packs; i += THREADS) {\n"
    "        const P p = *reinterpret_cast<const P*>(x + head + (size_t)i * N);\n"
    "        for (int k = 0; k < N; ++k) s += expf(to_float(p.v[k]) - m);\n"
    "    }\n"
    "    for (int j = tail + tid; j < V; j += THREADS) s += expf(to_float(x[j]) - m);\n"
    "    const MaxSum a = block_merge<THREADS>(MaxSum{m, s}, scratch);\n"
)

ALTERNATIVES: dict[str, Alternative] = {
    "01_cross_entropy.one_warp_per_row": Alternative(
        SRC,
        [("    if (V <= 2048) {\n", "    if (true) {  // one warp per row, whatever V\n")],
        "one warp per row for every V: a lane chains 1000 Packs of a 128256-wide row before the shuffles",
    ),
    "01_cross_entropy.max_then_sum": Alternative(
        SRC,
        [(ONLINE_PASS, TWO_PASSES)],
        "no online softmax: the row read three times (max, sum of exp, gradient), expf instead of __expf",
    ),
}

# --- task 02: layer norm and RMSNorm backward ---------------------------------------------------

SRC_02 = "02_norm_backward.cu"

ALTERNATIVES.update(
    {
        "02_norm_backward.block_per_row": Alternative(
            SRC_02,
            [("    if (C <= 768) {  // a warp per row", "    if (false) {  // a warp per row")],
            "a 256-thread block per row for every C up to 4096, never a warp: the row sums go through shared"
            " memory and a barrier, the column sums need no combining across teams",
        ),
        "02_norm_backward.fixed_slices_one_chain": Alternative(
            SRC_02,
            [
                (
                    "    const int wave = std::max(1, std::min(MAX_PARTIALS, sms * per_sm));",
                    "    const int wave = MAX_PARTIALS + 0 * sms * per_sm;  // 512 slices, whatever the GPU",
                ),
                (
                    "for (int b = ty; b < parts; b += WARP) s += src[(size_t)b * C + c];",
                    "if (ty == 0) for (int b = 0; b < parts; ++b) s += src[(size_t)b * C + c];  // one chain",
                ),
            ],
            "MAX_PARTIALS slices of rows whatever the GPU (two waves where it holds fewer blocks), and each"
            " column's partial rows added by one thread in one chain of up to 512 additions",
        ),
    }
)

# --- task 03: matmul backward through cuBLASLt's epilogues -------------------------------------

MB = "03_matmul_backward.cu"
MB_PLAIN_PRODUCTS = (
    "    CUDA_CHECK(matmul_lt(lt, CUBLAS_OP_N, CUBLAS_OP_N, K, N, M, W, K, dy, M, dx, K,\n"
    "                         CUBLASLT_EPILOGUE_DEFAULT, nullptr, nullptr, 0, stream));\n"
    "    // dW (M, K) is dWᵀ (K, M) = xᵀ (K, N) · dy (N, M): x's memory is xᵀ, ld K; dy is its memory dyᵀ\n"
    "    // read transposed. k runs over the N rows, and B is dy: BGRADB sums op(B) over k, one value per\n"
    "    // column of D, db (M,)\n"
    "    CUDA_CHECK(matmul_lt(lt, CUBLAS_OP_N, CUBLAS_OP_T, K, M, N, x, K, dy, M, dW, K,\n"
    "                         CUBLASLT_EPILOGUE_BGRADB, db, nullptr, 0, stream));\n"
)
MB_GELU_PRODUCTS = (
    "    CUDA_CHECK(matmul_lt(lt, CUBLAS_OP_N, CUBLAS_OP_N, K, N, M, W, K, dy, M, dh, K,\n"
    "                         dgelu, dbh, h, K, stream));\n"
    "    // dWᵀ (K, M) = aᵀ (K, N) · dy (N, M), db by BGRADB as in linear_backward_bf16\n"
    "    CUDA_CHECK(matmul_lt(lt, CUBLAS_OP_N, CUBLAS_OP_T, K, M, N, a, K, dy, M, dW, K,\n"
    "                         CUBLASLT_EPILOGUE_BGRADB, db, nullptr, 0, stream));\n"
)


def _swapped(products: str) -> str:
    """The two matmuls of an entry in the other order: the weight gradient (and db) first."""
    first, second = products.split("    // d", 1)
    return "    // d" + second + first


ALTERNATIVES.update(
    {
        "03_matmul_backward.weight_gradient_first": Alternative(
            MB,
            [(MB_PLAIN_PRODUCTS, _swapped(MB_PLAIN_PRODUCTS)), (MB_GELU_PRODUCTS, _swapped(MB_GELU_PRODUCTS))],
            "both entries run the weight gradient's matmul (with db) before the input gradient's: the two"
            " products are independent, so their order is the author's",
        ),
        "03_matmul_backward.small_workspace_several_algorithms": Alternative(
            MB,
            [
                (
                    "    const uint64_t workspace = lt->workspace_bytes;\n",
                    "    const uint64_t workspace = 4u << 20;  // 4 MiB: the heuristic picks within it\n",
                ),
                (
                    "    cublasLtMatmulHeuristicResult_t best = {};\n"
                    "    int found = 0;\n"
                    "    CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt->handle, lt_d.op, lt_d.a, lt_d.b, lt_d.d,"
                    " lt_d.d, lt_d.pref, 1,\n"
                    "                                                &best, &found));\n"
                    "    if (found == 0) return cudaErrorNotSupported;\n",
                    "    cublasLtMatmulHeuristicResult_t results[4] = {};\n"
                    "    int found = 0;\n"
                    "    CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt->handle, lt_d.op, lt_d.a, lt_d.b, lt_d.d,"
                    " lt_d.d, lt_d.pref, 4,\n"
                    "                                                results, &found));\n"
                    "    int pick = -1;  // the first the heuristic ranks that fits the 4 MiB asked for\n"
                    "    for (int i = 0; i < found && pick < 0; ++i)\n"
                    "        if (results[i].state == CUBLAS_STATUS_SUCCESS && results[i].workspaceSize <= workspace)\n"
                    "            pick = i;\n"
                    "    if (pick < 0) return cudaErrorNotSupported;\n"
                    "    const cublasLtMatmulHeuristicResult_t best = results[pick];\n",
                ),
            ],
            "a workspace of 4 MiB instead of 32 (the heuristic then leaves out the algorithms that need more:"
            " another algorithm, other bits of the sums) and four of its results asked for, the first that fits"
            " taken",
        ),
    }
)

# --- task 05: the multi-tensor AdamW ----------------------------------------------------------

SRC05 = "05_adamw.cu"
TABLE = (
    "    // the table: thread tid counts the chunks of tensors [lo, hi), the block scans the counts\n"
    "    const int per = (n + THREADS - 1) / THREADS;\n"
    "    const int lo = min(n, tid * per), hi = min(n, lo + per);\n"
    "    long long own = 0;\n"
    "    for (int i = lo; i < hi; ++i) own += (sizes[i] + CHUNK - 1) / CHUNK;\n"
    "    long long at = block_exclusive_scan(own, warp_totals);\n"
    "    for (int i = lo; i < hi; ++i) {\n"
    "        first[i] = at;\n"
    "        at += (sizes[i] + CHUNK - 1) / CHUNK;\n"
    "    }\n"
    "    if (tid == THREADS - 1) first[n] = at;  // the last thread's running sum ends at the total\n"
    "    __syncthreads();\n"
    "    const long long chunks = first[n];\n"
)
SEARCH = (
    "        int a = 0, b = n;  // first[a] <= c < first[b]\n"
    "        while (b - a > 1) {\n"
    "            const int mid = (a + b) / 2;\n"
    "            if (first[mid] <= c) a = mid;\n"
    "            else b = mid;\n"
    "        }\n"
    "        const int t = a;\n"
)
CHUNK_LOOP = "    for (long long c = blockIdx.x; c < chunks; c += gridDim.x) {\n"
BEGIN = "        const int64_t begin = (c - first[t]) * (int64_t)CHUNK;\n"

ALTERNATIVES.update(
    {
        "05_adamw.a_row_of_blocks_per_tensor": Alternative(
            SRC05,
            [
                (TABLE, "    const int t = blockIdx.y;  // row t of the grid updates tensor t: no table\n"),
                (CHUNK_LOOP, "    for (long long c = blockIdx.x; c * CHUNK < sizes[t]; c += gridDim.x) {\n"),
                (SEARCH, ""),
                (BEGIN, "        const int64_t begin = c * (int64_t)CHUNK;\n"),
                (
                    "    const size_t shared = (size_t)(n + 1) * sizeof(long long);\n",
                    "    const size_t shared = (size_t)(n + 1) * sizeof(long long);\n"
                    "    int sms = 0;\n"
                    "    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));\n"
                    "    const dim3 grid(2 * sms, n);  // 2 blocks an SM for every tensor; most exit at once\n",
                ),
                ("<<<blocks, THREADS, shared, stream>>>", "<<<grid, THREADS, shared, stream>>>"),
            ],
            "no chunk table: a 2-D grid, row t for tensor t, each row walking its tensor's chunks (n rows of"
            " 2 x SMs blocks, in one launch); the blocks of small tensors find no work and exit",
        ),
        "05_adamw.linear_search_scalar_lerp": Alternative(
            SRC05,
            [
                (
                    SEARCH,
                    "        int t = 0;  // the last tensor whose first chunk is at or before c\n"
                    "        while (first[t + 1] <= c) ++t;\n",
                ),
                ("        if (!alike) {", "        if (true) {  // element by element everywhere"),
                (
                    "    m = fmaf(h.beta1, m, h.one_minus_beta1 * g);\n"
                    "    v = fmaf(h.beta2, v, h.one_minus_beta2 * g * g);\n",
                    "    m = m + h.one_minus_beta1 * (g - m);  // torch's lerp form\n"
                    "    v = v + h.one_minus_beta2 * (g * g - v);\n",
                ),
            ],
            "a chunk's tensor found by a linear walk of the table, no Packs (every element loaded on its own),"
            " and m, v in torch's lerp form m + (1 - beta1)(g - m)",
        ),
    }
)

# --- task 04: flash attention backward -----------------------------------------------------------

SRC04 = "04_attention_backward.cu"

ALTERNATIVES.update(
    {
        "04_attention_backward.four_warps_scalar_atomics": Alternative(
            SRC04,
            [
                ("using Bwd64 = Bwd<64, 8, 64>;\n", "using Bwd64 = Bwd<64, 4, 64>;  // 64 keys a block\n"),
                ("using Bwd128 = Bwd<128, 8, 16>;\n", "using Bwd128 = Bwd<128, 4, 16>;\n"),
                (
                    "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900\n"
                    "            atomicAdd(reinterpret_cast<float2*>",
                    "#if 0  // one float at a time on every card\n            atomicAdd(reinterpret_cast<float2*>",
                ),
            ],
            "blocks of 4 warps and 64 keys (twice the blocks, each query tile read by twice as many of them), and"
            " dQ added one float at a time instead of float2 atomics",
        ),
        "04_attention_backward.natural_log_units": Alternative(
            SRC04,
            [
                ("LSE[q0 + tid] * LOG2E : 0.0f;", "LSE[q0 + tid] : 0.0f;  // natural-log units"),
                ("    const float c = scale * LOG2E;", "    const float c = scale;"),
                (
                    "float p = exp2f(fmaf(s[j][2 * h + e], c, -l2));",
                    "float p = expf(fmaf(s[j][2 * h + e], c, -l2));",
                ),
                ("    static constexpr bool HOLD_KV = D <= 64;\n", "    static constexpr bool HOLD_KV = false;\n"),
            ],
            "P = expf(S scale - LSE) in natural-log units instead of exp2f with LSE times log2(e), and K's and"
            " V's fragments read from shared memory at every query tile instead of kept in registers",
        ),
    }
)

# --- task 06: the GPT step through the kernels ---------------------------------------------------------

ALTERNATIVES.update(
    {
        "06_gpt_step.grads_by_autograd_grad": Alternative(
            "gpt/train.py",
            [
                (
                    "        self.grads.zero_()  # autograd adds into each .grad: one memset for them all\n"
                    "        loss = model.loss(self.cfg, self.params, x, y, self.logits_hook)\n"
                    "        loss.backward()\n",
                    "        loss = model.loss(self.cfg, self.params, x, y, self.logits_hook)\n"
                    "        names = list(self.params)\n"
                    "        grads = torch.autograd.grad(loss, [self.params[n] for n in names])\n"
                    "        torch._foreach_copy_([self.grad(n) for n in names], list(grads))  # overwritten\n",
                )
            ],
            "the gradients from torch.autograd.grad, copied over the arena's views (nothing to zero), instead of"
            " autograd adding into each .grad",
        ),
        "06_gpt_step.finite_by_the_gradient_norm": Alternative(
            "gpt/train.py",
            [
                (
                    '        largest = torch.linalg.vector_norm(self.grads, float("inf")).float()\n',
                    "        largest = torch.linalg.vector_norm(self.grads, dtype=torch.float32)  # the 2-norm\n",
                )
            ],
            "the gradients judged by their global norm in float32 (a NaN or an inf anywhere makes it one), as a"
            " clipping step would compute it anyway",
        ),
        "06_gpt_step.loss_gradient_as_written": Alternative(
            "gpt/ops.py",
            [
                (
                    "    return torch._foreach_mul([dlogits], dloss.to(dlogits.dtype))[0], None\n",
                    "    return dlogits * dloss, None\n",
                )
            ],
            "the loss's backward as the chain rule writes it, a bf16 tensor times a float32 scalar: torch's"
            " casting kernel, the same bits, slower",
        ),
        "06_gpt_step.c_fc_bias_gradient_summed_twice": Alternative(
            "gpt/ops.py",
            [
                (
                    '    _call("gelu_linear_backward_bf16", a, h, weight, dy, dh, dweight, dbias, None, N, K, M,'
                    " kernels.stream())\n",
                    "    dbh = h.new_empty((K,))  # c_fc's bias gradient, which c_fc's own backward computes again\n"
                    '    _call("gelu_linear_backward_bf16", a, h, weight, dy, dh, dweight, dbias, dbh, N, K, M,'
                    " kernels.stream())\n",
                )
            ],
            "task 03's GELU entry asked for dbh too, into a buffer nobody reads (DGELU_BGRAD): slower, the same"
            " gradients",
        ),
        "06_gpt_step.finite_element_by_element": Alternative(
            "gpt/train.py",
            [
                (
                    '        largest = torch.linalg.vector_norm(self.grads, float("inf")).float()\n'
                    "        loss_ok, grads_ok = torch.isfinite(torch.stack([loss, largest])).tolist()\n",
                    "        finite = [torch.isfinite(loss).all(), torch.isfinite(self.grads).all()]\n"
                    "        loss_ok, grads_ok = torch.stack(finite).tolist()\n",
                )
            ],
            "every gradient judged on its own (isfinite, then all): a bool written and read per element, slower"
            " than one reduction, the same answer",
        ),
    }
)

# --- task 07: the step replayed from a CUDA graph ----------------------------------------------------

ALTERNATIVES.update(
    {
        "07_graphed_step.pass_written_out": Alternative(
            "gpt/graphed.py",
            [
                (
                    "        graph = torch.cuda.CUDAGraph()\n"
                    "        with torch.cuda.graph(graph):  # task 06's pass, recorded: it must not synchronise\n"
                    "            static_loss = super().forward_backward(static_x, static_y)\n",
                    "        from gpt import model\n\n"
                    "        graph = torch.cuda.CUDAGraph()\n"
                    "        with torch.cuda.graph(graph):\n"
                    "            self.grads.zero_()\n"
                    "            loss = model.loss(self.cfg, self.params, static_x, static_y)\n"
                    "            loss.backward()\n"
                    "            static_loss = loss.detach()\n",
                ),
                (
                    "        return g.loss.clone()  # the next replay overwrites g.loss\n",
                    "        out = torch.empty_like(g.loss)\n        out.copy_(g.loss)\n        return out\n",
                ),
            ],
            "the captured pass written out (zero the arena, the model's loss, backward) rather than task 06's"
            " forward_backward called inside the capture, and the loss copied into a fresh tensor",
        ),
    }
)

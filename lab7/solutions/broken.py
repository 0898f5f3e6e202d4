"""Deliberately broken lab 7 submissions, written as edits to the reference solutions.

tests/test_broken_variants.py applies each edit, grades the result and expects the verdict given
here (grader/instructor/broken.py). Every one needs a GPU; on a machine without one they are only
compiled. The task's checks run before its cases, so a variant caught by `large_logits`,
`in_place` or `on_the_stream_argument` is named by that check's words.
"""

from __future__ import annotations

from grader.instructor.broken import Variant

SRC = "01_cross_entropy.cu"
PASS1_PACKS = (
    "    for (int i = tid; i < packs; i += THREADS)"
    " a = fold(a, *reinterpret_cast<const P*>(x + head + (size_t)i * N));\n"
)
LOSS = "    if (tid == 0) loss[row] = (a.m - x_t) + logf(a.s);\n"
X_T = "    const float x_t = to_float(x[t]);  // before the barrier below: every write comes after it\n"
END_OF_KERNEL = (
    "            g[j] = from_float<T>(scale * (__expf(to_float(x[j]) - a.m) * inv_s - (j == t ? 1.0f : 0.0f)));\n"
    "    }\n}\n"
)

VARIANTS: dict[str, Variant] = {
    "01_cross_entropy.no_max_subtracted": Variant(
        SRC,
        [
            ("    MaxSum a{-FLT_MAX, 0.0f};\n", "    MaxSum a{0.0f, 0.0f};  // exp(x) itself: the max stays 0\n"),
            ("    if (x > a.m) return", "    if (false) return"),
            ("    if (mx > a.m) {", "    if (false) {"),
        ],
        {"wrong"},
        "logits of mean",
        "sums exp(x) without subtracting the row's max: right for logits of a few units, inf at 1e4",
        mistake="overflow",
    ),
    "01_cross_entropy.forward_only": Variant(
        SRC,
        [("    const float scale = dloss[row];\n", "    const float scale = 0.0f;  // the loss only: no gradient\n")],
        {"wrong"},
        "dlogits",
        "computes the loss and writes zeros into dlogits, as a forward pass would leave them",
        mistake="forward only",
    ),
    "01_cross_entropy.no_one_hot": Variant(
        SRC,
        [(" - (j == t ? 1.0f : 0.0f)", ""), (" - (j0 + k == t ? 1.0f : 0.0f)", "")],
        {"wrong"},
        "dlogits",
        "writes dloss * softmax: the one-hot of the target is never subtracted",
        mistake="no one-hot",
    ),
    "01_cross_entropy.dloss_of_row_0": Variant(
        SRC,
        [("    const float scale = dloss[row];\n", "    const float scale = dloss[0];  // one dloss for all\n")],
        {"wrong"},
        "dlogits",
        "scales every row's gradient by dloss[0], as if the reduction's gradient were one number",
        mistake="dloss per row",
    ),
    "01_cross_entropy.range_before_ignore": Variant(
        SRC,
        [("    if (t == ignore_index || t < 0 || t >= V) {", "    if (t < 0 || t >= V) {  // ignore_index < 0?")],
        {"wrong"},
        "ignore_index=3",
        "recognises an ignored row only by a target outside [0, V): right for -100, wrong when ignore_index"
        " is a token id (3), whose rows then get a loss and a gradient",
        mistake="ignored rows",
    ),
    "01_cross_entropy.target_as_int32": Variant(
        SRC,
        [
            (
                "    const int64_t t = target[row];\n",
                "    const int64_t t = reinterpret_cast<const int*>(target)[row];  // int32: half an int64\n",
            )
        ],
        {"wrong"},
        "",
        "reads the int64 targets as int32: row 1 gets the high word of target[0], row 2 the low word of"
        " target[1], and so on",
        mistake="target as int32",
    ),
    "01_cross_entropy.last_pack_skipped": Variant(
        SRC,
        [(PASS1_PACKS, PASS1_PACKS.replace("i < packs;", "i + 1 < packs;"))],
        {"wrong"},
        "",
        "the first pass stops one pack short (i + 1 < packs): the sum misses up to 4 (8) values of every"
        " row, the second pass still writes them",
        mistake="chunk loop",
    ),
    "01_cross_entropy.no_head": Variant(
        SRC,
        [("    const int head = min(V, head_of<T>(x));\n", "    const int head = 0;  // every row on the grid?\n")],
        {"crash"},
        "misaligned",
        "loads Packs from the start of every row: row r of V = 4099 starts r * 4099 floats in, off the"
        " 16-byte grid, and the 16-byte load faults",
        mistake="row alignment",
    ),
    "01_cross_entropy.one_pack_per_thread": Variant(
        SRC,
        [
            (
                PASS1_PACKS,
                PASS1_PACKS.replace("for (int i = tid; i < packs; i += THREADS)", "if (int i = tid; i < packs)"),
            )
        ],
        {"wrong"},
        "",
        "the first pass folds one Pack per thread and stops: rows longer than the block's THREADS Packs"
        " (4099 and more) lose the rest from the sum",
        mistake="long rows",
    ),
    "01_cross_entropy.bf16_sum": Variant(
        SRC,
        [
            (
                "    for (int k = 0; k < Pack<T>::N; ++k) a.s += __expf(to_float(p.v[k]) - a.m);\n",
                "    for (int k = 0; k < Pack<T>::N; ++k)  // the running sum kept in bf16\n"
                "        a.s = __bfloat162float(__float2bfloat16_rn(a.s + __expf(to_float(p.v[k]) - a.m)));\n",
            )
        ],
        {"wrong"},
        "",
        "keeps each thread's running sum of exp in bf16 (8 bits): terms under 2^-9 of the sum are lost and"
        " the loss is off by far more than float32's tolerance",
        mistake="bf16 accumulation",
    ),
    "01_cross_entropy.target_logit_read_last": Variant(
        SRC,
        [
            (X_T, ""),
            (LOSS, ""),
            (
                END_OF_KERNEL,
                END_OF_KERNEL[: -len("}\n")]
                + "    __syncthreads();  // every gradient written\n"
                + "    if (tid == 0) loss[row] = (a.m - to_float(x[t])) + logf(a.s);\n}\n",
            ),
        ],
        {"wrong"},
        "in place",
        "reads the target's logit for the loss after the gradients are written: right out of place, but in"
        " place x[t] is by then the target's gradient",
        mistake="in place",
    ),
    "01_cross_entropy.default_stream": Variant(
        SRC,
        [(", 0, stream>>>", ">>>")],
        {"wrong"},
        "CUDA graph",
        "launches on the default stream, not on `stream`: right when the caller uses the default stream, but"
        " a capture on another stream fails",
        mistake="wrong stream",
    ),
    "01_cross_entropy.invalid_target_read": Variant(
        SRC,
        [("    if (t == ignore_index || t < 0 || t >= V) {", "    if (t == ignore_index) {")],
        {"wrong", "crash"},
        "",
        "no range check on the target: V reads the next row's first logit, -1 the previous row's last, where"
        " the contract asks for NaN",
        mistake="invalid target",
    ),
    "01_cross_entropy.int_offsets": Variant(
        SRC,
        [
            (
                "    const T* x = logits + row * (size_t)V;\n    T* g = dlogits + row * (size_t)V;\n",
                "    const T* x = logits + (int)row * V;  // 32-bit offsets\n    T* g = dlogits + (int)row * V;\n",
            )
        ],
        {"crash", "wrong"},
        "",
        "row offsets computed in int: past 2^31 elements (row 16744 of 128256) they wrap around",
        huge=True,
        mistake="32-bit offsets",
    ),
}

# --- task 02: layer norm and RMSNorm backward ---------------------------------------------------

SRC_02 = "02_norm_backward.cu"
MEAN_OF_G = "        const float a = RMS ? 0.0f : s.x * inv_c;\n"

VARIANTS.update(
    {
        "02_norm_backward.no_mean_term": Variant(
            SRC_02,
            [(MEAN_OF_G, "        const float a = 0.0f;  // mean_C(g) forgotten\n")],
            {"wrong"},
            "dx",
            "drops mean_C(g) from layer norm's dx: right only where dy * w has a zero mean in every row",
            mistake="mean of g",
        ),
        "02_norm_backward.no_xhat_term": Variant(
            SRC_02,
            [("rs * (g - a - xh * b)", "rs * (g - a)")],
            {"wrong"},
            "dx",
            "drops xhat * mean_C(g * xhat): the gradient that flows through rstd (the variance) is lost",
            mistake="xhat term",
        ),
        "02_norm_backward.weight_ignored": Variant(
            SRC_02,
            [
                ("const float g = dye * to_float(w.v[e]);", "const float g = dye;  // w forgotten"),
                ("const float g = to_float(d.v[e]) * to_float(w.v[e]);", "const float g = to_float(d.v[e]);"),
            ],
            {"wrong"},
            "dx",
            "uses dy for dxhat instead of dy * weight: right only for a weight of ones (a freshly initialised layer)",
            mistake="weight",
        ),
        "02_norm_backward.saved_mean_ignored": Variant(
            SRC_02,
            [("const float mu = RMS ? 0.0f : mean[r];", "const float mu = 0.0f;  // the mean is small anyway?")],
            {"wrong"},
            "dx",
            "never subtracts the saved mean (xhat = x * rstd in layer norm too): rows centred on 1e3 are off"
            " by a thousand units of xhat",
            mistake="saved statistics",
        ),
        "02_norm_backward.rstd_of_first_row": Variant(
            SRC_02,
            [("const float rs = rstd[r];", "const float rs = rstd[first];  // one rstd per block")],
            {"wrong"},
            "dx",
            "reads the block's first row's rstd for every row of its slice: right while each block has one row,"
            " wrong at 600 rows and more",
            mistake="row statistics",
        ),
        "02_norm_backward.rms_mean_term": Variant(
            SRC_02,
            [(MEAN_OF_G, "        const float a = s.x * inv_c;  // RMSNorm too\n")],
            {"wrong"},
            "dx",
            "subtracts mean_C(g) in RMSNorm as in layer norm: RMSNorm never centres x, so its dx has no such term",
            mistake="RMSNorm formula",
        ),
        "02_norm_backward.int_division": Variant(
            SRC_02,
            [("const float inv_c = 1.0f / (float)C;", "const float inv_c = 1 / C;  // int division")],
            {"wrong"},
            "dx",
            "1 / C in int arithmetic: 0 for every C > 1, so both row means vanish and dx = rstd * g",
            mistake="integer division",
        ),
        "02_norm_backward.accumulates": Variant(
            SRC_02,
            [("(blockIdx.y == 0 ? out0 : out1)[col] = v;", "(blockIdx.y == 0 ? out0 : out1)[col] += v;")],
            {"wrong"},
            "dweight",
            "adds the column sums into dweight and dbias (+=) instead of writing them: right only where the"
            " caller zeroed them; the grader fills them with NaN",
            mistake="overwrite",
        ),
        "02_norm_backward.first_partial_only": Variant(
            SRC_02,
            [("for (int b = ty; b < parts; b += WARP)", "for (int b = ty; b < 1; b += WARP)")],
            {"wrong"},
            "dweight",
            "the second kernel adds only the first block's partial row: right for one row, wrong once the rows"
            " are split among blocks",
            mistake="partial rows",
        ),
        "02_norm_backward.bf16_column_sums": Variant(
            SRC_02,
            [
                (
                    "dw[k][e] += dye * xh;",
                    "dw[k][e] = __bfloat162float(__float2bfloat16_rn(dw[k][e] + dye * xh));  // bf16 sum",
                )
            ],
            {"wrong"},
            "dweight",
            "keeps each thread's column sums of dy * xhat in bf16: every addition rounds to 8 bits",
            mistake="bf16 accumulation",
        ),
        "02_norm_backward.atomics": Variant(
            SRC_02,
            [
                ("float* pw = partials + (size_t)blockIdx.x * C;", "float* pw = partials;  // all blocks, one row"),
                ("float* pb = partials + ((size_t)gridDim.x + blockIdx.x) * C;", "float* pb = partials + C;"),
                ("pw[i * W + e] = dw[k][e];", "atomicAdd(&pw[i * W + e], dw[k][e]);"),
                ("pb[i * W + e] = db[k][e];", "atomicAdd(&pb[i * W + e], db[k][e]);"),
                ("pw[c] = cw[c];", "atomicAdd(&pw[c], cw[c]);"),
                ("pb[c] = cb[c];", "atomicAdd(&pb[c], cb[c]);"),
                (
                    "    int parts = 0;\n",
                    "    int parts = 0;\n"
                    "    CUDA_CHECK(cudaMemsetAsync(scratch, 0, (RMS ? 1 : 2) * C * sizeof(float), stream));\n",
                ),
                ("(scratch, dweight, dbias, parts, C);", "(scratch, dweight, dbias, 1, C);  // one row"),
            ],
            {"wrong"},
            "differ",
            "every block adds its column sums into one zeroed row with float atomicAdd: the values are right, but"
            " the order of the additions, and so the last bits, change from run to run",
            mistake="determinism",
        ),
        "02_norm_backward.no_tail_check": Variant(
            SRC_02,
            [("if (C % N == 0 && on_grid(dy)", "if (on_grid(dy)")],
            {"crash", "wrong"},
            "",
            "takes the 16-byte path whenever the pointers are aligned, whatever C: a C that is not a multiple of"
            " the vector width puts row 1 off the grid (a misaligned load) and leaves the last C % W columns out",
            mistake="row alignment",
        ),
        "02_norm_backward.no_scratch_check": Variant(
            SRC_02,
            [(" || scratch_floats < norm_scratch_floats(rows, C, RMS)", "")],
            {"wrong"},
            "cudaErrorInvalidValue",
            "never compares scratch_floats with what the partial rows need: a caller's short scratch is"
            " overrun instead of refused",
            mistake="scratch size",
        ),
        "02_norm_backward.int_offsets": Variant(
            SRC_02,
            [("const size_t base = (size_t)r * C;", "const size_t base = r * C;  // an int product")],
            {"crash", "wrong"},
            "",
            "the row offset r * C computed in int: past 2^31 elements (row 524288 of 4096 columns) it wraps"
            " around to a negative offset",
            huge=True,
            mistake="32-bit offsets",
        ),
        "02_norm_backward.default_stream": Variant(
            SRC_02,
            [("kernel<<<*parts, THREADS, 0, stream>>>", "kernel<<<*parts, THREADS>>>")],
            {"wrong"},
            "CUDA graph",
            "launches the first kernel on the default stream: right when the caller uses the default stream,"
            " but a capture on another stream fails",
            mistake="wrong stream",
        ),
    }
)

# --- task 05: the multi-tensor AdamW ----------------------------------------------------------
# Most are caught first by its check `steps_carried` (five steps against torch.optim.AdamW, whose
# report says where the first wrong element lies); the checks before it defer to it.

SRC05 = "05_adamw.cu"
DENOM = "    const float denom = sqrtf(v) * h.inv_sqrt_bc2 + h.eps;  // sqrt(v / bc2) + eps\n"
UPDATE = "    p = p * h.decay - h.step_size * m / denom;"
CORRECTIONS = (
    "    const double bc1 = 1.0 - std::pow((double)beta1, step);\n"
    "    const double bc2 = 1.0 - std::pow((double)beta2, step);\n"
)
LAUNCH = (
    "    adamw_kernel<G, HAS_WEIGHTS><<<blocks, THREADS, shared, stream>>>"
    "(params, grads, exp_avg, exp_avg_sq, weights,\n"
    "                                                                       offsets, sizes, n, h);\n"
)
CHUNK_LOOP = "    for (long long c = blockIdx.x; c < chunks; c += gridDim.x) {"
TO_BF16 = "__bfloat162float(__float2bfloat16_rn({}))"

VARIANTS.update(
    {
        "05_adamw.eps_inside_the_root": Variant(
            SRC05,
            [(DENOM, "    const float denom = sqrtf(v * h.inv_sqrt_bc2 * h.inv_sqrt_bc2 + h.eps);  // eps inside\n")],
            {"wrong"},
            "step 1 of 5",
            "adds eps under the square root, sqrt(vhat + eps): for gradients of 1e-8 (sqrt(vhat) = 1e-8) the"
            " denominator is 1e-4 instead of 2e-8, and every tensor's update moves by a little",
            mistake="eps inside the root",
        ),
        "05_adamw.no_bias_correction": Variant(
            SRC05,
            [
                (
                    "    h.step_size = (float)((double)lr / bc1);\n"
                    "    h.inv_sqrt_bc2 = (float)(1.0 / std::sqrt(bc2));\n",
                    "    h.step_size = lr;  // no bias correction\n    h.inv_sqrt_bc2 = 1.0f;\n",
                )
            ],
            {"wrong"},
            "step 1 of 5",
            "no bias correction: at step 1 mhat is m = 0.1 g and vhat is v = 1e-3 g^2, an update of 3.16 instead of 1",
            mistake="bias correction",
        ),
        "05_adamw.step_minus_one": Variant(
            SRC05,
            [(CORRECTIONS, CORRECTIONS.replace(", step)", ", step - 1)"))],
            {"wrong"},
            "step 1 of 5",
            "bias corrections 1 - beta^(t - 1), as if `step` counted the steps already made: 0 at step 1 (an"
            " infinite step size), then a little off",
            mistake="step off by one",
        ),
        "05_adamw.l2_decay": Variant(
            SRC05,
            [
                (
                    "    float eps;\n};",
                    "    float eps;\n    float l2;  // weight decay as an L2 term of the gradient\n};",
                ),
                (
                    "    m = fmaf(h.beta1, m, h.one_minus_beta1 * g);\n",
                    "    g = fmaf(h.l2, p, g);  // Adam with L2: wd p joins the gradient\n"
                    "    m = fmaf(h.beta1, m, h.one_minus_beta1 * g);\n",
                ),
                (
                    "    h.decay = (float)(1.0 - (double)lr * (double)weight_decay);\n",
                    "    h.decay = 1.0f;\n    h.l2 = weight_decay;\n",
                ),
            ],
            {"wrong"},
            "exp_avg",
            "Adam with an L2 penalty, not AdamW: wd p is added to the gradient, so it enters m and v and is scaled"
            " by the adaptive denominator instead of decaying the weight",
            mistake="L2 decay",
        ),
        "05_adamw.decay_twice": Variant(
            SRC05,
            [(UPDATE, "    p = p * h.decay * h.decay - h.step_size * m / denom;")],
            {"wrong"},
            "step 1 of 5",
            "decays the parameter twice (once as the formula says, once more as a separate step): off by lr wd |p|",
            mistake="decay twice",
        ),
        "05_adamw.decay_after_the_update": Variant(
            SRC05,
            [(UPDATE, "    p = (p - h.step_size * m / denom) * h.decay;")],
            {"wrong"},
            "",
            "decays after the Adam step, (p - lr u)(1 - lr wd), where torch decays before: off by lr^2 wd |u|,"
            " within the tolerance at lr = 1e-3 and caught by the case at lr = 3e-2, wd = 0.3",
            mistake="decay after the update",
        ),
        "05_adamw.state_not_written": Variant(
            SRC05,
            [
                ("            m[e] = me;\n            v[e] = ve;\n", ""),
                (
                    "            *reinterpret_cast<float4*>(m + e) = mm;\n"
                    "            *reinterpret_cast<float4*>(v + e) = vv;\n",
                    "",
                ),
            ],
            {"wrong"},
            "exp_avg",
            "updates the parameters from the new m and v but never stores them: the next step starts from the old"
            " state",
            mistake="state not written",
        ),
        "05_adamw.tail_dropped": Variant(
            SRC05,
            [("        for (int64_t e = body + 4 * (int64_t)packs + tid; e < end; e += THREADS) scalar(e);\n", "")],
            {"wrong"},
            "of tensor",
            "no scalar tail after the Packs: the last 1 to 3 elements of a tensor (after its head) are never updated",
            mistake="tails",
        ),
        "05_adamw.first_tensor_only": Variant(
            SRC05,
            [(CHUNK_LOOP, CHUNK_LOOP.replace("c < chunks;", "c < first[1];"))],
            {"wrong"},
            "of tensor",
            "walks the chunks of tensor 0 only: the rest of the list keeps its old values",
            mistake="one tensor only",
        ),
        "05_adamw.size_from_offsets": Variant(
            SRC05,
            [
                (
                    "        const int64_t end = min(sizes[t], begin + CHUNK);\n",
                    "        const int64_t end = min(t + 1 < n ? offsets[t + 1] - off : sizes[t], begin + CHUNK);\n",
                )
            ],
            {"wrong"},
            "gap",
            "takes a tensor to end where the next one starts (offsets[t + 1] - offsets[t]), as if the list were"
            " packed end to end: the gap between them is updated too",
            mistake="gaps and offsets",
        ),
        "05_adamw.params_alignment_only": Variant(
            SRC05,
            [
                (
                    "        bool alike = on_grid(m + head, 16) && on_grid(v + head, 16)"
                    " && on_grid(g + head, 4 * sizeof(G));\n"
                    "        if constexpr (HAS_WEIGHTS) alike = alike && on_grid(w + head, 8);\n",
                    "        bool alike = true;  // where params sit on the grid, the others do too?\n",
                )
            ],
            {"crash"},
            "misaligned",
            "takes the params' head for every arena: right while all arenas start on the 16-byte grid, a misaligned"
            " load once the gradients sit one element off it",
            mistake="alignment",
        ),
        "05_adamw.bf16_state": Variant(
            SRC05,
            [
                (
                    DENOM,
                    "    m = " + TO_BF16.format("m") + ";  // the state stored in bf16\n"
                    "    v = " + TO_BF16.format("v") + ";\n" + DENOM,
                )
            ],
            {"wrong"},
            "step 1 of 5",
            "keeps exp_avg and exp_avg_sq in bf16 precision (8 bits): off by up to 2^-9 of each, and the update with"
            " them",
            mistake="bf16 state",
        ),
        "05_adamw.no_master": Variant(
            SRC05,
            [
                (
                    "            float pe = p[e], me = m[e], ve = v[e];\n",
                    "            float pe = HAS_WEIGHTS ? "
                    + TO_BF16.format("p[e]")
                    + " : p[e], me = m[e], ve = v[e];\n",
                ),
                (
                    "            float4 pp = *reinterpret_cast<const float4*>(p + e);\n",
                    "            float4 pp = *reinterpret_cast<const float4*>(p + e);\n"
                    "            if constexpr (HAS_WEIGHTS) {  // the bf16 weight is the parameter\n"
                    "                pp.x = " + TO_BF16.format("pp.x") + ";\n"
                    "                pp.y = " + TO_BF16.format("pp.y") + ";\n"
                    "                pp.z = " + TO_BF16.format("pp.z") + ";\n"
                    "                pp.w = " + TO_BF16.format("pp.w") + ";\n"
                    "            }\n",
                ),
            ],
            {"wrong"},
            "adamw_bf16_master",
            "updates the bf16 weight, not the float32 master: every step starts from a parameter rounded to 8 bits,"
            " and an update of 1e-3 of a weight is lost in the rounding",
            mistake="master copy",
        ),
        "05_adamw.default_stream": Variant(
            SRC05,
            [(", shared, stream>>>", ", shared>>>")],
            {"wrong"},
            "CUDA graph",
            "launches on the default stream, not on `stream`: a capture on another stream fails",
            mistake="wrong stream",
        ),
        "05_adamw.int_offsets": Variant(
            SRC05,
            [
                (
                    "        const int64_t off = offsets[t];\n",
                    "        const int off = (int)offsets[t];  // 32-bit offsets\n",
                )
            ],
            {"crash", "wrong"},
            "",
            "a tensor's offset into the arenas kept in an int: the tensor that starts past 2^31 elements is looked"
            " for 8 GB before the arena",
            huge=True,
            mistake="32-bit offsets",
        ),
        "05_adamw.two_launches": Variant(
            SRC05,
            [
                (
                    CHUNK_LOOP,
                    "    for (long long c = blockIdx.x + block0; c < chunks; c += 2 * (long long)gridDim.x) {",
                ),
                (
                    "const int64_t* __restrict__ sizes, int n, Hyper h) {",
                    "const int64_t* __restrict__ sizes, int n, Hyper h, int block0) {",
                ),
                (
                    LAUNCH,
                    "    for (int half = 0; half < 2; ++half)  // the chunks in two launches of `blocks` blocks\n"
                    "        adamw_kernel<G, HAS_WEIGHTS><<<blocks, THREADS, shared, stream>>>(\n"
                    "            params, grads, exp_avg, exp_avg_sq, weights, offsets, sizes, n, h, half * blocks);\n",
                ),
            ],
            {"rule violation"},
            "the task asks for one",
            "right values from two launches (each walks every other block's chunks): the contract asks for one",
            mistake="more than one launch",
        ),
    }
)

# graded with the cases past 2^31 elements
HUGE: list[str] = [
    "01_cross_entropy.int_offsets",
    "02_norm_backward.int_offsets",
    "05_adamw.int_offsets",
]
# one variant of the task per grading run
BATCHES = [[name] for name in VARIANTS if name not in HUGE]
SANITIZED: list[str] = []
AT_BUILD: list[str] = []
TIMED: list[str] = []


# --- task 03: matmul backward through cuBLASLt's epilogues -------------------------------------

MB = "03_matmul_backward.cu"
MB_DGRAD = (
    "    CUDA_CHECK(matmul_lt(lt, CUBLAS_OP_N, CUBLAS_OP_N, K, N, M, W, K, dy, M, dx, K,\n"
    "                         CUBLASLT_EPILOGUE_DEFAULT, nullptr, nullptr, 0, stream));\n"
)
MB_WGRAD = (
    "    CUDA_CHECK(matmul_lt(lt, CUBLAS_OP_N, CUBLAS_OP_T, K, M, N, x, K, dy, M, dW, K,\n"
    "                         CUBLASLT_EPILOGUE_BGRADB, db, nullptr, 0, stream));\n"
)
MB_GELU_DGRAD = (
    "    CUDA_CHECK(matmul_lt(lt, CUBLAS_OP_N, CUBLAS_OP_N, K, N, M, W, K, dy, M, dh, K,\n"
    "                         dgelu, dbh, h, K, stream));\n"
)
MB_DGELU_CHOICE = (
    "    const cublasLtEpilogue_t dgelu = dbh != nullptr ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU;\n"
)
MB_PLAIN_SIZES = (
    "    if (N < 1 || K < 8 || M < 8 || K % 8 != 0 || M % 8 != 0) return cudaErrorInvalidValue;\n"
    "    if (!aligned16(x) || !aligned16(W)"
)
MB_PLAIN_ENTRY = "COURSE_API cudaError_t linear_backward_bf16("
# db summed over the rows of dy by a kernel of the student's (one thread per column, a float32 or a
# bf16 running sum), the weight gradient's matmul left without its epilogue
MB_DB_KERNEL = (
    "__global__ void column_sums(const bf16* dy, bf16* db, int N, int M) {{\n"
    "    const int j = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (j >= M) return;\n"
    "    {acc} s = {zero};\n"
    "    for (int i = 0; i < N; ++i) s = s + {term};\n"
    "    db[j] = {store};\n"
    "}}\n\n"
)
MB_DB_LAUNCH = (
    "    CUDA_CHECK(matmul_lt(lt, CUBLAS_OP_N, CUBLAS_OP_T, K, M, N, x, K, dy, M, dW, K,\n"
    "                         CUBLASLT_EPILOGUE_DEFAULT, nullptr, nullptr, 0, stream));\n"
    "    column_sums<<<(M + 255) / 256, 256, 0, stream>>>(dy, db, N, M);\n"
    "    CUDA_CHECK(cudaGetLastError());\n"
)
MB_F32_SUMS = MB_DB_KERNEL.format(
    acc="float", zero="0.0f", term="__bfloat162float(dy[(size_t)i * M + j])", store="__float2bfloat16_rn(s)"
)
MB_BF16_SUMS = MB_DB_KERNEL.format(
    acc="bf16", zero="__float2bfloat16_rn(0.0f)", term="dy[(size_t)i * M + j]", store="s"
)

MB_VARIANTS: dict[str, Variant] = {
    "03_matmul_backward.dw_transposed": Variant(
        MB,
        [
            (
                MB_WGRAD,
                "    CUDA_CHECK(matmul_lt(lt, CUBLAS_OP_N, CUBLAS_OP_T, M, K, N, dy, M, x, K, dW, M,\n"
                "                         CUBLASLT_EPILOGUE_BGRADA, db, nullptr, 0, stream));  // column-major dW\n",
            )
        ],
        {"wrong", "crash"},
        "",
        "computes the weight gradient as the column-major product dyᵀ x (M, K), ld M: right in a column-major"
        " library, but dW's row-major memory then holds dWᵀ; db (BGRADA on dy) is still right",
        mistake="transpose mix-up",
    ),
    "03_matmul_backward.w_read_transposed": Variant(
        MB,
        [
            (
                MB_DGRAD,
                MB_DGRAD.replace(
                    "CUBLAS_OP_N, CUBLAS_OP_N, K, N, M, W, K,", "CUBLAS_OP_T, CUBLAS_OP_N, K, N, M, W, M,"
                ),
            )
        ],
        {"wrong"},
        "dx",
        "reads W as if it were stored (K, M) (op T, leading dimension M): dx = dy times a scrambled W wherever M != K",
        mistake="W read transposed",
    ),
    "03_matmul_backward.aux_ld_of_dy": Variant(
        MB,
        [(MB_GELU_DGRAD, MB_GELU_DGRAD.replace("dbh, h, K, stream", "dbh, h, M, stream"))],
        {"wrong", "crash"},
        "",
        "gives the GELU input's leading dimension as M (dy's) instead of K (h's, laid out like dh): cuBLASLt"
        " refuses it where M < K and reads the wrong pre-activations where M > K",
        mistake="aux leading dimension",
    ),
    "03_matmul_backward.no_gelu_backward": Variant(
        MB,
        [
            (
                MB_GELU_DGRAD,
                MB_GELU_DGRAD.replace("dgelu, dbh, h, K,", "CUBLASLT_EPILOGUE_DEFAULT, nullptr, nullptr, 0,"),
            )
        ],
        {"wrong"},
        "dh",
        "leaves out the DGELU_BGRAD epilogue: dh is dy W, as if the GELU were not there, and dbh is never written",
        mistake="GELU backward omitted",
    ),
    "03_matmul_backward.dbh_always": Variant(
        MB,
        [(MB_DGELU_CHOICE, "    const cublasLtEpilogue_t dgelu = CUBLASLT_EPILOGUE_DGELU_BGRAD;\n")],
        {"wrong", "crash"},
        "dbh",
        "always asks for DGELU_BGRAD, also when dbh is null: cuBLASLt is handed a null bias-gradient pointer"
        " to write, where the contract says to sum nothing",
        mistake="optional output written",
    ),
    "03_matmul_backward.gelu_of_output": Variant(
        MB,
        [(MB_GELU_DGRAD, MB_GELU_DGRAD.replace("dbh, h, K, stream", "dbh, a, K, stream"))],
        {"wrong"},
        "dh",
        "gives the epilogue the GELU's output a as its auxiliary input: gelu' is evaluated at gelu(h), not at h",
        mistake="GELU of the output",
    ),
    "03_matmul_backward.bias_grad_of_x": Variant(
        MB,
        [(MB_WGRAD, MB_WGRAD.replace("CUBLASLT_EPILOGUE_BGRADB", "CUBLASLT_EPILOGUE_BGRADA"))],
        {"wrong", "crash"},
        "",
        "takes the bias gradient from the weight gradient's A operand (x, K values) instead of B (dy, M values):"
        " sums the columns of x where db sums the rows of dy, and writes K values into db's M",
        mistake="bias gradient of the wrong operand",
    ),
    "03_matmul_backward.compute_16f": Variant(
        MB,
        [
            (
                "cublasLtMatmulDescCreate(&lt_d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F)",
                "cublasLtMatmulDescCreate(&lt_d.op, CUBLAS_COMPUTE_16F, CUDA_R_32F)",
            )
        ],
        {"crash", "wrong"},
        "",
        "asks for half-precision accumulation (CUBLAS_COMPUTE_16F): cuBLASLt has no such algorithm for bf16"
        " operands, and a sum of N bf16-sized terms in 11 bits would not hold the gradients' digits anyway",
        mistake="precision downgrade",
    ),
    "03_matmul_backward.db_by_own_kernel": Variant(
        MB,
        [(MB_PLAIN_ENTRY, MB_F32_SUMS + MB_PLAIN_ENTRY), (MB_WGRAD, MB_DB_LAUNCH)],
        {"rule violation"},
        "launches no kernel",
        "sums db with a kernel of its own (float32, one thread per column) after a weight-gradient matmul without"
        " the BGRADB epilogue: right numbers, an extra pass over dy, and against the task's rule",
        mistake="kernel of its own",
    ),
    "03_matmul_backward.db_in_bf16": Variant(
        MB,
        [(MB_PLAIN_ENTRY, MB_BF16_SUMS + MB_PLAIN_ENTRY), (MB_WGRAD, MB_DB_LAUNCH)],
        {"rule violation"},
        "launches no kernel",
        "sums db in a bf16 running sum in a kernel of its own: the rule stops it before its numbers are judged;"
        " they would fail too (terms below 2^-9 of the sum are lost)",
        mistake="bf16 accumulation",
    ),
    "03_matmul_backward.default_stream": Variant(
        MB,
        [
            (
                "&best.algo, lt->workspace, lt->workspace_bytes, stream));",
                "&best.algo, lt->workspace, lt->workspace_bytes, 0));",
            )
        ],
        {"wrong", "crash"},
        "CUDA graph",
        "runs every matmul on the default stream, not on `stream`: right when the caller uses the default"
        " stream, but a capture on another stream fails",
        mistake="wrong stream",
    ),
    "03_matmul_backward.beta_one": Variant(
        MB,
        [("    const float alpha = 1.0f, beta = 0.0f;\n", "    const float alpha = 1.0f, beta = 1.0f;  // D += ...\n")],
        {"wrong"},
        "",
        "multiplies with beta = 1: every output accumulates into what it held (the harness pre-fills NaN), as"
        " if the gradients were being summed over micro-batches into buffers nobody zeroed",
        mistake="accumulating output",
    ),
    "03_matmul_backward.no_size_check": Variant(
        MB,
        [(MB_PLAIN_SIZES, "    if (!aligned16(x) || !aligned16(W)")],
        {"wrong"},
        "cudaErrorInvalidValue",
        "linear_backward_bf16 checks no sizes: K = 12 reaches cuBLASLt, which computes it or refuses with a"
        " cuBLAS status, instead of the contract's cudaErrorInvalidValue",
        mistake="sizes not refused",
    ),
}
VARIANTS.update(MB_VARIANTS)
BATCHES += [[name] for name in MB_VARIANTS]
# the rules decide these on the build: graded on a machine without a GPU too
AT_BUILD += ["03_matmul_backward.db_by_own_kernel", "03_matmul_backward.db_in_bf16"]

# --- task 04: flash attention backward ------------------------------------------------------------
# The checks before the cases judge a plain call first and leave a kernel that is wrong anyway to
# the cases, so most of these are named by the first case they fail (its label: "causal", "D=128",
# "large"). "no_barrier_before_dq" is a race: graded with the sanitizer too (SANITIZED).

FA = "04_attention_backward.cu"
FA_ACC_T = "            mma_m16n8k16<E>(acc[n + 1], a, yf + 2);\n"
FA_STATS = "        lse2[tid] = q0 + tid < T ? LSE[q0 + tid] * LOG2E : 0.0f;\n"

FA_VARIANTS: dict[str, Variant] = {
    "04_attention_backward.mask_off_by_one": Variant(
        FA,
        [("(causal && key > q0 + col)", "(causal && key > q0 + col + 1)")],
        {"wrong"},
        "causal",
        "the causal mask hides keys past i + 1 instead of past i: query i sees key i + 1, whose P (exp of a score"
        " against an LSE that never counted it) enters dV, dS, dK and dQ",
        mistake="mask off by one",
    ),
    "04_attention_backward.skips_the_diagonal_tile": Variant(
        FA,
        [
            (
                "    const int q_first = causal ? k0 / F::BR * F::BR : 0;\n",
                "    const int q_first = causal ? (k0 + F::BC - 1) / F::BR * F::BR : 0;  // the last key's tile\n",
            )
        ],
        {"wrong"},
        "causal",
        "when causal, starts at the query tile that holds the block's last key: the tiles before it are only"
        " partly masked (queries k0 .. k0 + BC - 2 see some of the block's keys), and their terms, the largest"
        " of dK, dV and dQ, are lost",
        mistake="causal skip",
    ),
    "04_attention_backward.reads_past_t": Variant(
        FA,
        [
            (
                "        const bool inside = r0 + row + n * PASS < T;\n",
                "        const bool inside = true;  // T is whole tiles?\n",
            )
        ],
        {"wrong", "crash"},
        "",
        "copies whole tiles of K, V, Q and dO whatever T: the rows past T are the next head's (or past the"
        " buffer, for the last head), not zeros, and their keys add to dQ where T is not a multiple of the tile",
        mistake="tails",
    ),
    "04_attention_backward.lse_in_log2_units": Variant(
        FA,
        [(FA_STATS, FA_STATS.replace("LSE[q0 + tid] * LOG2E", "LSE[q0 + tid]"))],
        {"wrong"},
        "",
        "takes the saved LSE as if it were in log2 units: P = exp2(S c - LSE) is exp(S - LSE ln 2), too large by"
        " exp(LSE (1 - ln 2))",
        mistake="LSE in log2 units",
    ),
    "04_attention_backward.no_delta": Variant(
        FA,
        [
            (
                "        const float d0 = delta[8 * j + 2 * t], d1 = delta[8 * j + 2 * t + 1];\n",
                "        const float d0 = 0.0f * t, d1 = 0.0f;  // dS = P dP\n",
            )
        ],
        {"wrong"},
        "",
        "dS = P dP, without - Delta: the softmax's Jacobian is diag(P) - P Pᵀ, and its second term is the one"
        " Delta = rowsum(dO * O) carries; dK and dQ are wrong, dV and Delta itself right",
        mistake="Delta missing",
    ),
    "04_attention_backward.dk_unscaled": Variant(
        FA,
        [("    store_rows<F>(dK, dk, scale, key0, T);\n", "    store_rows<F>(dK, dk, 1.0f, key0, T);\n")],
        {"wrong"},
        "dK",
        "forgets the 1 / sqrt(D) of dK = scale dSᵀ Q (S = scale Q Kᵀ, so both dQ and dK carry it): dK is 8 or 11"
        " times too large",
        mistake="scale",
    ),
    "04_attention_backward.dq32_not_zeroed": Variant(
        FA,
        [
            (
                "        float4* z = reinterpret_cast<float4*>(dQ32 + at);\n"
                "        z[0] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);\n"
                "        z[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);\n",
                "",
            )
        ],
        {"wrong"},
        "dQ",
        "never zeroes dQ32 before the atomics add into it: right only where the buffer held zeros (the grader"
        " poisons every output with NaN before every call)",
        mistake="dQ32 not zeroed",
    ),
    "04_attention_backward.ds_not_transposed": Variant(
        FA,
        [
            (
                "        ldmatrix_x4_trans(a, dSs + swizzle<F::CPR_S>(16 * kk + srow, schunk));\n",
                "        ldmatrix_x4(a, dSs + swizzle<F::CPR_S>(16 * kk + srow, schunk));\n",
            )
        ],
        {"wrong"},
        "dQ",
        "reads dS for dQ = dS K from the dSᵀ tile as stored, without ldmatrix's .trans: every 8 x 8 block of dS"
        " is used transposed (dQ from dSᵀ's blocks)",
        mistake="dS transposed",
    ),
    "04_attention_backward.bf16_through_fp16": Variant(
        FA,
        [
            (
                "        const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);\n        return",
                "        const float2 f = __half22float2(__floats2half2_rn(lo, hi));  // through float16 first\n"
                "        const __nv_bfloat162 v = __floats2bfloat162_rn(f.x, f.y);\n        return",
            )
        ],
        {"wrong"},
        "2^17",
        "rounds every bfloat16 value it writes (P and dS as operands, dQ, dK, dV) through float16 first: right"
        " while they stay below 65504 (float16 has more mantissa bits), inf past it",
        mistake="fp16 on the bf16 path",
    ),
    "04_attention_backward.sums_in_16_bits": Variant(
        FA,
        [
            (
                FA_ACC_T,
                FA_ACC_T + "            for (int m = n; m < n + 2; ++m) {  // the running sums kept in E\n"
                "                const float2 lo = unpack2<E>(pack2<E>(acc[m][0], acc[m][1]));\n"
                "                const float2 hi = unpack2<E>(pack2<E>(acc[m][2], acc[m][3]));\n"
                "                acc[m][0] = lo.x, acc[m][1] = lo.y, acc[m][2] = hi.x, acc[m][3] = hi.y;\n"
                "            }\n",
            )
        ],
        {"wrong"},
        "",
        "keeps dK and dV in the input type between mma steps (as an mma with 16-bit accumulators would): a"
        " rounding per 16 queries, which the long rows (T = 1000, 2048) add up past the tolerance",
        mistake="16-bit accumulation",
    ),
    "04_attention_backward.default_stream": Variant(
        FA,
        [(", F::SMEM_BYTES, stream>>>", ", F::SMEM_BYTES>>>")],
        {"wrong", "crash"},  # a launch on the legacy stream during the capture may fail (its error returned)
        "CUDA graph",
        "launches the main kernel on the default stream, not on `stream`: right when the caller uses the default"
        " stream, but a capture on another stream fails",
        mistake="wrong stream",
    ),
    "04_attention_backward.no_barrier_before_dq": Variant(
        FA,
        [("        __syncthreads();  // the whole dSᵀ tile is written before any warp reads it\n", "")],
        {"sanitizer", "wrong"},
        "",
        "no barrier between the warps' writes of the dSᵀ tile and the dQ step's reads of it: a fast warp reads"
        " other warps' rows of dS before they are written (the previous tile's, or poison)",
        mistake="race",
    ),
    "04_attention_backward.d128_half_columns": Variant(
        FA,
        [
            (
                "    for (int n = 0; n < F::ND; ++n) {\n        const int col = 8 * n + 2 * t;\n"
                "        if (key0 + g < T)",
                "    for (int n = 0; n < 8; ++n) {  // 64 columns\n        const int col = 8 * n + 2 * t;\n"
                "        if (key0 + g < T)",
            )
        ],
        {"wrong"},
        "D=128",
        "stores 64 columns of dK and dV, as if D were always 64: at D = 128 the other half stays as it was",
        mistake="D = 128",
    ),
    "04_attention_backward.other_d_as_128": Variant(
        FA,
        [
            (
                "    if (D == 128)\n        return launch_backward<E, Bwd128>",
                "    if (D != 64)  // 128, and anything else\n        return launch_backward<E, Bwd128>",
            )
        ],
        {"wrong", "crash"},
        "",
        "runs every head dimension but 64 as 128 instead of refusing it: D = 96 reads and writes past its rows",
        mistake="sizes not refused",
    ),
    "04_attention_backward.exp_then_divide": Variant(
        FA,
        [("float p = exp2f(fmaf(s[j][2 * h + e], c, -l2));", "float p = exp2f(s[j][2 * h + e] * c) / exp2f(l2);")],
        {"wrong"},
        "large",
        "exponentiates the score and divides by exp(LSE): right for scores of a few units, inf / inf = NaN once"
        " they pass 88 (the large cases' scores reach 100 and more)",
        mistake="overflow",
    ),
}
VARIANTS.update(FA_VARIANTS)
BATCHES += [[name] for name in FA_VARIANTS if name != "04_attention_backward.no_barrier_before_dq"]
SANITIZED += ["04_attention_backward.no_barrier_before_dq"]

# --- task 06: the GPT step through the kernels (Python: gpt/ops.py and gpt/train.py) ---------------
OPS = "gpt/ops.py"
TRAIN = "gpt/train.py"

GPT_VARIANTS: dict[str, Variant] = {
    "06_gpt_step.lse_fake_in_bf16": Variant(
        OPS,
        [
            (
                "    return torch.empty_like(q), q.new_empty(q.shape[:3], dtype=F32)\n",
                "    return torch.empty_like(q), q.new_empty(q.shape[:3])  # the inputs' dtype\n",
            )
        ],
        {"wrong"},
        "test_opcheck",
        "the attention's fake gives the log-sum-exp the inputs' dtype (bf16) where the real op returns float32:"
        " a traced model would be planned with the wrong tensor",
        mistake="fake tensor",
    ),
    "06_gpt_step.upstream_gradient_ignored": Variant(
        OPS,
        [
            (
                "    return torch._foreach_mul([dlogits], dloss.to(dlogits.dtype))[0], None\n",
                "    return dlogits, None  # dloss is 1 anyway\n",
            )
        ],
        {"wrong"},
        "cross_entropy",
        "the loss's backward returns the saved dlogits without multiplying by the incoming gradient: right for"
        " loss.backward() alone, wrong for a scaled loss (2.5 x loss in the check)",
        mistake="incoming gradient",
    ),
    "06_gpt_step.mean_and_rstd_swapped": Variant(
        OPS,
        [
            (
                "    dx, dweight, dbias = layer_norm_backward(dy.contiguous(), x, weight, mean, rstd)\n",
                "    dx, dweight, dbias = layer_norm_backward(dy.contiguous(), x, weight, rstd, mean)\n",
            )
        ],
        {"wrong"},
        "layer_norm",
        "passes the saved rstd as the mean and the mean as rstd (both float32 rows): every gradient of every"
        " layer norm is wrong",
        mistake="wrong gradient",
    ),
    "06_gpt_step.strided_do": Variant(
        OPS,
        [
            (
                "    return attention_backward(q, k, v, o, do.contiguous(), lse)\n",
                "    return attention_backward(q, k, v, o, do, lse)\n",
            )
        ],
        {"wrong"},
        "contiguous",
        "hands the attention's upstream gradient to the kernel as autograd gives it: in the model it is the"
        " transpose of the (B, T, C) gradient, not laid out (B, H, T, D), and the op refuses it",
        mistake="layout",
    ),
    "06_gpt_step.dloss_one": Variant(
        OPS,
        [
            (
                "    dloss = torch.full((rows,), 1.0 / rows, dtype=F32, device=logits.device)",
                "    dloss = torch.ones((rows,), dtype=F32, device=logits.device)",
            )
        ],
        {"wrong"},
        "gradient of",
        "gives every row a dloss of 1: the gradient of the sum of the losses, N times the mean's",
        mistake="loss scale",
    ),
    "06_gpt_step.grads_not_zeroed": Variant(
        TRAIN,
        [("        self.grads.zero_()  # autograd adds into each .grad: one memset for them all\n", "")],
        {"wrong"},
        "batch 2",
        "never clears the grads arena: autograd adds each step's gradients to the last step's",
        mistake="gradients accumulated",
    ),
    "06_gpt_step.grads_set_to_none": Variant(
        TRAIN,
        [
            (
                "        self.grads.zero_()  # autograd adds into each .grad: one memset for them all\n",
                "        for p in self.params.values():  # as optimizer.zero_grad() does\n            p.grad = None\n",
            )
        ],
        {"wrong"},
        "grads arena",
        "clears the gradients as zero_grad() does, by setting .grad to None: autograd then allocates fresh"
        " tensors, and the arena the optimizer reads stays zero",
        mistake="gradients outside the arena",
    ),
    "06_gpt_step.step_one_always": Variant(
        TRAIN,
        [("tc.weight_decay if decay else 0.0, self.step_count,\n", "tc.weight_decay if decay else 0.0, 1,\n")],
        {"wrong"},
        "torch's AdamW",
        "passes step 1 to every update: the bias corrections of the first step forever",
        mistake="bias correction step",
    ),
    "06_gpt_step.decay_everything": Variant(
        TRAIN,
        [("tc.weight_decay if decay else 0.0, self.step_count,\n", "tc.weight_decay, self.step_count,\n")],
        {"wrong"},
        "weight decay off here",
        "decays every parameter, the biases and the layer norms' weights too",
        mistake="weight decay groups",
    ),
    "06_gpt_step.default_stream": Variant(
        OPS,
        [
            (
                '    _call("linear_backward_bf16", x, weight, dy, dx, dweight, dbias, N, K, M, kernels.stream())\n',
                '    _call("linear_backward_bf16", x, weight, dy, dx, dweight, dbias, N, K, M, None)  # stream 0\n',
            )
        ],
        {"wrong", "crash"},
        "",
        "launches the linear layers' backward on the default stream (a null stream) instead of the caller's:"
        " behind a busy caller stream it reads gradients that do not exist yet",
        mistake="wrong stream",
    ),
    "06_gpt_step.loss_not_checked": Variant(
        TRAIN,
        [("        if not loss_ok:\n", "        if False:  # a NaN loss makes NaN gradients anyway\n")],
        {"wrong"},
        "loss",
        "checks the gradients only: a NaN loss is reported as some gradient's, not as the loss",
        mistake="non-finite loss",
    ),
    "06_gpt_step.gradients_not_checked": Variant(
        TRAIN,
        [("        if not grads_ok:\n", "        if False:  # the loss is what we watch\n")],
        {"wrong"},
        "not raise",
        "checks the loss only: a NaN gradient under a finite loss goes into the optimizer",
        mistake="non-finite gradient",
    ),
    "06_gpt_step.update_before_the_check": Variant(
        TRAIN,
        [
            (
                "        self.check_finite(loss)\n        self.optimizer_step()\n",
                "        self.optimizer_step()\n        self.check_finite(loss)\n",
            )
        ],
        {"wrong"},
        "stopped",
        "updates the parameters, then checks: the step raises, but the model is already NaN",
        mistake="update before the check",
    ),
    "06_gpt_step.fit_never_checked": Variant(
        TRAIN,
        [("    if need > free:\n", "    if need > free and False:  # let the allocator say it\n")],
        {"wrong"},
        "",
        "never refuses a run: one that does not fit fails somewhere inside, after allocating gigabytes",
        mistake="does not fit",
    ),
}
VARIANTS.update(GPT_VARIANTS)
BATCHES += [[name] for name in GPT_VARIANTS]

# --- task 07: the step replayed from a CUDA graph (Python: gpt/graphed.py) ----------------------------
GRAPHED = "gpt/graphed.py"
GRAPHED_VARIANTS = {
    "07_graphed_step.inputs_not_copied": Variant(
        GRAPHED,
        [("        g.x.copy_(x)\n        g.y.copy_(y)\n", "")],
        {"wrong"},
        "a new batch",
        "replays without copying the batch into the graph's inputs: every step computes the capture batch again",
        mistake="results replayed",
    ),
    "07_graphed_step.static_loss_returned": Variant(
        GRAPHED,
        [("        return g.loss.clone()  # the next replay overwrites g.loss\n", "        return g.loss\n")],
        {"wrong"},
        "read after both calls",
        "returns the graph's own loss tensor, which the next replay overwrites",
        mistake="snapshot returned",
    ),
    "07_graphed_step.one_graph_for_all_shapes": Variant(
        GRAPHED,
        [
            (
                "        if shape not in self.graphs:\n            self.graphs[shape] = self.capture(x, y)\n"
                "        g = self.graphs[shape]\n",
                "        if not self.graphs:  # the batch never changes size\n"
                "            self.graphs[shape] = self.capture(x, y)\n        g = next(iter(self.graphs.values()))\n",
            )
        ],
        {"wrong", "crash"},
        "",
        "captures once and replays that graph for a batch of any size",
        mistake="one graph for every shape",
    ),
    "07_graphed_step.hook_ignored": Variant(
        GRAPHED,
        [("        if self.logits_hook is not None:\n            return super().forward_backward(x, y)\n", "")],
        {"wrong"},
        "did not raise",
        "replays the graph even while a logits hook is set: the hook's Python never runs",
        mistake="hook ignored",
    ),
    "07_graphed_step.never_replays": Variant(
        GRAPHED,
        [("        if self.logits_hook is not None:\n", "        if True:  # the graph can wait\n")],
        {"wrong"},
        "graph replays",
        "takes task 06's eager pass every time: right numbers, no graph",
        mistake="no graph",
    ),
    "07_graphed_step.replay_on_a_private_stream": Variant(
        GRAPHED,
        [
            (
                "        g.graph.replay()  # on the current stream, after the copies\n",
                "        with torch.cuda.stream(torch.cuda.Stream()):  # off the caller's stream\n"
                "            g.graph.replay()\n",
            )
        ],
        {"wrong", "crash"},
        "busy stream",
        "replays on a stream of its own, which does not wait for the caller's: the batch is not there yet",
        mistake="wrong stream",
    ),
}
VARIANTS.update(GRAPHED_VARIANTS)
BATCHES += [[name] for name in GRAPHED_VARIANTS]

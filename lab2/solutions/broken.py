"""Deliberately broken lab 2 submissions, written as edits to the reference solutions.

tests/test_broken_variants.py applies each edit, grades the result and expects the verdict
given here, as for lab 1 (lab1/solutions/broken.py). Keeping them as edits means they follow
the solutions: if a solution changes so that an edit no longer applies, the test says so
instead of grading a stale copy.
"""

from __future__ import annotations

from grader.instructor.broken import Variant

FUSED_ROWS = (
    "    for (int r = blockIdx.y; r < rows; r += gridDim.y) {\n"
    "        const size_t i = (size_t)r * cols + col;\n"
    "        y[i] = silu(x[i] + b);\n"
    "    }\n"
)

VARIANTS: dict[str, Variant] = {
    "01_coalescing.misses_the_tail": Variant(
        "01_coalescing.cu",
        [("        if (start + 2 * pairs < n) c[n - 1] = a[n - 1] + b[n - 1];\n", "")],
        {"wrong"},
        # the misaligned-views check runs before the cases and fails first (n = 2, all three one
        # element in): its message says "is wrong for", not "never written"
        "wrong",
        "the odd last element after the last whole pair is never added",
        mistake="tail",
    ),
    "07_fusion.bias_by_row": Variant(
        "07_fusion.cu",
        [
            ("    const float b = bias[col];\n", ""),
            ("        y[i] = silu(x[i] + b);\n", "        y[i] = silu(x[i] + bias[r]);\n"),
        ],
        {"wrong"},
        "wrong",
        "indexes bias by the row instead of the column (right only for 1x1; 3x5 reads bias in bounds)",
        mistake="bias broadcast axis",
    ),
    "07_fusion.no_row_loop": Variant(
        "07_fusion.cu",
        [
            (
                FUSED_ROWS,
                "    const size_t i = (size_t)blockIdx.y * cols + col;  // one row per block row\n"
                "    y[i] = silu(x[i] + b);\n",
            )
        ],
        {"wrong"},
        "never written",
        "no loop over the rows beyond gridDim.y: rows 65535 and on of the 70000-row case stay unwritten",
        mistake="rows past the grid",
    ),
    "10_reduction.last_warp_race": Variant(
        "10_reduction.cu",
        [
            (
                "            partial[t] = v;\n            __syncwarp();\n            v += partial[t + offset];\n",
                "            partial[t] = v;\n            v += partial[t + offset];\n",
            )
        ],
        {"sanitizer", "wrong"},
        "",
        "rung 4's last warp reads its neighbour's shared-memory value with no __syncwarp after the write"
        " (one __syncwarp is left, so the source rule that requires it is satisfied)",
        mistake="missing __syncwarp",
    ),
    "10_reduction.drops_the_tail": Variant(
        "10_reduction.cu",
        [
            ("    const size_t tail = count - head - 4 * vecs;\n", ""),
            ("    if (tid < tail) v += in[head + 4 * vecs + tid];\n", ""),
        ],
        {"wrong"},
        "wrong",
        "rung 6 forgets the (up to 3) elements after the last whole float4",
        mistake="tail",
    ),
    "02_divergence.wrong_piece": Variant(
        "02_divergence.cu",
        [
            (
                "        const float above = v > bound(k);",
                "        const float above = v > bound(k + 1);  // off by one: the upper end of piece k",
            )
        ],
        {"wrong"},
        "wrong",
        "compares with the upper boundary of piece k instead of its lower one, so each value gets the"
        " parameters of the piece on its left (or piece 0's): most elements are wrong from n = 1 on",
        mistake="wrong piece",
    ),
    "02_divergence.no_grid_stride": Variant(
        "02_divergence.cu",
        [
            (
                "    const size_t stride = (size_t)gridDim.x * blockDim.x;\n"
                "    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {\n"
                "        const float v = x[i];\n"
                "        const Piece q = piece_of(v);\n",
                "    // one element per thread; a thread past the end redoes the last one (no branch needed)\n"
                "    const size_t i = min((size_t)blockIdx.x * blockDim.x + threadIdx.x, n - 1);\n"
                "    {\n"
                "        const float v = x[i];\n"
                "        const Piece q = piece_of(v);\n",
            )
        ],
        {"wrong"},
        "never written",
        "no grid-stride loop: the grid holds one wave of blocks (about 2.7e5 threads on an H100), so the"
        " elements past it in n = 2^20+7 and 2^24 are never written",
        mistake="no grid-stride loop",
    ),
    "02_divergence.branches_spelled_by_macros": Variant(
        "02_divergence.cu",
        [
            (
                "template <int p>\n__device__ __forceinline__ float piece_poly(float t) {\n",
                "#define WHEN if\n#define OTHERWISE else\n\n"
                "template <int p>\n__device__ __forceinline__ float piece_poly(float t) {\n",
            ),
            (
                "        const Piece q = piece_of(v);\n"
                "        const float t = fmaf(q.a, v, q.b);\n"
                "        float acc = coef(DEGREE);\n"
                "#pragma unroll\n"
                "        for (int j = DEGREE - 1; j >= 0; --j) acc = fmaf(acc, t, coef(j));\n"
                "        y[i] = fmaf(q.s, acc, q.o);\n",
                "        float f;\n"
                "        WHEN (v <= bound(1)) f = piece_poly<0>(fmaf(piece(0).a, v, piece(0).b));\n"
                "        OTHERWISE WHEN (v <= bound(2)) f = piece_poly<1>(fmaf(piece(1).a, v, piece(1).b));\n"
                "        OTHERWISE WHEN (v <= bound(3)) f = piece_poly<2>(fmaf(piece(2).a, v, piece(2).b));\n"
                "        OTHERWISE f = piece_poly<3>(fmaf(piece(3).a, v, piece(3).b));\n"
                "        y[i] = f;\n",
            ),
        ],
        {"rule violation"},
        "whose SASS has BSSY",
        "the branchy if / else chain, spelled WHEN / OTHERWISE by macros defined above the region, so a text"
        " rule on `if` and `else` in the region never sees it; the compiled kernel reconverges (BSSY, BSYNC)",
        mistake="divergent branch",
    ),
    "02_divergence.boundary_to_the_right": Variant(
        "02_divergence.cu",
        [
            (
                "        const float above = v > bound(k);",
                "        const float above = v >= bound(k);  // a boundary value goes to the right",
            )
        ],
        {"wrong"},
        "wrong",
        "`>=` instead of `>`: x exactly -1, 0 or 1 gets the piece on the right, 0.25 to 0.69 off; only"
        " those elements are wrong (every 16th from the 6th cycles through them, so n >= 22 has a 0)",
        mistake="boundary value",
    ),
    # --- task 03: waves and tails (batches: see the note at the end) ---
    "03_waves.occupancy_from_threads": Variant(
        "03_waves.cu",
        [
            (
                "    *blocks_per_sm = (int)fit;\n",
                "    *blocks_per_sm = warps_per_sm * warp / threads;  // as many blocks as the SM has thread slots\n",
            )
        ],
        {"wrong"},
        "counts threads only",
        "blocks per SM from maxThreadsPerMultiProcessor / threads: right for busy_kernel with 1024 and 256 threads,"
        " wrong once 40 KiB of shared memory per block lets only 5 (H100) or 4 (A100) blocks in, not 8",
        mistake="threads-only occupancy",
    ),
    "03_waves.hardcoded_sms": Variant(
        "03_waves.cu",
        [
            (
                "    CUDA_CHECK(cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, device));\n",
                "    *sms = 132;  // an H100\n",
            )
        ],
        {"rule violation"},
        "never from a constant",
        "the SM count written as 132: right on an H100 SXM or H200, so only the source rule catches it there"
        " (on any other card the comparison with torch's SM count would too)",
        mistake="hard-coded device",
    ),
    "03_waves.waves_round_down": Variant(
        "03_waves.cu",
        [
            (
                "    return (blocks + blocks_per_wave - 1) / blocks_per_wave;  // < 2^63 within the contract\n",
                "    return blocks / blocks_per_wave;\n",
            )
        ],
        {"wrong"},
        "round up",
        "integer division rounds the waves down: 265 blocks at 264 per wave counted as 1 wave, not 2",
        mistake="waves rounded down",
    ),
    "03_waves.waves_in_double": Variant(
        "03_waves.cu",
        [
            (
                "    return (blocks + blocks_per_wave - 1) / blocks_per_wave;  // < 2^63 within the contract\n",
                "    return (long long)ceil((double)blocks / (double)blocks_per_wave);\n",
            )
        ],
        {"wrong"},
        "2^53",
        "ceil of a double division: right for every grid that fits a GPU, wrong past 2^53 blocks, where"
        " (double)(2^53 + 1) is 2^53",
        mistake="double past 2^53",
    ),
    "08_inline_ptx.float_as_r": Variant(
        "08_inline_ptx.cu",
        [
            (
                '    asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(d) : "f"(a), "f"(b), "f"(c));\n',
                '    asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(d) : "f"(a), "r"((unsigned)b), "f"(c));\n',
            )
        ],
        {"wrong"},
        "`out`",
        'passes b with the integer letter "r": nvcc refuses a float there, and the cast that silences it'
        " converts the value (1.7 becomes 1, negatives 0), whose bits fma.rn.f32 then reads as a denormal",
        mistake="constraint letter",
    ),
    "08_inline_ptx.lane_from_threadidx": Variant(
        "08_inline_ptx.cu",
        [("    lanes[i] = lane_id();\n", "    lanes[i] = threadIdx.x % 32;  // the lane, without the PTX\n")],
        # the rule reads the PTX of the kernels fma_lanes reaches: lane_id's %laneid, left in a helper
        # nothing calls, is not there (the values are wrong too: n >= 17 has odd rows 16 lanes off)
        {"rule violation"},
        "%laneid",
        "takes the lane from threadIdx.x and keeps lane_id's %laneid in a helper nothing calls: in the given"
        " 16 x 16 blocks a warp is two rows, and every thread of an odd row is 16 lanes off",
        mistake="lane from threadIdx",
    ),
    "08_inline_ptx.fma_in_a_comment": Variant(
        "08_inline_ptx.cu",
        [
            (
                '    float d;\n    asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(d) : "f"(a), "f"(b), "f"(c));\n'
                "    return d;\n",
                '    // asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(d) : "f"(a), "f"(b), "f"(c));\n'
                "    return a * b + c;  // nvcc contracts this into the same FFMA\n",
            )
        ],
        {"rule violation"},
        "fma.rn.f32",
        "a * b + c with the PTX only in a comment: right to the bit (nvcc contracts it into an FMA), caught by"
        " the source rule, which reads the code without its comments",
        mistake="rule dodged in a comment",
    ),
    "08_inline_ptx.bfe_operands_swapped": Variant(
        "08_inline_ptx.cu",
        [('"r"(x), "r"(pos), "r"(len));\n', '"r"(x), "r"(len), "r"(pos));\n')],
        {"wrong"},
        "`fields`",
        "gives bfe.u32 the length before the position (bfe.u32 d, a, pos, len): only fields with pos == len survive",
        mistake="operand order",
    ),
    # --- task 11 (transpose). Batches: "11_transpose.store_unguarded" and
    # "11_transpose.out_index_swapped" each in a BATCHES batch (different batches: one variant per
    # task per grading run); "11_transpose.barrier_before_loads" in SANITIZED;
    # "11_transpose.no_padding" in TIMED (it carries timing=True; today only its verdict, pass, is
    # checked: see the report on "pass, but no performance points").
    "11_transpose.store_unguarded": Variant(
        "11_transpose.cu",
        [
            (
                "    // lane x reads tile[x][y], bank (x + y) % 32: conflict-free\n"
                "    const int out_c = t.row0 + threadIdx.x;\n"
                "#pragma unroll\n"
                "    for (int k = 0; k < TILE; k += BLOCK_ROWS) {\n"
                "        const int y = threadIdx.y + k, out_r = t.col0 + y;\n"
                "        if (out_r < cols && out_c < rows) out[(size_t)out_r * rows + out_c] = tile[threadIdx.x][y];\n",
                "    // lane x reads tile[x][y], bank (x + y) % 32: conflict-free\n"
                "    const int out_c = t.row0 + threadIdx.x;\n"
                "#pragma unroll\n"
                "    for (int k = 0; k < TILE; k += BLOCK_ROWS) {\n"
                "        const int y = threadIdx.y + k, out_r = t.col0 + y;\n"
                "        out[(size_t)out_r * rows + out_c] = tile[threadIdx.x][y];  // the loads are guarded\n",
            )
        ],
        {"wrong"},
        # 1x1 is the first case: the one block stores its whole 32 x 32 tile, indices up to 62
        "out of bounds",
        "rung 3 guards the tile's loads but not its stores: a tile that overhangs the matrix writes past"
        " the end of out (and over its last rows, with tile entries that were never loaded)",
        mistake="tile overhang",
    ),
    "11_transpose.barrier_before_loads": Variant(
        "11_transpose.cu",
        [
            (
                "    __shared__ float tile[TILE][TILE];\n",
                "    __shared__ float tile[TILE][TILE];\n    __syncthreads();\n",
            ),
            ("    __syncthreads();  // the stores below read elements that other warps loaded\n", ""),
        ],
        {"sanitizer", "wrong"},
        "",
        "rung 2's barrier sits before the tile's loads instead of between the loads and the column reads:"
        " a warp reads tile rows the other 7 warps may not have stored yet (the barrier rule still holds)",
        mistake="missing barrier",
    ),
    "11_transpose.out_index_swapped": Variant(
        "11_transpose.cu",
        [
            (
                "    // lanes read tile[0..31][y], 32 floats apart: all in bank y, a 32-way conflict.\n"
                "    const int out_c = t.row0 + threadIdx.x;\n"
                "#pragma unroll\n"
                "    for (int k = 0; k < TILE; k += BLOCK_ROWS) {\n"
                "        const int y = threadIdx.y + k, out_r = t.col0 + y;\n"
                "        if (out_r < cols && out_c < rows) out[(size_t)out_r * rows + out_c] = tile[threadIdx.x][y];\n",
                "    // lanes read tile[0..31][y], 32 floats apart: all in bank y, a 32-way conflict.\n"
                "    const int out_c = t.row0 + threadIdx.x;\n"
                "#pragma unroll\n"
                "    for (int k = 0; k < TILE; k += BLOCK_ROWS) {\n"
                "        const int y = threadIdx.y + k, out_r = t.col0 + y;\n"
                "        if (out_r < cols && out_c < rows) out[(size_t)out_r * cols + out_c] = tile[threadIdx.x][y];\n",
            )
        ],
        {"wrong"},
        # right on the square 1x1; the 1x33 case stores row r of out at r * 33, up to index 1056 of 33
        "out of bounds",
        "rung 2 strides out's rows by cols (in's row length) instead of rows: right on square matrices only",
        mistake="non-square",
    ),
    "11_transpose.no_padding": Variant(
        "11_transpose.cu",
        [("    __shared__ float tile[TILE][TILE + 1];\n", "    __shared__ float tile[TILE][TILE];\n")],
        {"pass"},
        "",
        "rung 3's tile declared [32][32]: still right, but its column reads are 32-way bank conflicts"
        ", so it must earn no performance points",
        timing=True,
        perf_points=0,
        mistake="bank conflicts",
    ),
    "12_scan.offset_to_wrong_block": Variant(
        "12_scan.cu",
        [("    const float offset = offsets[b - 1];\n", "    const float offset = offsets[b];\n")],
        {"wrong"},
        "wrong",
        "phase 3 adds to tile b the inclusive scan of the totals up to b itself (offsets[b], not"
        " offsets[b - 1]): every tile after the first counts its own total twice (rungs 1 and 2)",
        mistake="block offset",
    ),
    "12_scan.hillis_steele_race": Variant(
        "12_scan.cu",
        [("        src = 1 - src;\n        __syncthreads();\n", "        src = 1 - src;\n")],
        {"sanitizer", "wrong"},
        "",
        "rung 1 drops the barrier between its doubling steps, trusting the double buffer: a warp reads"
        " a neighbour's value before that warp has written it (the barrier after the loads is left, so"
        " the kernel still has one)",
        mistake="missing barrier",
    ),
    "12_scan.pair_guard_drops_tail": Variant(
        "12_scan.cu",
        [
            (
                "    if (base + ai < count) out[base + ai] = tree[padded(ai)] + a;\n"
                "    if (base + bi < count) out[base + bi] = tree[padded(bi)] + b;\n",
                "    if (base + bi < count) {\n"
                "        out[base + ai] = tree[padded(ai)] + a;\n"
                "        out[base + bi] = tree[padded(bi)] + b;\n"
                "    }\n",
            )
        ],
        {"wrong"},
        "never written",
        "rung 2 guards both of a thread's stores with the index of the second one: in the last partial"
        " tile the elements whose partner lies past the end are never written (n = 1 already)",
        mistake="tail",
    ),
    "12_scan.exclusive": Variant(
        "12_scan.cu",
        [
            (
                "    if (base + ai < count) out[base + ai] = tree[padded(ai)] + a;\n"
                "    if (base + bi < count) out[base + bi] = tree[padded(bi)] + b;\n",
                "    if (base + ai < count) out[base + ai] = tree[padded(ai)];\n"
                "    if (base + bi < count) out[base + bi] = tree[padded(bi)];\n",
            )
        ],
        {"wrong"},
        "wrong",
        "rung 2 stores the down-sweep's exclusive scan as it is, without adding each element back:"
        " out[0] = 0 and every prefix misses its own element",
        mistake="exclusive scan",
    ),
    # --- task 13 (softmax ladder and layer norm). Batches: each of the four in a different
    # BATCHES batch (one variant of a task per grading run); none needs SANITIZED, TIMED or HUGE.
    "13_softmax.online_overflows": Variant(
        "13_softmax.cu",
        [
            (
                "    float d = s.d * expf(s.m - m);     // rescaled to the new max; exp(-inf) = 0 at first\n"
                "#pragma unroll\n"
                "    for (int j = 0; j < VW; ++j) d += expf(v[j] - m);\n",
                "    float d = s.d;\n"
                "#pragma unroll\n"
                "    for (int j = 0; j < VW; ++j) d += expf(v[j]);  // m is tracked but never subtracted\n",
            ),
            ("    return {m, a.d * expf(a.m - m) + b.d * expf(b.m - m)};\n", "    return {m, a.d + b.d};\n"),
            ("v[k][j] = expf(v[k][j] - s.m) * inv;", "v[k][j] = expf(v[k][j]) * inv;"),
            ("v[j] = expf(v[j] - s.m) * inv;", "v[j] = expf(v[j]) * inv;"),
        ],
        {"wrong"},
        # the large-input case is the last one, and the only one where exp(x) leaves float32's range
        "wrong",
        "rung 4 keeps its running max but sums and writes exp(x) unshifted: right for randn * 3 inputs"
        " (exp(17) fits a float), inf / inf = NaN on the large-input case (100 x + 50 reaches 1500)",
        mistake="overflow",
    ),
    "13_softmax.first_warp_only": Variant(
        "13_softmax.cu",
        [
            (
                "    v = lane < warps ? scratch[lane] : 0.0f;\n    v = warp_sum(v);\n",
                "    v = scratch[0];  // as partial[0] in rung 2: taken for the block's total\n",
            )
        ],
        {"wrong"},
        "wrong",
        "rung 3's block_sum returns the first warp's total to every thread and drops the other warps':"
        " right while a row's block is one warp (cols <= 512 here), wrong from 7x1000 on (2 warps)",
        mistake="multi-warp block",
    ),
    "13_softmax.write_stops_at_blockdim": Variant(
        "13_softmax.cu",
        [
            (
                "    for (size_t c = t; c < (size_t)cols; c += blockDim.x) yr[c] = expf(xr[c] - m) * inv;\n",
                "    if (t < (unsigned)cols) yr[t] = expf(xr[t] - m) * inv;  // one column per thread\n",
            )
        ],
        {"wrong"},
        "never written",
        "rung 2's max and sum stride over the whole row, but its write covers only the first blockDim.x"
        " (256) columns: columns 256 and on of 7x1000 keep the grader's poison",
        mistake="long rows",
    ),
    "13_softmax.unbiased_variance": Variant(
        "13_softmax.cu",
        [
            (
                "rstd = rsqrtf(s.m2 / (float)cols + eps);",
                "rstd = rsqrtf(s.m2 / (float)(cols - 1) + eps);",
            )
        ],
        {"wrong"},
        "wrong",
        "layer norm divides M2 by cols - 1 (the unbiased variance, torch.var's default) where layer norm"
        " uses the biased one: 0 / 0 = NaN at cols = 1, 1.5% off at 1x33, 0.05% at 1000 columns. The"
        " large-mean check runs first and catches it at 8x33 (errors up to about 5e-2 against its 2e-2)",
        mistake="unbiased variance",
    ),
    "14_sgemm.ignores_k_tail": Variant(
        "14_sgemm.cu",
        [
            (
                "    const int steps = (K + BK - 1) / BK;  // the last one may be partial: load4 fills it with zeros\n",
                "    const int steps = K / BK;  // whole steps only\n",
            )
        ],
        {"wrong"},
        "wrong",
        "rung 7's K loop stops at the last whole step of BK = 16: the last K % 16 terms of every dot product are"
        " never added (all of them when K < 16: 1x1x1 gives zeros; 33x17x65 misses one term)",
        mistake="K tail",
    ),
    "14_sgemm.no_barrier_before_next_tile": Variant(
        "14_sgemm.cu",
        [("        __syncthreads();  // everyone done reading before the next step overwrites them\n", "")],
        {"sanitizer", "wrong"},
        "",
        "rung 3 has no barrier between the products of one K step and the loads of the next: a fast warp"
        " overwrites the shared tiles while slower warps still read them (K > 32: 65x129x31 and larger; one"
        " barrier is left, so the barrier rule is satisfied)",
        mistake="missing barrier",
    ),
    "14_sgemm.no_row_guard_on_store": Variant(
        "14_sgemm.cu",
        [("    if (row >= rows) return;\n", "")],
        {"wrong"},
        "out of bounds",
        "store4 (rungs 6 and 7) checks the column but not the row: the threads of a 128 x 128 tile that sticks out"
        " of C write rows M and beyond (1x1x1: 127 floats past the end of C, inside the grader's fence)",
        mistake="tile overhang",
    ),
    "14_sgemm.a_column_major": Variant(
        "14_sgemm.cu",
        [
            (
                "    const float* a = A + (size_t)row * K;  // (K,) this thread's row of A\n",
                "    const float* a = A + row;  // (K,) this thread's row of A\n",
            ),
            (
                "    for (int k = 0; k < K; ++k) acc += a[k] * B[(size_t)k * N + col];\n",
                "    for (int k = 0; k < K; ++k) acc += a[(size_t)k * M] * B[(size_t)k * N + col];\n",
            ),
        ],
        {"wrong"},
        "wrong",
        "rung 2 reads A as if it were column-major (A[k * M + row]): every index stays inside A, so nothing"
        " crashes, and the cases with M = 1 or K = 1 still pass; 33x17x65 is wrong",
        mistake="layout",
    ),
    # --- task 00: profile first (batches: see the note at the end) ---
    "00_profile_first.malloc_every_round": Variant(
        "00_profile_first.cu",
        [
            (
                "    float* tmp = nullptr;\n"
                "    CUDA_CHECK(scratch((size_t)n, &tmp));\n"
                "    const unsigned blocks = (unsigned)(((size_t)n + THREADS - 1) / THREADS);\n"
                "    const float* src = x;\n"
                "    for (int r = 0; r < iters; ++r) {\n"
                "        // Consecutive rounds alternate, and the last one (iters - r == 1) writes y: round r writes\n"
                "        // y when iters - r is odd. No round reads the buffer it writes.\n"
                "        float* dst = (iters - r) % 2 == 1 ? y : tmp;\n"
                "        smooth_kernel<<<blocks, THREADS>>>(src, dst, n);\n"
                "        CUDA_CHECK(cudaGetLastError());\n"
                "        src = dst;\n"
                "    }\n",
                "    const unsigned blocks = (unsigned)(((size_t)n + THREADS - 1) / THREADS);\n"
                "    const size_t bytes = (size_t)n * sizeof(float);\n"
                "    const float* src = x;\n"
                "    for (int r = 0; r < iters; ++r) {\n"
                "        float* tmp = nullptr;  // a fresh buffer every round, as in smooth_slow\n"
                "        CUDA_CHECK(cudaMalloc(&tmp, bytes));\n"
                "        smooth_kernel<<<blocks, THREADS>>>(src, tmp, n);\n"
                "        CUDA_CHECK(cudaGetLastError());\n"
                "        CUDA_CHECK(cudaMemcpyAsync(y, tmp, bytes, cudaMemcpyDeviceToDevice));  // no host trip\n"
                "        CUDA_CHECK(cudaFree(tmp));\n"
                "        src = y;\n"
                "    }\n",
            )
        ],
        {"rule violation"},
        "cudaMalloc",
        "smooth_fast keeps smooth_slow's cudaMalloc and cudaFree of a fresh buffer every round (256-thread"
        " blocks, no host round trip: a device-to-device copy into y instead); correct, but cudaFree waits for"
        " the round every time, and the source rule on smooth_fast's body catches the calls before any build",
        mistake="allocation per round",
    ),
    "00_profile_first.edges_not_clamped": Variant(
        "00_profile_first.cu",
        [
            (
                "    const size_t left = i > 0 ? i - 1 : 0;  // clamped: an end element is its own neighbour\n"
                "    const size_t right = i + 1 < (size_t)n ? i + 1 : i;\n",
                "    const size_t left = i - 1, right = i + 1;  // the two neighbours\n",
            )
        ],
        # n = 1 reads src[-1] and src[1]: past x's ends (garbage in torch's allocation, or a fault if the
        # float before x is unmapped); from the third round on a round reads y's canaries (NaN)
        {"wrong", "crash"},
        "",
        "smooth_kernel reads src[i - 1] and src[i + 1] without clamping them: element 0 reads the float"
        " before the buffer, element n - 1 the one after it (from the first case, n = 1)",
        mistake="edges",
    ),
    "00_profile_first.odd_iters_end_in_scratch": Variant(
        "00_profile_first.cu",
        [
            (
                "        // Consecutive rounds alternate, and the last one (iters - r == 1) writes y: round r writes\n"
                "        // y when iters - r is odd. No round reads the buffer it writes.\n"
                "        float* dst = (iters - r) % 2 == 1 ? y : tmp;\n",
                "        float* dst = r % 2 == 0 ? tmp : y;  // scratch first, then y, then scratch ...\n",
            )
        ],
        {"wrong"},
        # the first case, n = 1 with one round, writes only the scratch buffer
        "never written",
        "the ping-pong always starts in the scratch buffer: right for an even iters, but an odd iters ends"
        " there and leaves y holding the round before (iters = 1: y never written)",
        mistake="odd rounds",
    ),
    "00_profile_first.one_thread_per_block": Variant(
        "00_profile_first.cu",
        [
            ("    const unsigned blocks = (unsigned)(((size_t)n + THREADS - 1) / THREADS);\n", ""),
            (
                "        smooth_kernel<<<blocks, THREADS>>>(src, dst, n);\n",
                "        smooth_kernel<<<n, 1>>>(src, dst, n);  // as smooth_slow: block b computes element b\n",
            ),
        ],
        {"pass"},
        "",
        "smooth_fast fixes the host round trip, the allocations and the waits but keeps smooth_slow's grid of"
        " n one-thread blocks: still right (the kernel's index is blockIdx.x * 1 + 0), but its kernel is the"
        " slow one, so it must earn no performance points",
        timing=True,
        perf_points=0,
        mistake="slow kernel kept",
    ),
    # --- task 04 (streams, pinned memory, a graph). Batches: "04_streams.no_wait",
    # "04_streams.graph_never_rebuilt" and "04_streams.staging_never_grows" each in a different
    # BATCHES batch (one variant of a task per grading run); "04_streams.one_stream" in TIMED (right
    # but without overlap: it must pass and earn no performance points). None needs SANITIZED or HUGE.
    "04_streams.one_stream": Variant(
        "04_streams.cu",
        [
            (
                "        const cudaStream_t stream = streams[chunk % STREAMS];\n",
                "        const cudaStream_t stream = streams[0];  // our own stream, off the default one\n",
            )
        ],
        {"pass"},
        "",
        "every chunk on one non-default stream: right, and asynchronous for the host, but a stream runs its"
        " work in order, so no upload overlaps a kernel or a download: both pipeline_streams and"
        " pipeline_graph (which captures the same calls) take about as long as pipeline_serial",
        timing=True,
        perf_points=0,
        mistake="no overlap",
    ),
    "04_streams.no_wait": Variant(
        "04_streams.cu",
        [
            (
                "    for (int s = 0; s < STREAMS; ++s) CUDA_CHECK(cudaStreamSynchronize(p->streams[s]));\n",
                "    // the downloads are queued: y fills in on its own\n",
            )
        ],
        {"wrong"},
        "wrong",
        "pipeline_streams returns as soon as its chunks are queued: the given code copies the staging buffer"
        " into y at once, while the downloads are still on their way, so y holds the staged x (or a chunk"
        " half downloaded). The grader reads y right after the call returns: the size-sequence check's"
        " first pipeline_streams call (n = 2^22 + 5) and every case from n = 1 are wrong",
        mistake="returns before the downloads",
    ),
    "04_streams.graph_never_rebuilt": Variant(
        "04_streams.cu",
        [
            (
                "    if (exec == nullptr || n != built_n || buf.generation != built_generation) {\n",
                "    if (exec == nullptr) {  // captured once, on the first call, and replayed ever after\n",
            )
        ],
        {"wrong"},
        "wrong",
        "the graph is captured on the first call only and replayed whatever n is: in the size-sequence check"
        " the graph of n = 5000 replayed for n = 2^20 + 3 (the buffers already hold 3 chunks, so nothing"
        " moved) computes 5000 elements and leaves the rest as the staged x",
        mistake="stale graph",
    ),
    "04_streams.staging_never_grows": Variant(
        "04_streams.cu",
        [
            (
                "    if (n <= buf.capacity) return cudaSuccess;\n",
                "    if (buf.capacity != 0) return cudaSuccess;  // allocated once, on the first call, and kept\n",
            )
        ],
        {"crash", "wrong"},
        "",
        "the pinned staging buffer (and the device buffer) sized by the first call (3 x 2^20 + 1 floats) and"
        " never grown: pipeline_streams(n = 2^22 + 5) copies 4 MiB past the end of the pinned allocation and"
        " uploads past the device one (a SIGSEGV or an illegal address, or corrupted memory, depending on"
        " what lies after them)",
        mistake="buffer never grows",
    ),
    # --- task 05 (explicit CUDA graph). Each variant in its own BATCHES batch (one variant of a task
    # per grading run). The missing edges are races between kernels (nodes of one graph), which
    # neither racecheck nor memcheck sees, so they go in BATCHES, not SANITIZED. None is decided at
    # the build (AT_BUILD), none is TIMED.
    "05_graph.tree_waits_for_bind_only": Variant(
        "05_graph.cu",
        [
            (
                "            const cudaGraphNode_t* deps = k == 0 ? below.data() : below.data() + first;\n"
                "            const size_t ndeps = k == 0 ? 1 : count;\n",
                "            const cudaGraphNode_t* deps = &g->bind;  // the nodes run in the order they are added\n"
                "            const size_t ndeps = 1;\n",
            )
        ],
        {"wrong"},
        "wrong",
        "every node depends on the bind node only, as if a graph ran its nodes in the order they were added"
        " (a stream's rule, not a graph's): the nodes above level 0 may start with the leaves and read partial"
        " sums not yet written (on a rebuild, whatever cudaMalloc left there). A race, so not certain, but very"
        " likely on the first call with 2^20 + 3 (65 leaves of a few µs, 5 + 1 nodes launched alongside them);"
        " n <= 16384 (one node) is right. graph_edges_hold_under_replay makes it near certain: 4096 leaves in"
        " waves, 273 nodes above them free to start at once, 32 launches on inputs whose sums differ threefold",
        mistake="missing edge",
    ),
    "05_graph.kept_after_n_changed": Variant(
        "05_graph.cu",
        [("    if (g.n != (size_t)n) {\n", "    if (g.exec == nullptr) {  // built on the first call\n")],
        {"wrong"},
        "when n changes",
        "the graph is built on the first call and kept whatever n the next calls bring: graph_follows_n's"
        " second call (n = 2^20 + 3 after 1000) gets the sum of the first 1000 elements",
        mistake="stale graph",
    ),
    "05_graph.root_writes_partials": Variant(
        "05_graph.cu",
        [
            (
                "            float* dst = k == t.levels - 1 ? nullptr : g->partials + t.offset[k] + j;\n",
                "            float* dst = g->partials + t.offset[k] + j;  // every node's sum in the partials buffer\n",
            )
        ],
        {"wrong"},
        "never written",
        "the root writes its sum into its slot of the partials buffer, like every other node, instead of out[0]:"
        " out keeps the grader's NaN (graph_follows_n's first call, n = 1000)",
        mistake="root output",
    ),
    # --- task 06 (pinned memory, asynchronous copies). Batches (one variant of a task per grading run):
    #   BATCHES[0] += ["06_async_copy.last_chunk_not_waited_for"]
    #   BATCHES[1] += ["06_async_copy.one_output_staging_buffer"]
    #   BATCHES[2] += ["06_async_copy.registers_and_never_unregisters"]
    # The second is a race between a copy engine and the host, which compute-sanitizer does not see,
    # so it goes in BATCHES, not SANITIZED. None is decided at the build (AT_BUILD), none is TIMED.
    "06_async_copy.last_chunk_not_waited_for": Variant(
        "06_async_copy.cu",
        [("    CUDA_CHECK(cudaEventSynchronize(p.done[last]));\n", "")],
        {"wrong"},
        "wrong",
        "no wait for the last chunk before copying it out of its staging buffer (the missing synchronization"
        " before returning): with one chunk the host reads out_stage[0] a microsecond after queueing the copy"
        " back, which takes several, and hands y whatever an earlier call left there. That is right when the"
        " earlier call had the same inputs (the grader repeats a case), so the check of 40 back-to-back calls on"
        " new values catches it. With several chunks the host's copy of the chunk before usually outlasts the"
        " GPU's work on the last one",
        mistake="missing wait",
    ),
    "06_async_copy.one_output_staging_buffer": Variant(
        "06_async_copy.cu",
        [
            ("cudaMemcpyAsync(p.out_stage[s], ", "cudaMemcpyAsync(p.out_stage[0], "),  # the copy back of chunk k
            ("p.out_stage[o], prev * sizeof", "p.out_stage[0], prev * sizeof"),  # the host's copy of chunk k - 1
            ("p.out_stage[last], ", "p.out_stage[0], "),  # the host's copy of the last chunk
        ],
        {"wrong"},
        "wrong",
        "one output staging buffer for both slots: the host waits for chunk k - 1 and copies it out, but chunk k's"
        " copy back into the same buffer is already queued and lands while (or before) the host reads: the copy"
        " engine (tens of GB/s) overtakes the host's copy of the chunk, so some of y's chunk k - 1 gets chunk k's"
        " results (2^22 + 3, 2^24)",
        mistake="staging buffer reused too early",
    ),
    "06_async_copy.registers_and_never_unregisters": Variant(
        "06_async_copy.cu",
        [
            (
                "    const size_t chunks = (n + CHUNK - 1) / CHUNK;\n",
                "    // page-lock the caller's arrays as well, so that the copies run at pinned speed\n"
                "    CUDA_CHECK(cudaHostRegister((void*)x, n * sizeof(float), cudaHostRegisterDefault));\n"
                "    CUDA_CHECK(cudaHostRegister(y, n * sizeof(float), cudaHostRegisterDefault));\n"
                "    const size_t chunks = (n + CHUNK - 1) / CHUNK;\n",
            )
        ],
        {"wrong"},
        "still registered",
        "registers x and y with cudaHostRegister and never unregisters them: the results are right, but the"
        " check after the first call finds x still page-locked (the driver's cuMemHostRegister answers"
        " CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED). Without the check, the next call on the same arrays would"
        " fail with cudaErrorHostMemoryAlreadyRegistered (crash)",
        mistake="caller memory left registered",
    ),
    # Task 15 (tensor-core ladder): entries for VARIANTS in lab2/solutions/broken.py.
    # Batches: "15_tensor_core.drops_last_k_step", "15_tensor_core.a_col_major" and
    # "15_tensor_core.store_unguarded" go in BATCHES, each in a different batch (one variant of a task
    # per grading run; they can share a batch with other tasks' wrong-verdict variants);
    # "15_tensor_core.no_barrier_after_loads" goes in SANITIZED (a race). None needs HUGE or TIMED.
    "15_tensor_core.drops_last_k_step": Variant(
        "15_tensor_core.cu",
        [("    for (int k = 0; k < K; k += WK) {\n", "    for (int k = 0; k + WK < K; k += WK) {\n")],
        {"wrong"},
        "wrong",
        "rung 1's K loop stops one step of 16 early: the last 16 products of every dot product are never added"
        " (16x16x16, the first case, has one step and gives zeros; 16x4096x16 is off by about 0.25)",
        mistake="K tail",
    ),
    "15_tensor_core.no_barrier_after_loads": Variant(
        "15_tensor_core.cu",
        [("        __syncthreads();  // both tiles complete before any warp loads a fragment from them\n", "")],
        {"sanitizer", "wrong"},
        "",
        "rung 2 has no barrier between storing its shared tiles and loading fragments from them: a warp reads"
        " chunks of A and B that other warps have not stored yet (the barrier after the products is left, so"
        " the barrier rule is satisfied)",
        mistake="missing barrier",
    ),
    "15_tensor_core.a_col_major": Variant(
        "15_tensor_core.cu",
        [("half, wmma::row_major> a;  // A[row0", "half, wmma::col_major> a;  // A[row0")],
        {"wrong"},
        "wrong",
        "rung 1 declares A's fragment col_major while A is row-major: load_matrix_sync then reads each 16 x 16"
        " block of A transposed (every address stays inside A, so nothing crashes); wrong from 16x16x16 on",
        mistake="layout",
    ),
    "15_tensor_core.store_unguarded": Variant(
        "15_tensor_core.cu",
        [("if (row < M && col < N)\n                wmma::store_matrix_sync(", "wmma::store_matrix_sync(")],
        {"wrong"},
        "out of bounds",
        "rung 2 stores all 64 fragments of its 128 x 128 tile, also those outside C: in 16x16x16 the fragments"
        " right of column 16 land on the next rows and those below row 16 up to index 2159 of a 256-element C"
        " (inside the grader's fence)",
        mistake="tile overhang",
    ),
    # Task 15, rung 3 (mma.sync, ldmatrix, swizzle, cp.async pipeline). "wait_count_off_by_one",
    # "chunks_past_k_copied" and "b_without_trans" each in a different BATCHES batch, none beside another
    # variant of task 15; "refill_before_barrier" in SANITIZED (a race that the values rarely show), where
    # it takes a grading run of its own beside "no_barrier_after_loads" (one variant of a task per run).
    "15_tensor_core.wait_count_off_by_one": Variant(
        "15_tensor_core.cu",
        [
            (
                "        cp_async_wait<STAGES - 2>();\n",
                "        cp_async_wait<STAGES - 1>();  // the STAGES - 1 tiles ahead may be in flight\n",
            )
        ],
        {"wrong"},
        "wrong",
        "rung 3 waits until at most STAGES - 1 groups are in flight instead of STAGES - 2: tile kt + 1's group"
        " counts as tile kt's. In the first iteration the prologue's 3 groups are all in flight and the wait"
        " returns at once, so tile 0's fragments come from stale shared memory (every case; on large K later"
        " tiles too, when their copies are slow)",
        mistake="pipeline wait count",
    ),
    "15_tensor_core.chunks_past_k_copied": Variant(
        "15_tensor_core.cu",
        [("a_in ? 16 : 0", "16"), ("b_in ? 16 : 0", "16")],
        {"wrong"},
        "wrong",
        "rung 3 keeps the source of a chunk outside A or B valid (the matrix's first chunk) but copies it with"
        " src_bytes 16 instead of 0: the chunks past K hold A[0][0..7] and B[0][0..7] instead of zeros, and the"
        " half tile at the end of K adds their products (16x16x16, K = 16, is the first case: half of its one"
        " tile lies past K); rows past M and columns past N only reach C's discarded part",
        mistake="zero fill",
    ),
    "15_tensor_core.b_without_trans": Variant(
        "15_tensor_core.cu",
        [("ldmatrix_x4_trans(&b[j][0],", "ldmatrix_x4(&b[j][0],")],
        {"wrong"},
        "wrong",
        "rung 3 loads B's fragments with ldmatrix without .trans: from B's k-major tile each lane then holds two"
        " values of one k for consecutive n, where mma's .col operand wants consecutive k for one n, so every"
        " 8 x 8 block of B is used transposed (16x16x16 on)",
        mistake="trans",
    ),
    "15_tensor_core.refill_before_barrier": Variant(
        "15_tensor_core.cu",
        [
            (
                "        cp_async_wait<STAGES - 2>();\n"
                "        __syncthreads();\n"
                "        if (kt + STAGES - 1 < tiles_k) load_tile(kt + STAGES - 1, (kt + STAGES - 1) % STAGES);\n"
                "        cp_async_commit();  // one group per iteration, empty at the end, so the count above holds\n",
                "        // the next tile first, so that its copies are in flight during the wait (which then\n"
                "        // allows one more group: the count still guarantees tile kt)\n"
                "        if (kt + STAGES - 1 < tiles_k) load_tile(kt + STAGES - 1, (kt + STAGES - 1) % STAGES);\n"
                "        cp_async_commit();\n"
                "        cp_async_wait<STAGES - 1>();\n"
                "        __syncthreads();\n",
            )
        ],
        {"sanitizer", "wrong"},
        "",
        "rung 3 issues the refill of stage (kt - 1) % STAGES before the barrier that ends every warp's reads of"
        " tile kt - 1: a warp still loading that tile's fragments races with the new copies (write after read;"
        " the wait count is adjusted, so every tile has landed when it is read). The copies land hundreds of"
        " cycles after they are issued, so the values rarely show it; racecheck counts an asynchronous write at"
        " its wait, so it finds the race only on the build whose cp_async_16 copies at once (COURSE_SYNC_COPIES),"
        " on 16x4096x16 and 32x1104x112, the small cases that refill stages",
        mistake="stage overwrite",
    ),
    # Task 15, rung 4 (TMA, mbarriers, wgmma, clusters of 2; sm_90a). Each in a different BATCHES batch,
    # none beside another variant of task 15; "expect_tx_own_copies_only" may hang until the grading
    # run's timeout, so it has a batch of its own, the last. They break hgemm_4 (`entry`): on a card
    # other than sm_90 the grader skips that entry point, and they are not graded there.
    "15_tensor_core.full_barrier_other_parity": Variant(
        "15_tensor_core.cu",
        [
            (
                "mbar_wait(sm.full(s), (it / STAGES) & 1);",
                "mbar_wait(sm.full(s), ((it / STAGES) & 1) ^ 1);  // as the producer's wait",
            )
        ],
        {"wrong", "crash"},
        "",
        "rung 4's consumers wait for a stage's full barrier with the parity the producer uses for the empty one:"
        " a fresh barrier passes a wait for parity 1 at once, and every later wait is one round early, so each"
        " stage is multiplied before its copies have landed (stale or uninitialised shared memory; wrong from"
        " 16x16x16 on). Nothing waits longer than the right kernel, so it does not hang; the last copies may"
        " still land after the block has left (hence a crash is accepted too)",
        mistake="barrier phase",
        entry="hgemm_4",
    ),
    "15_tensor_core.b_read_k_major": Variant(
        "15_tensor_core.cu",
        [
            (
                "wgmma_m64n256k16<1>(acc, da, db, kt > 0 || ks > 0);  // B's tile is n-major: transposed",
                "wgmma_m64n256k16<0>(acc, da, db, kt > 0 || ks > 0);  // B read K-major, as A is",
            )
        ],
        {"wrong", "crash"},
        "",
        "rung 4 gives wgmma TRANS_B = 0: B's tile (rows of k with n contiguous, as B's rows are) is read as"
        " K-major, each 8 x 8 core matrix transposed and the descriptor's offsets taken for the other dimension"
        " (wrong from 16x16x16 on; the last stage's operand then reaches past the tiles, which may also fault)",
        mistake="wgmma transpose",
        entry="hgemm_4",
    ),
    "15_tensor_core.wgmma_store_unguarded": Variant(
        "15_tensor_core.cu",
        [
            ("                if (c >= N) break;\n", ""),
            ("if (r < M) *reinterpret_cast", "*reinterpret_cast"),
            ("if (r + 8 < M)\n                    *reinterpret_cast", "*reinterpret_cast"),
        ],
        {"wrong"},
        "out of bounds",
        "rung 4's epilogue stores all of a consumer's 64 x 256 accumulators: in 16x16x16 both CTAs of the"
        " cluster (the second's tile wholly below C) write rows 0 to 255 at 16 floats a row, up to index 4335"
        " of a 256-element C (inside the grader's fence of 4096)",
        mistake="tile overhang",
        entry="hgemm_4",
    ),
    "15_tensor_core.k_steps_rounded_down": Variant(
        "15_tensor_core.cu",
        [("k_tiles((K + r4::BK - 1) / r4::BK)", "k_tiles(K / r4::BK)")],
        {"wrong"},
        "wrong",
        "rung 4 counts the steps of K rounded down: the last part of a step (TMA would read zeros past K) is"
        " never multiplied; 16x16x16, a quarter of a step, has no step at all and stores the zeroed"
        " accumulators, 1040x1296x2112 loses its last 16 of k",
        mistake="K tail",
        entry="hgemm_4",
    ),
    "15_tensor_core.expect_tx_own_copies_only": Variant(
        "15_tensor_core.cu",
        [
            (
                "mbar_arrive_expect_tx(sm.full(s), STAGE_BYTES);",
                "mbar_arrive_expect_tx(sm.full(s), A_BYTES + B_BYTES / CLUSTER);  // this CTA's copies",
            )
        ],
        {"wrong", "timeout"},
        "",
        "rung 4's producer announces only the bytes of its own copies (A's tile and its half of B) on the full"
        " barrier, not the half of B its partner multicasts into this CTA: a phase completes 16 KiB early, so a"
        " stage can be read before all of it has landed (wrong), and the bytes that land after the completion"
        " count against the next phase, whose count then passes below zero and never returns to it (a hang:"
        " the grader's timeout; 16x4096x16 wraps each stage 16 times)",
        mistake="expect_tx",
        entry="hgemm_4",
    ),
    # --- task 16 (attention ladder). Batches: "16_attention.no_rescale", "16_attention.causal_sees_next"
    # and "16_attention.drops_last_tile" each in a different BATCHES batch (one variant of a task per
    # grading run); "16_attention.no_barrier_before_next_tile" in SANITIZED.
    "16_attention.no_rescale": Variant(
        "16_attention.cu",
        [("            l *= alpha;  // the sum so far, rescaled to the new max\n", "")],
        {"wrong"},
        "wrong",
        "rung 2 rescales its output row o when the running max grows but not its running sum l: l keeps"
        " terms relative to an older, smaller max, so O = o / l comes out too small on every row whose max"
        " grew after its first chunk of 16 keys: right for T = 1; BH=2,T=17 fails when a row's 17th key holds"
        " its max (a row in 17 on average), BH=3,T=100 on most rows",
        mistake="no rescale",
    ),
    "16_attention.causal_sees_next": Variant(
        "16_attention.cu",
        [
            (
                "    const int last = causal ? min(row, T - 1) : T - 1;     // the last key this row sees\n",
                "    const int last = causal ? min(row + 1, T - 1) : T - 1;  // the last key this row sees\n",
            )
        ],
        {"wrong"},
        "wrong",
        "rung 2's causal mask is off by one: token i also sees token i + 1 (j <= i + 1 instead of j <= i)."
        " Right on every non-causal case and on BH=1,T=1 causal (there is no token 1); every row but the"
        " last of BH=2,T=17 causal is wrong",
        mistake="causal mask",
    ),
    "16_attention.drops_last_tile": Variant(
        "16_attention.cu",
        [
            (
                "    for (int k0 = 0; k0 < keys; k0 += BC) {\n",
                "    for (int k0 = 0; k0 + BC <= keys; k0 += BC) {  // whole tiles of keys\n",
            )
        ],
        {"wrong"},
        "wrong",
        "rung 2's loop over key tiles stops at the last whole tile of 64: the last T % 64 keys are never"
        " seen. With T < 64 no tile is read at all and O = 0 / 0 = NaN (BH=1,T=1 and BH=2,T=17); T = 100"
        " loses keys 64 to 99, T = 257 key 256",
        mistake="key tail",
    ),
    "16_attention.no_barrier_before_next_tile": Variant(
        "16_attention.cu",
        [("        __syncthreads();  // every warp is done with the previous tile before it is overwritten\n", "")],
        {"sanitizer", "wrong"},
        "",
        "rung 2 has no barrier between the last reads of one K/V tile and the loads of the next: a warp"
        " that finishes its chunks first overwrites Ks and Vs while the other warp of the block still reads"
        " them (T > 64: BH=3,T=100 and larger; the barrier after the loads is left, so the barrier rule"
        " is satisfied)",
        mistake="missing barrier",
    ),
    # Task 16, rung 3 (tensor cores: mma.sync, the online softmax on the accumulators, a cp.async
    # pipeline). Each in its own BATCHES batch, none beside another variant of task 16: the four of
    # batches 4 to 7 and three batches of their own at the end. None is a race: the sanitizer is not
    # needed to see them.
    "16_attention.mma_accumulators_not_rescaled": Variant(
        "16_attention.cu",
        [
            (
                "#pragma unroll\n"
                "        for (int n = 0; n < F::NO; ++n) o[n][2 * h] *= alpha, o[n][2 * h + 1] *= alpha;"
                "  // the accumulators too\n",
                "",
            )
        ],
        {"wrong"},
        "wrong",
        "rung 3 rescales its running sums l when a row's max grows but not the output accumulators o: the terms"
        " of earlier tiles keep their size relative to the older, smaller max, too large against l. Right while"
        " a row has one tile of 64 keys (T <= 64); from T = 100 on, wrong on the rows whose max grows in a later"
        " tile",
        mistake="no rescale",
    ),
    "16_attention.v_fragments_without_trans": Variant(
        "16_attention.cu",
        [("ldmatrix_x4_trans(vf, Vs + ", "ldmatrix_x4(vf, Vs + ")],
        {"wrong"},
        "wrong",
        "rung 3 loads V's fragments with ldmatrix without .trans, as it loads K's: V's tile is key-major like K's,"
        " but in P V the keys are the k of the product, and mma's .col operand wants pairs of consecutive keys for"
        " one column of d, where a plain ldmatrix gives consecutive d for one key. Every 8 x 8 block of V is used"
        " transposed: wrong from BH=1,T=1 on (there only the first d of every 8 is right)",
        mistake="fragment layout",
    ),
    "16_attention.mma_causal_sees_next": Variant(
        "16_attention.cu",
        [
            ("(causal && key > r))", "(causal && key > r + 1))"),
            ("(causal && key > r + 8))", "(causal && key > r + 9))"),
        ],
        {"wrong"},
        "wrong",
        "rung 3's causal mask is off by one on the diagonal tile: the query of row r also sees key r + 1. Right on"
        " every non-causal case and on BH=1,T=1 causal (there is no key 1); every causal case from T = 17 on is"
        " wrong",
        mistake="causal mask",
    ),
    "16_attention.tail_tile_left_unmasked": Variant(
        "16_attention.cu",
        [
            (
                "if (k0 + F::BC > T || (causal && k0 + F::BC - 1 > wrow)) mask_scores",
                "if (causal && k0 + F::BC - 1 > wrow) mask_scores",  # the diagonal tile only
            )
        ],
        {"wrong"},
        "wrong",
        "rung 3 masks only the tiles on the diagonal, as if the mask were there for causality alone: a partial"
        " last tile of keys is left unmasked when it is not on the diagonal (non-causal), and its keys past T,"
        " zero rows of K, get scores of 0 instead of -inf, so weights exp2(-m) that inflate l. Right on the causal"
        " cases (their rows never reach past T) and on T = 64 and 1024; wrong from BH=1,T=1 on (the non-causal"
        " cases with T % 64 != 0)",
        mistake="key tail",
    ),
    "16_attention.kv_wait_count_off_by_one": Variant(
        "16_attention.cu",
        [
            (
                "        cp_async_wait<0>();\n",
                "        cp_async_wait<1>();  // the next tile's copies may stay in flight\n",
            )
        ],
        {"wrong"},
        "",
        "rung 3 waits until at most one group is in flight instead of none: at the top of iteration j the only"
        " group in flight is tile j's own, so the wait returns at once. Tile 0's fragments are read tens of cycles"
        " after its copies were issued, from whatever shared memory held before (in practice every block of every case;"
        " later tiles were issued a whole tile of work earlier and have usually landed). What was there differs"
        " from run to run, so the verdict is wrong either as values off or as two runs that disagree (a race;"
        " both seen on an H200)",
        mistake="pipeline wait count",
    ),
    "16_attention.scale_one_over_d": Variant(
        "16_attention.cu",
        [("LOG2E / sqrtf((float)F::D)", "LOG2E / (float)F::D")],
        {"wrong"},
        "wrong",
        "rung 3 scales the scores by 1/D instead of 1/sqrt(D) (log2(e) / 64 for D = 64): every row's weights come"
        " out flatter, closer to the mean of V. Right on BH=1,T=1 (one key has weight 1 whatever its score);"
        " wrong from T = 17 on",
        mistake="scale",
    ),
    "16_attention.bf16_rounded_as_half": Variant(
        "16_attention.cu",
        [
            (
                "    if constexpr (std::is_same_v<E, half>) {\n"
                "        const half2 v = __floats2half2_rn(lo, hi);\n"
                "        return *reinterpret_cast<const uint32_t*>(&v);\n"
                "    } else {\n"
                "        const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);\n"
                "        return *reinterpret_cast<const uint32_t*>(&v);\n"
                "    }\n",
                "    const half2 v = __floats2half2_rn(lo, hi);  // two 16-bit floats\n"
                "    return *reinterpret_cast<const uint32_t*>(&v);\n",
            )
        ],
        {"wrong"},
        "wrong",
        "rung 3's pack2 rounds to float16 for both types: attention_3 is right, attention_3_bf16 gets float16 bits"
        " read as bfloat16, in P (mma's A operand) and in O (1.0 becomes 2^-7): wrong on every case",
        mistake="bf16 conversion",
    ),
    # --- task 09 (the numbers notebook). Each in its own batch (one variant of a task per grading run);
    # the checks run after the whole notebook, so each is graded at the notebook's own time limit.
    "09_numbers.loads_optimized_away": Variant(
        "09_numbers.ipynb",
        [("    if (acc == -1.0f) out[0] = acc;  // x is all ones: never true, but the compiler cannot know\n", "")],
        {"wrong"},
        "past the card's DRAM peak",
        "read_sum without its guarded write: the sum is never used, so the compiler drops the loads and the"
        " kernel reads nothing; read_bandwidth reports what an empty loop costs, far past HBM's bound",
        mistake="dead loads",
    ),
    "09_numbers.host_timer_without_sync": Variant(
        "09_numbers.ipynb",
        [
            (
                "    ms = time_ms(lambda: run(_read_sum, grid, 256, *args))\n",
                "    import time\n\n"
                "    t0 = time.perf_counter()\n"
                "    run(_read_sum, grid, 256, *args)  # returns as soon as the launch is queued\n"
                "    ms = (time.perf_counter() - t0) * 1e3\n",
            )
        ],
        {"wrong"},
        "past the card's DRAM peak",
        "read_bandwidth times the launch call with the host's clock and never waits for the GPU: it measures"
        " how long queueing a kernel takes, microseconds for any amount of data",
        mistake="host timer without sync",
    ),
    "09_numbers.shared_bank_conflicts": Variant(
        "09_numbers.ipynb",
        [("tile[(t + 32 * r) & 1023];", "tile[(32 * t + r) & 1023];")],
        {"wrong"},
        "bank conflicts",
        "shared_read's lanes read float4s 512 bytes apart (32 * t): every lane of a warp hits the same four"
        " banks, so each warp instruction takes many times the four wavefronts a conflict-free one needs, and"
        " the measured shared-memory bandwidth falls far below 30% of 128 bytes per SM per clock",
        mistake="bank conflicts",
    ),
    # --- classes added for issue 22 (one new variant per class; batches at the end) ---
    "01_coalescing.alignment_of_a_and_b_only": Variant(
        "01_coalescing.cu",
        [
            (
                "    const bool alike = (((uintptr_t)a ^ (uintptr_t)b) & 15) == 0"
                " && (((uintptr_t)a ^ (uintptr_t)c) & 15) == 0;\n",
                "    const bool alike = (((uintptr_t)a ^ (uintptr_t)b) & 15) == 0;"
                "  // both inputs on one 16-byte grid\n",
            )
        ],
        {"crash"},
        "misaligned",
        "picks the longlong2 kernel when a and b are aligned alike, without looking at c: the misaligned-views"
        " check's c one element into its buffer (a and b aligned, n = 2) stores a longlong2 at an address 8 bytes"
        " past a 16-byte boundary",
        mistake="unaligned pointer",
    ),
    "01_coalescing.one_pair_per_thread": Variant(
        "01_coalescing.cu",
        [
            (
                "    for (size_t i = tid; i < pairs; i += stride) {\n",
                "    if (const size_t i = tid; i < pairs) {  // a pair per thread\n",
            )
        ],
        {"wrong"},
        "never written",
        "one pair per thread on the fixed grid of resident blocks (1056 x 256 threads on an H100, 540672 elements):"
        " no grid-stride loop, so n = 2^20 + 3 and 2^26 keep the grader's sentinel past them",
        mistake="no grid-stride loop",
    ),
    "02_divergence.drops_the_top_coefficient": Variant(
        "02_divergence.cu",
        [
            (
                "        float acc = coef(DEGREE);\n",
                "        float acc = 0.0f;  // Horner's rule, from the top coefficient down\n",
            )
        ],
        {"wrong"},
        "wrong",
        "Horner's rule started at 0 with the loop from DEGREE - 1: the term c_56 t^56 is never added. It is"
        " 1/57^2 = 3.1e-4 (times s) at t = +-1, which x = -2, -1, 0, 1 and 2 map to (the injected values, n >= 22),"
        " and under 1e-5 for |t| < 0.93: a random x alone is caught only near a piece's ends",
        mistake="polynomial degree",
    ),
    "03_waves.dynamic_smem_ignored": Variant(
        "03_waves.cu",
        [
            (
                "round_up((long long)attr.sharedSizeBytes + reserved + (long long)dynamic_smem,\n",
                "round_up((long long)attr.sharedSizeBytes + reserved,  // the kernel's shared memory: its attributes\n",
            )
        ],
        {"wrong"},
        "occupancy calculator says",
        "counts the kernel's static shared memory only, as cudaFuncGetAttributes reports it: right for every"
        " configuration without dynamic shared memory, wrong for busy_kernel with 40 KiB per block, where"
        " shared memory, not threads, is the limit",
        mistake="dynamic shared memory",
    ),
    "03_waves.calculator_as_the_answer": Variant(
        "03_waves.cu",
        [
            (
                "    *blocks_per_sm = (int)fit;\n",
                "    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor("
                "blocks_per_sm, fn, threads, dynamic_smem));\n",
            )
        ],
        {"rule violation"},
        "the occupancy calculator is the grader's check",
        "the derivation computed, then the runtime's occupancy calculator asked instead: every number right,"
        " the lesson skipped; the compiled rule sees the call occupancy_report reaches",
        mistake="calculator as the answer",
    ),
    "03_waves.registers_not_per_quarter": Variant(
        "03_waves.cu",
        [
            (
                "        const long long warps_by_regs = (regs_per_sm / QUARTERS / regs_per_warp) * QUARTERS;\n",
                "        const long long warps_by_regs = regs_per_sm / regs_per_warp;  // the whole file at once\n",
            )
        ],
        {"wrong"},
        "occupancy calculator says",
        "warps counted against the whole register file instead of per quarter: heavy_kernel (84 registers,"
        " 2816 a warp) gets 23 warps an SM, not 4 x 5 = 20, so 7 blocks of 96 threads instead of 6",
        mistake="register rounding",
    ),
    "03_waves.reserved_kilobyte_left_out": Variant(
        "03_waves.cu",
        [
            (
                "round_up((long long)attr.sharedSizeBytes + reserved + (long long)dynamic_smem,\n",
                "round_up((long long)attr.sharedSizeBytes + (long long)dynamic_smem,\n",
            ),
            # without the reserved bytes a kernel with no shared memory needs none: the student guards the division
            (
                "    fit = std::min(fit, smem_per_sm / smem);\n",
                "    if (smem > 0) fit = std::min(fit, smem_per_sm / smem);\n",
            ),
        ],
        {"wrong"},
        "occupancy calculator says",
        "the driver's reserved kilobyte per block left out: busy_kernel with 64 threads and 8 KiB gets"
        " 228 / 8 = 28 blocks, not 228 / 9 = 25 (an H100; 40 and 48 KiB round to the same count either way)",
        mistake="reserved shared memory",
    ),
    "04_streams.kernel_on_the_default_stream": Variant(
        "04_streams.cu",
        [
            (
                "        scramble_kernel<<<blocks_for(count), THREADS, 0, stream>>>(d, count);\n",
                "        scramble_kernel<<<blocks_for(count), THREADS>>>(d, count);  // between the chunk's copies\n",
            )
        ],
        {"crash", "wrong"},
        "",
        "the chunk's kernel launched on the legacy default stream between its copies on a non-blocking stream:"
        " nothing orders it after the upload or before the download, so pipeline_streams downloads the staged x"
        " (or a half-scrambled chunk). In pipeline_graph's capture (the second call of the size sequence) the"
        " launch is not captured: it runs at once, outside the graph, or invalidates the capture, so the graph"
        " replays the copies without the kernel (y = x) or the call returns an error",
        mistake="wrong stream",
    ),
    "04_streams.graph_ignores_moved_buffers": Variant(
        "04_streams.cu",
        [
            (
                "    if (exec == nullptr || n != built_n || buf.generation != built_generation) {\n",
                "    if (exec == nullptr || n != built_n) {  // a graph per size\n",
            )
        ],
        {"crash", "wrong"},
        "",
        "the graph is captured again when n changes but not when the buffers move: in the size sequence,"
        " pipeline_streams(2^22 + 5) reallocates them and pipeline_graph(3000) then replays copies into the freed"
        " ones (y keeps the staged x, or the copy faults)",
        mistake="stale graph",
    ),
    "05_graph.bind_set_on_the_built_graph": Variant(
        "05_graph.cu",
        [
            (
                "    CUDA_CHECK(cudaGraphExecKernelNodeSetParams(g.exec, g.bind, &bind));\n",
                "    CUDA_CHECK(cudaGraphKernelNodeSetParams(g.bind, &bind));  // this call's pointers\n",
            )
        ],
        {"crash"},
        "illegal memory access",
        "gives this call's pointers to the bind node of the built graph, which the instantiated one copied at"
        " cudaGraphInstantiate: every launch still binds the null pointers of the build, and the leaves read"
        " in = nullptr (graph_follows_n's first call)",
        mistake="pointers of the call",
    ),
    "06_async_copy.kernel_on_the_default_stream": Variant(
        "06_async_copy.cu",
        [
            (
                "        scale_kernel<<<blocks_for(count), THREADS, 0, p.stream[s]>>>(p.dev[s], count, a);\n",
                "        scale_kernel<<<blocks_for(count), THREADS>>>(p.dev[s], count, a);\n",
            )
        ],
        {"wrong"},
        "wrong",
        "the kernel on the legacy default stream, which the slots' non-blocking streams do not wait for nor hold"
        " up: it scales dev[s] whenever it gets there, usually before the upload lands and after the download left,"
        " so y gets x unscaled (or the previous chunk's values scaled); the 40 back-to-back calls and every case"
        " from n = 1000 on",
        mistake="wrong stream",
    ),
    "07_fusion.no_column_guard": Variant(
        "07_fusion.cu",
        [("    if (col >= cols) return;\n    const float b = bias[col];\n", "    const float b = bias[col];\n")],
        {"wrong"},
        "out of bounds",
        "no guard on the column: the block's threads past cols read bias past its end and write into the next"
        " row, and the last row's into the memory after y (1x1: 255 floats past the end, inside the grader's fence)",
        mistake="column tail",
    ),
    "08_inline_ptx.index_ignores_threadidx_y": Variant(
        "08_inline_ptx.cu",
        [
            (
                "    const size_t i = (size_t)blockIdx.x * (blockDim.x * blockDim.y) + t;\n",
                "    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;  // one element per thread\n",
            )
        ],
        {"wrong"},
        "wrong",
        "numbers elements as a 1-D launch would, in the given 16 x 16 blocks: the 16 rows of a block share"
        " elements 16 b to 16 b + 15, elements past 16 x blocks are never written (n = 1 passes, n = 31 fails), and"
        " the lanes written to one element race (lane x or x + 16)",
        mistake="2-D block index",
    ),
    "10_reduction.assumes_aligned_input": Variant(
        "10_reduction.cu",
        [
            (
                "    const size_t misaligned = ((16 - ((uintptr_t)in & 15)) & 15) / 4;\n",
                "    const size_t misaligned = 0;  // cudaMalloc returns 256-byte aligned arrays\n",
            )
        ],
        {"crash"},
        "misaligned",
        "rung 6 takes its input to start on a 16-byte boundary, as cudaMalloc's do: the view one float into its"
        " buffer (n = 4097) is read as float4s at addresses 4 bytes past one",
        mistake="unaligned view",
    ),
    "11_transpose.tile_read_along_rows": Variant(
        "11_transpose.cu",
        [
            (
                "    // lane x reads tile[x][y], bank (x + y) % 32: conflict-free\n"
                "    const int out_c = t.row0 + threadIdx.x;\n"
                "#pragma unroll\n"
                "    for (int k = 0; k < TILE; k += BLOCK_ROWS) {\n"
                "        const int y = threadIdx.y + k, out_r = t.col0 + y;\n"
                "        if (out_r < cols && out_c < rows) out[(size_t)out_r * rows + out_c] = tile[threadIdx.x][y];\n",
                "    // lane x reads tile[y][x], along a row: no bank conflict at all\n"
                "    const int out_c = t.row0 + threadIdx.x;\n"
                "#pragma unroll\n"
                "    for (int k = 0; k < TILE; k += BLOCK_ROWS) {\n"
                "        const int y = threadIdx.y + k, out_r = t.col0 + y;\n"
                "        if (out_r < cols && out_c < rows) out[(size_t)out_r * rows + out_c] = tile[y][threadIdx.x];\n",
            )
        ],
        {"wrong"},
        "wrong",
        "rung 3 reads its tile along rows (tile[y][x]) when it stores: each tile lands in its transposed place but"
        " is not itself transposed (out[col0 + y][row0 + x] = in[row0 + y][col0 + x]). Right on 1x1 only; in 1x33"
        " it stores tile rows that were never loaded",
        mistake="tile not transposed",
    ),
    "12_scan.look_back_stops_at_nearest": Variant(
        "12_scan.cu",
        [
            (
                "        const unsigned found = __ballot_sync(0xffffffffu, inclusive);\n",
                "        const unsigned found = __ballot_sync(0xffffffffu, true);  // the nearest tile is enough\n",
            )
        ],
        {"wrong"},
        "wrong",
        "rung 3's look-back stops at the nearest tile whatever it published: when that tile has published only"
        " its own total (its look-back still running), the prefix misses every tile before it. Right when each"
        " predecessor happened to be done; with hundreds of tiles in flight (n = 2^20 + 3 on) many are not",
        mistake="look-back stops early",
    ),
    "12_scan.look_back_adds_past_the_prefix": Variant(
        "12_scan.cu",
        [("        if (found != 0 && (int)lane > __ffs(found) - 1) value = 0.0;\n", "")],
        {"wrong"},
        "wrong",
        "rung 3's look-back adds all 32 values of its window even when a nearer tile has published its inclusive"
        " prefix, which already contains the tiles beyond it: those are counted twice (from tile 2 on, as soon"
        " as two tiles of a window have published prefixes)",
        mistake="look-back past the prefix",
    ),
    "12_scan.offsets_to_first_blockdim_only": Variant(
        "12_scan.cu",
        [
            (
                "    for (unsigned j = threadIdx.x; j < tile; j += blockDim.x) {\n"
                "        const size_t i = b * tile + j;\n"
                "        if (i < count) out[i] += offset;\n"
                "    }\n",
                "    const size_t i = b * tile + threadIdx.x;  // one element per thread\n"
                "    if (i < count) out[i] += offset;\n",
            )
        ],
        {"wrong"},
        "wrong",
        "phase 3 adds a tile's offset with one element per thread, but its blocks have 256 threads and the tiles"
        " 512 (rung 1) or 1024 (rung 2) elements: elements 256 and on of every tile after the first keep their"
        " tile-local prefix (n = 1000, rung 1, from element 768 on)",
        mistake="tile longer than its block",
    ),
    "13_softmax.online_strides_by_blockdim": Variant(
        "13_softmax.cu",
        [
            (
                "        for (size_t c = first; c < (size_t)cols; c += step) {\n"
                "            load_vec<VW>(xr + c, v);\n"
                "            s = fold<VW>(s, v);\n",
                "        for (size_t c = first; c < (size_t)cols; c += blockDim.x) {\n"
                "            load_vec<VW>(xr + c, v);\n"
                "            s = fold<VW>(s, v);\n",
            ),
            (
                "        for (size_t c = first; c < (size_t)cols; c += step) {\n"
                "            load_vec<VW>(xr + c, v);\n"
                "#pragma unroll\n"
                "            for (int j = 0; j < VW; ++j) v[j] = expf(v[j] - s.m) * inv;\n",
                "        for (size_t c = first; c < (size_t)cols; c += blockDim.x) {\n"
                "            load_vec<VW>(xr + c, v);\n"
                "#pragma unroll\n"
                "            for (int j = 0; j < VW; ++j) v[j] = expf(v[j] - s.m) * inv;\n",
            ),
        ],
        {"wrong"},
        "wrong",
        "rung 4's streaming path (rows longer than 1024 x 16 floats) strides blockDim.x floats instead of"
        " blockDim.x vectors: right with scalar loads (3x20001), but with float4s (64x65536) the threads' vectors"
        " overlap and every value is summed about 4 times, so y is about a quarter of the answer",
        mistake="long rows",
    ),
    "13_softmax.one_pass_variance": Variant(
        "13_softmax.cu",
        [
            (
                "    s.n += 1.0f;\n"
                "    const float delta = v - s.mean;\n"
                "    s.mean += delta / s.n;\n"
                "    s.m2 += delta * (v - s.mean);"
                "  // old and new deviation: exact in exact arithmetic, stable in floats\n",
                "    s.n += 1.0f;\n"
                "    s.mean += v;    // the sum, for now\n"
                "    s.m2 += v * v;  // the sum of squares\n",
            ),
            (
                "    const float n = a.n + b.n;\n"
                "    if (n == 0.0f) return a;  // both empty\n"
                "    const float delta = b.mean - a.mean;\n"
                "    return {n, (a.n * a.mean + b.n * b.mean) / n, a.m2 + b.m2 + delta * delta * (a.n * b.n / n)};\n",
                "    return {a.n + b.n, a.mean + b.mean, a.m2 + b.m2};\n",
            ),
            (
                "    const float mean = s.mean, rstd = rsqrtf(s.m2 / (float)cols + eps);\n",
                "    const float mean = s.mean / (float)cols;\n"
                "    const float rstd = rsqrtf(s.m2 / (float)cols - mean * mean + eps);  // var = E[x^2] - E[x]^2\n",
            ),
        ],
        {"wrong"},
        "E[x²]",
        "layer norm's variance in one pass as E[x^2] - E[x]^2, sums of x and x^2 merged across the block: right"
        " on every case (means near 0), but on rows of mean 1e4 and standard deviation 1 both terms are near 1e8,"
        " where a float32's spacing is 8, and the difference is noise of that size (the large-mean check)",
        mistake="large mean",
    ),
    "14_sgemm.float4_store_guarded_by_first_column": Variant(
        "14_sgemm.cu",
        [
            (
                "        if (col < cols) p[0] = v.x;\n"
                "        if (col + 1 < cols) p[1] = v.y;\n"
                "        if (col + 2 < cols) p[2] = v.z;\n"
                "        if (col + 3 < cols) p[3] = v.w;\n",
                "        if (col < cols) p[0] = v.x, p[1] = v.y, p[2] = v.z, p[3] = v.w;"
                "  // the four start inside the row\n",
            )
        ],
        {"wrong"},
        "out of bounds",
        "store4's scalar path (rungs 6 and 7 when N is not a multiple of 4 or a pointer is unaligned) guards the"
        " four stores by the first one's column: a row ending inside the four spills into the next row, and the"
        " last row past C (1x1x1: C[1..3])",
        mistake="row end inside a float4",
    ),
    "15_tensor_core.unpadded_leading_dimension": Variant(
        "15_tensor_core.cu",
        [
            (
                "wmma::load_matrix_sync(b[j], &Bs[kk][wcol + j * WN], LDB);",
                "wmma::load_matrix_sync(b[j], &Bs[kk][wcol + j * WN], BN);  // B's tile is BN wide",
            )
        ],
        {"wrong"},
        "wrong",
        "rung 2 loads B's fragments with a leading dimension of BN = 128 halves where the padded tile's rows are"
        " LDB = 136 apart: row r of every fragment starts 8 r halves early (shifted left by 8 r columns, into the"
        " row above's padding for the first ones): 15 of its 16 rows are misread, wrong from 16x16x16 on",
        mistake="leading dimension",
    ),
    "16_attention.softmax_rows_stride_by_block": Variant(
        "16_attention.cu",
        [("j += WARP)", "j += blockDim.x)")],
        {"wrong"},
        "wrong",
        "rung 1's softmax_rows_kernel gives a row to a warp but strides its lanes blockDim.x (256) apart, as a"
        " block-per-row kernel would: right while T <= 32, but from T = 100 on the keys from 32 on are left out of"
        " the max and the sum and never written (P keeps the raw scores there)",
        mistake="long rows",
    ),
}

# one grading run per batch: each batch mixes tasks, so a hang or a crash must not stop the rest
BATCHES = [
    [
        "00_profile_first.edges_not_clamped",
        "01_coalescing.misses_the_tail",
        "02_divergence.wrong_piece",
        "03_waves.occupancy_from_threads",
        "04_streams.no_wait",
        "05_graph.tree_waits_for_bind_only",
        "06_async_copy.last_chunk_not_waited_for",
        "09_numbers.loads_optimized_away",
        "07_fusion.bias_by_row",
        "08_inline_ptx.float_as_r",
        "10_reduction.drops_the_tail",
        "11_transpose.store_unguarded",
        "12_scan.offset_to_wrong_block",
        "13_softmax.online_overflows",
        "14_sgemm.ignores_k_tail",
        "15_tensor_core.drops_last_k_step",
        "16_attention.no_rescale",
    ],
    [
        "00_profile_first.odd_iters_end_in_scratch",
        "02_divergence.no_grid_stride",
        "03_waves.waves_round_down",
        "04_streams.graph_never_rebuilt",
        "05_graph.kept_after_n_changed",
        "06_async_copy.one_output_staging_buffer",
        "09_numbers.host_timer_without_sync",
        "07_fusion.no_row_loop",
        "08_inline_ptx.lane_from_threadidx",
        "11_transpose.out_index_swapped",
        "12_scan.pair_guard_drops_tail",
        "13_softmax.first_warp_only",
        "14_sgemm.no_row_guard_on_store",
        "15_tensor_core.a_col_major",
        "16_attention.causal_sees_next",
        "01_coalescing.alignment_of_a_and_b_only",
        "10_reduction.assumes_aligned_input",
    ],
    [
        "00_profile_first.malloc_every_round",
        "02_divergence.boundary_to_the_right",
        "03_waves.hardcoded_sms",
        "04_streams.staging_never_grows",
        "05_graph.root_writes_partials",
        "06_async_copy.registers_and_never_unregisters",
        "09_numbers.shared_bank_conflicts",
        "08_inline_ptx.bfe_operands_swapped",
        "12_scan.exclusive",
        "13_softmax.write_stops_at_blockdim",
        "14_sgemm.a_column_major",
        "15_tensor_core.store_unguarded",
        "16_attention.drops_last_tile",
        "01_coalescing.one_pair_per_thread",
        "07_fusion.no_column_guard",
        "11_transpose.tile_read_along_rows",
    ],
    [
        "03_waves.waves_in_double",
        "08_inline_ptx.fma_in_a_comment",
        "13_softmax.unbiased_variance",
        "02_divergence.drops_the_top_coefficient",
        "04_streams.kernel_on_the_default_stream",
        "06_async_copy.kernel_on_the_default_stream",
        "12_scan.offsets_to_first_blockdim_only",
        "14_sgemm.float4_store_guarded_by_first_column",
        "15_tensor_core.unpadded_leading_dimension",
        "16_attention.softmax_rows_stride_by_block",
    ],
    [
        "03_waves.dynamic_smem_ignored",
        "04_streams.graph_ignores_moved_buffers",
        "08_inline_ptx.index_ignores_threadidx_y",
        "13_softmax.online_strides_by_blockdim",
        "15_tensor_core.wait_count_off_by_one",
        "16_attention.mma_accumulators_not_rescaled",
    ],
    [
        "05_graph.bind_set_on_the_built_graph",
        "13_softmax.one_pass_variance",
        "02_divergence.branches_spelled_by_macros",
        "03_waves.calculator_as_the_answer",
        "15_tensor_core.chunks_past_k_copied",
        "16_attention.v_fragments_without_trans",
    ],
    [
        "03_waves.registers_not_per_quarter",
        "15_tensor_core.b_without_trans",
        "12_scan.look_back_stops_at_nearest",
        "16_attention.mma_causal_sees_next",
    ],
    [
        "03_waves.reserved_kilobyte_left_out",
        "12_scan.look_back_adds_past_the_prefix",
        "16_attention.tail_tile_left_unmasked",
        "15_tensor_core.full_barrier_other_parity",
    ],
    ["16_attention.kv_wait_count_off_by_one", "15_tensor_core.b_read_k_major"],
    ["16_attention.scale_one_over_d", "15_tensor_core.wgmma_store_unguarded"],
    ["16_attention.bf16_rounded_as_half", "15_tensor_core.k_steps_rounded_down"],
    ["15_tensor_core.expect_tx_own_copies_only"],  # may hang until the run's timeout: alone, last
]
# graded with compute-sanitizer as well (one run per variant of a task: task 15 has two races)
SANITIZED = [
    "10_reduction.last_warp_race",
    "11_transpose.barrier_before_loads",
    "12_scan.hillis_steele_race",
    "14_sgemm.no_barrier_before_next_tile",
    "15_tensor_core.no_barrier_after_loads",
    "15_tensor_core.refill_before_barrier",
    "16_attention.no_barrier_before_next_tile",
]
# verdicts the build decides (the rules judge what was compiled): graded on a machine without a GPU too
AT_BUILD: list[str] = [
    "00_profile_first.malloc_every_round",
    "03_waves.calculator_as_the_answer",
    "08_inline_ptx.lane_from_threadidx",
    "03_waves.hardcoded_sms",
    "08_inline_ptx.fma_in_a_comment",
]
# Not caught, so not listed: a level-1 node waiting for the wrong run of FANIN nodes below it
# (`below.data() + j` for `+ first`). On an H200, 32 replays of 4096 leaves that each read an
# unaligned input, alternating two inputs, never showed the race: the graph ran each level's nodes
# before the next level's. graph_edges_hold_under_replay still catches the level-1 nodes that wait
# for the bind node alone (tree_waits_for_bind_only).
HUGE: list[str] = []  # graded with the cases past 2^31 elements (tens of GB of GPU memory)
# graded with timing on (quick): they pass every correctness check and game only the timed calls,
# or are right but slow and must earn no performance points
TIMED: list[str] = ["00_profile_first.one_thread_per_block", "04_streams.one_stream", "11_transpose.no_padding"]

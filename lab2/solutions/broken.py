"""Deliberately broken lab 2 submissions, written as edits to the reference solutions.

tests/test_broken_variants.py applies each edit, grades the result and expects the verdict
given here, as for lab 1 (lab1/solutions/broken.py). Keeping them as edits means they follow
the solutions: if a solution changes so that an edit no longer applies, the test says so
instead of grading a stale copy.
"""

from __future__ import annotations

from grader.tests.variants import Variant

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
    ),
    # --- task 03: waves and tails (batches: see the note at the end) ---
    "03_waves.occupancy_from_threads": Variant(
        "03_waves.cu",
        [
            (
                "    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor("
                "blocks_per_sm, fn, threads, dynamic_smem));\n",
                "    int threads_per_sm = 0;\n"
                "    CUDA_CHECK(cudaDeviceGetAttribute("
                "&threads_per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, device));\n"
                "    *blocks_per_sm = threads_per_sm / threads;  // as many blocks as the SM has thread slots\n",
            )
        ],
        {"wrong"},
        "counts threads only",
        "blocks per SM from maxThreadsPerMultiProcessor / threads: right for busy_kernel with 1024 and 256 threads,"
        " wrong once 40 KiB of shared memory per block lets only 5 (H100) or 4 (A100) blocks in, not 8",
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
    ),
    "08_inline_ptx.lane_from_threadidx": Variant(
        "08_inline_ptx.cu",
        [("    lanes[i] = lane_id();\n", "    lanes[i] = threadIdx.x % 32;  // the lane, without the PTX\n")],
        {"wrong"},
        "`lanes`",
        "takes the lane from threadIdx.x (lane_id keeps its %laneid, so the rule holds): in the given 16 x 16"
        " blocks a warp is two rows, and every thread of an odd row is 16 lanes off (n = 1 passes, n = 31 fails)",
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
    ),
    "08_inline_ptx.bfe_operands_swapped": Variant(
        "08_inline_ptx.cu",
        [('"r"(x), "r"(pos), "r"(len));\n', '"r"(x), "r"(len), "r"(pos));\n')],
        {"wrong"},
        "`fields`",
        "gives bfe.u32 the length before the position (bfe.u32 d, a, pos, len): only fields with pos == len survive",
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
    ),
    "12_scan.offset_to_wrong_block": Variant(
        "12_scan.cu",
        [("    const float offset = offsets[b - 1];\n", "    const float offset = offsets[b];\n")],
        {"wrong"},
        "wrong",
        "phase 3 adds to tile b the inclusive scan of the totals up to b itself (offsets[b], not"
        " offsets[b - 1]): every tile after the first counts its own total twice (rungs 1 and 2)",
    ),
    "12_scan.hillis_steele_race": Variant(
        "12_scan.cu",
        [("        src = 1 - src;\n        __syncthreads();\n", "        src = 1 - src;\n")],
        {"sanitizer", "wrong"},
        "",
        "rung 1 drops the barrier between its doubling steps, trusting the double buffer: a warp reads"
        " a neighbour's value before that warp has written it (the barrier after the loads is left, so"
        " the kernel still has one)",
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
        " uses the biased one: 0 / 0 = NaN at cols = 1, 1.5% off at 1x33, 0.05% at 1000 columns",
    ),
    "15_sgemm.ignores_k_tail": Variant(
        "15_sgemm.cu",
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
    ),
    "15_sgemm.no_barrier_before_next_tile": Variant(
        "15_sgemm.cu",
        [("        __syncthreads();  // everyone done reading before the next step overwrites them\n", "")],
        {"sanitizer", "wrong"},
        "",
        "rung 3 has no barrier between the products of one K step and the loads of the next: a fast warp"
        " overwrites the shared tiles while slower warps still read them (K > 32: 65x129x31 and larger; one"
        " barrier is left, so the barrier rule is satisfied)",
    ),
    "15_sgemm.no_row_guard_on_store": Variant(
        "15_sgemm.cu",
        [("    if (row >= rows) return;\n", "")],
        {"wrong"},
        "out of bounds",
        "store4 (rungs 6 and 7) checks the column but not the row: the threads of a 128 x 128 tile that sticks out"
        " of C write rows M and beyond (1x1x1: 127 floats past the end of C, inside the grader's fence)",
    ),
    "15_sgemm.a_column_major": Variant(
        "15_sgemm.cu",
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
    ),
}

# one grading run per batch: each batch mixes tasks, so a hang or a crash must not stop the rest
BATCHES = [
    [
        "01_coalescing.misses_the_tail",
        "02_divergence.wrong_piece",
        "03_waves.occupancy_from_threads",
        "07_fusion.bias_by_row",
        "08_inline_ptx.float_as_r",
        "10_reduction.drops_the_tail",
        "11_transpose.store_unguarded",
        "12_scan.offset_to_wrong_block",
        "13_softmax.online_overflows",
        "15_sgemm.ignores_k_tail",
    ],
    [
        "02_divergence.no_grid_stride",
        "03_waves.waves_round_down",
        "07_fusion.no_row_loop",
        "08_inline_ptx.lane_from_threadidx",
        "11_transpose.out_index_swapped",
        "12_scan.pair_guard_drops_tail",
        "13_softmax.first_warp_only",
        "15_sgemm.no_row_guard_on_store",
    ],
    [
        "02_divergence.boundary_to_the_right",
        "03_waves.hardcoded_sms",
        "08_inline_ptx.bfe_operands_swapped",
        "12_scan.exclusive",
        "13_softmax.write_stops_at_blockdim",
        "15_sgemm.a_column_major",
    ],
    ["03_waves.waves_in_double", "08_inline_ptx.fma_in_a_comment", "13_softmax.unbiased_variance"],
]
# graded with compute-sanitizer as well (one run: one variant per task)
SANITIZED = [
    "10_reduction.last_warp_race",
    "11_transpose.barrier_before_loads",
    "12_scan.hillis_steele_race",
    "15_sgemm.no_barrier_before_next_tile",
]
# verdicts the build decides (the rules judge what was compiled): graded on a machine without a GPU too
AT_BUILD: list[str] = ["03_waves.hardcoded_sms", "08_inline_ptx.fma_in_a_comment"]
HUGE: list[str] = []  # graded with the cases past 2^31 elements (tens of GB of GPU memory)
# graded with timing on (quick): they pass every correctness check and game only the timed calls,
# or are right but slow and must earn no performance points
TIMED: list[str] = ["11_transpose.no_padding"]

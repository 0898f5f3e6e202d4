"""Honest lab 2 solutions written differently from the reference: each must pass under every seed.

tests/test_honest_alternatives.py grades each one (grader/instructor/honest.py) with several
values of GRADER_SEED. They are edits to the reference solutions, so they follow it; each changes
what a student could legitimately choose otherwise: how the work is split, the tile, the block.
"""

from __future__ import annotations

from grader.instructor.honest import Alternative

ALTERNATIVES: dict[str, Alternative] = {
    "10_reduction.contiguous_runs": Alternative(
        "10_reduction.cu",
        [
            (
                "    const size_t tid = (size_t)blockIdx.x * blockDim.x + t;\n"
                "    const size_t stride = (size_t)gridDim.x * blockDim.x;\n",
                "",
            ),
            (
                "    float v = 0.0f;\n"
                "    if (tid < head) v += in[tid];\n"
                "#pragma unroll 4\n"
                "    for (size_t k = tid; k < vecs; k += stride) {\n"
                "        const float4 q = body[k];\n"
                "        v += (q.x + q.y) + (q.z + q.w);\n"
                "    }\n"
                "    if (tid < tail) v += in[head + 4 * vecs + tid];\n",
                "    // each block one contiguous run of float4s; block 0 also adds the unaligned head and the tail\n"
                "    const size_t per_block = (vecs + gridDim.x - 1) / gridDim.x;\n"
                "    const size_t begin = min(vecs, (size_t)blockIdx.x * per_block);\n"
                "    const size_t end = min(vecs, begin + per_block);\n"
                "    float v = 0.0f;\n"
                "    for (size_t k = begin + t; k < end; k += blockDim.x) {\n"
                "        const float4 q = body[k];\n"
                "        v += (q.x + q.w) + (q.y + q.z);\n"
                "    }\n"
                "    if (blockIdx.x == 0 && t < head) v += in[t];\n"
                "    if (blockIdx.x == 0 && t < tail) v += in[head + 4 * vecs + t];\n",
            ),
        ],
        "rung 6 splits the array into one contiguous run per block instead of a grid-stride walk, and"
        " its partition depends on the input's alignment (the determinism run must see the same one)",
    ),
    "11_transpose.sixteen_rows": Alternative(
        "11_transpose.cu",
        [("constexpr int BLOCK_ROWS = 8;", "constexpr int BLOCK_ROWS = 16;  // 2 elements per thread")],
        "the tiled rungs run 32 x 16 threads per tile, two elements each, instead of 32 x 8",
    ),
    "12_scan.sixteen_items": Alternative(
        "12_scan.cu",
        [("constexpr int ITEMS = 32;", "constexpr int ITEMS = 16;  // tiles of 2048")],
        "the single-pass scan keeps 16 elements per thread (tiles of 2048) instead of 32",
    ),
    "13_softmax.smaller_blocks": Alternative(
        "13_softmax.cu",
        [("constexpr int BLOCK_THREADS = 256;", "constexpr int BLOCK_THREADS = 128;")],
        "rung 2 reduces each row with 128 threads instead of 256",
    ),
    "14_sgemm.four_rows_per_thread": Alternative(
        "14_sgemm.cu",
        [
            (
                "inline constexpr int BM = 64, BN = 64, BK = 8, TM = 8;",
                "inline constexpr int BM = 64, BN = 64, BK = 8, TM = 4;",
            ),
            (
                "        const int ar = tile.x + a_row, ak = k0 + a_col;\n"
                "        As[a_row][a_col] = ar < M && ak < K ? A[(size_t)ar * K + ak] : 0.0f;\n"
                "        const int bk = k0 + b_row, bc = tile.y + b_col;\n"
                "        Bs[b_row][b_col] = bk < K && bc < N ? B[(size_t)bk * N + bc] : 0.0f;\n",
                "        // 1024 threads, 512 floats of each tile: half the threads load one of each\n"
                "        if (tid < BM * BK) {\n"
                "            const int ar = tile.x + a_row, ak = k0 + a_col;\n"
                "            As[a_row][a_col] = ar < M && ak < K ? A[(size_t)ar * K + ak] : 0.0f;\n"
                "            const int bk = k0 + b_row, bc = tile.y + b_col;\n"
                "            Bs[b_row][b_col] = bk < K && bc < N ? B[(size_t)bk * N + bc] : 0.0f;\n"
                "        }\n",
            ),
        ],
        "rung 4 gives each of 1024 threads 4 rows of C instead of each of 512 threads 8, and loads the tiles"
        " with half of its threads",
    ),
    "15_tensor_core.one_row_of_warps": Alternative(
        "15_tensor_core.cu",
        [("inline constexpr int WARPS_M = 2, WARPS_N = 2;", "inline constexpr int WARPS_M = 1, WARPS_N = 4;")],
        "rung 1's block is one row of four warps (16 x 64 of C) instead of 2 x 2 (32 x 32)",
    ),
    "16_attention.narrow_key_tiles": Alternative(
        "16_attention.cu",
        [("inline constexpr int BC = 64;", "inline constexpr int BC = 32;")],
        "the fused kernel stages 32 keys per tile instead of 64: twice the online-softmax rescales",
    ),
}

// Lab 1 · Task 06 — 4x4 max pool with a shared-memory halo
//
// Implement: max_pool_4x4_kernel: each block stages its 16x16 input tile plus a halo of
//            3 columns on the right and 3 rows below in shared memory, then each thread
//            takes the max of its 4x4 window from shared memory.
// Contract:  in, out are DEVICE float32 images of shape (H, W), row-major, contiguous;
//            in is read-only, out is written; out does not overlap in. H, W >= 1;
//            H <= 65535 * 16 (grid y limit). out[r][c] = max of in[r + i][c + j] over
//            0 <= i, j < 4 with r + i < H and c + j < W (stride 1, window anchored at its
//            top-left, clipped at the bottom and right borders). Inputs are finite (a NaN
//            is skipped by fmaxf, not propagated). Returns the launch error; does not
//            synchronize.
// Test:      make test-lab1 TASK=06

#include "course.h"

#include <cmath>

constexpr int TILE = 16;  // output tile per block = threads per block in x and in y
// [[maybe_unused]]: only the kernel body uses K, and the skeleton has none yet.
[[maybe_unused]] constexpr int K = 4;  // window size

// in (H, W) row-major -> out (H, W) row-major
__global__ void max_pool_4x4_kernel(const float* __restrict__ in, float* __restrict__ out,
                                    int H, int W) {
    // TODO(lab1/06) begin: fill the block's 19x19 shared tile (its 16x16 inputs plus the 3-wide halo, with cells outside the image set to a value that can never be the maximum), make the whole block wait, then let each thread take its 4x4 maximum from the tile; see §3.2, §3.6 and §5.7; about 25 lines; try 1x1, 3x5, 16x16 and 17x33.
    // TODO(lab1/06) end
}

COURSE_API cudaError_t max_pool_4x4(const float* in, float* out, int H, int W) {
    dim3 block(TILE, TILE);
    dim3 grid((W + TILE - 1) / TILE, (H + TILE - 1) / TILE);
    max_pool_4x4_kernel<<<grid, block>>>(in, out, H, W);
    return cudaGetLastError();
}

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
    __shared__ float tile[TILE + K - 1][TILE + K - 1];
    const int row0 = blockIdx.y * TILE;  // image position of tile[0][0]
    const int col0 = blockIdx.x * TILE;

    // 19 x 19 values for 16 x 16 threads: each thread loads tile[ty][tx] and, where they
    // exist, the positions 16 to its right and/or below. The fixed trip counts (2 x 2) let
    // the compiler unroll and issue those loads together instead of one after another.
#pragma unroll
    for (int di = 0; di < TILE + K - 1; di += TILE) {
#pragma unroll
        for (int dj = 0; dj < TILE + K - 1; dj += TILE) {
            int i = threadIdx.y + di, j = threadIdx.x + dj;
            if (i < TILE + K - 1 && j < TILE + K - 1) {
                int r = row0 + i, c = col0 + j;
                // -INFINITY never wins a max, so clipped windows need no special case below.
                tile[i][j] = (r < H && c < W) ? in[(size_t)r * W + c] : -INFINITY;
            }
        }
    }
    __syncthreads();

    const int r = row0 + threadIdx.y, c = col0 + threadIdx.x;
    if (r < H && c < W) {
        float m = -INFINITY;
#pragma unroll
        for (int i = 0; i < K; ++i) {
#pragma unroll
            for (int j = 0; j < K; ++j) m = fmaxf(m, tile[threadIdx.y + i][threadIdx.x + j]);
        }
        out[(size_t)r * W + c] = m;
    }
    // TODO(lab1/06) end
}

COURSE_API cudaError_t max_pool_4x4(const float* in, float* out, int H, int W) {
    dim3 block(TILE, TILE);
    dim3 grid((W + TILE - 1) / TILE, (H + TILE - 1) / TILE);
    max_pool_4x4_kernel<<<grid, block>>>(in, out, H, W);
    return cudaGetLastError();
}

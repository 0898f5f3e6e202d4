// Lab 1 · Task 04 — Swap neighbours through shared memory
//
// Implement: swap_pairs_kernel: the block loads its 512 elements into shared memory (each
//            thread loads two, coalesced), waits for the whole block, then each thread writes
//            one swapped pair — values that threads of other warps loaded.
// Contract:  in, out are DEVICE float32 arrays of n elements; in is read-only, out is
//            written; out does not overlap in. 1 <= n <= 2^30.
//            out[2k] = in[2k + 1], out[2k + 1] = in[2k]; for odd n the last element is
//            copied unchanged. Returns the launch error; does not synchronize.
// Test:      make test-lab1 TASK=04

#include "course.h"

constexpr int THREADS = 256;        // threads per block
constexpr int TILE = 2 * THREADS;   // elements per block: one pair per thread

// in (n,) -> out (n,)
__global__ void swap_pairs_kernel(const float* __restrict__ in, float* __restrict__ out, int n) {
    // TODO(lab1/04) begin: stage the block's 512 elements in a shared tile with coalesced loads, let no thread read the tile before the whole block has filled it, then write every pair swapped (for odd n the last element stays as it is); see §3.2, §3.6 and §5.5; about 20 lines; try n = 1, 2, 3, 512 and 513.
    __shared__ float tile[TILE];
    const int base = blockIdx.x * TILE;  // first element of this block
    // Two coalesced passes: in each, a warp reads 32 consecutive floats.
#pragma unroll
    for (int k = threadIdx.x; k < TILE; k += THREADS) {
        const int g = base + k;
        if (g < n) tile[k] = in[g];
    }
    // Thread t reads tile[2t] and tile[2t + 1], loaded by threads 2t and 2t + 1 (mod THREADS):
    // other warps, which may not have run yet. Every thread reaches this barrier.
    __syncthreads();
    const int t2 = 2 * threadIdx.x;
    const int g = base + t2;  // first element of this thread's pair
    if (g + 1 < n) {
        out[g] = tile[t2 + 1];
        out[g + 1] = tile[t2];
    } else if (g < n) {
        out[g] = tile[t2];  // odd n: the last element has no partner
    }
    // TODO(lab1/04) end
}

COURSE_API cudaError_t swap_pairs(const float* in, float* out, int n) {
    const int blocks = (n + TILE - 1) / TILE;
    swap_pairs_kernel<<<blocks, THREADS>>>(in, out, n);
    return cudaGetLastError();
}

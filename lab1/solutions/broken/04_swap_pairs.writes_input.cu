// BROKEN ON PURPOSE (overwrites its input): the grader's own tests check it is caught.
// Lab 1 · Task 04 — Swap neighbours through shared memory
//
// Implement: swap_pairs_kernel: stage the block's elements in shared memory, wait for the
//            whole block, then write each element's partner.
// Contract:  in, out are DEVICE float32 arrays of n elements; in is read-only, out is
//            written; out does not overlap in. 1 <= n <= 2^30.
//            out[2k] = in[2k + 1], out[2k + 1] = in[2k]; for odd n the last element is
//            copied unchanged. Returns the launch error; does not synchronize.
// Test:      make test-lab1 TASK=04

#include "course.h"

constexpr int TILE = 256;  // elements per block = threads per block

// in (n,) -> out (n,)
__global__ void swap_pairs_kernel(const float* __restrict__ in, float* __restrict__ out, int n) {
    // TODO(lab1/04) begin: load in[g] into __shared__ float tile[TILE]; __syncthreads(); out[g] = tile[partner] with partner g ^ 1, or g itself when g ^ 1 >= n.
    __shared__ float tile[TILE];
    int t = threadIdx.x;
    int g = blockIdx.x * TILE + t;
    if (g < n) tile[t] = in[g];
    // Every thread must reach the barrier, so the guards sit around it, not before it.
    __syncthreads();
    if (g < n) {
        // TILE is even, so g ^ 1 is always in this block, at t ^ 1.
        int partner = (g ^ 1) < n ? (t ^ 1) : t;
        out[g] = tile[partner];
        const_cast<float*>(in)[g] = 0.0f;
    }
    // TODO(lab1/04) end
}

COURSE_API cudaError_t swap_pairs(const float* in, float* out, int n) {
    int blocks = (n + TILE - 1) / TILE;
    swap_pairs_kernel<<<blocks, TILE>>>(in, out, n);
    return cudaGetLastError();
}

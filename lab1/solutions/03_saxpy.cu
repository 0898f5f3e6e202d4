// Lab 1 · Task 03 — SAXPY over many blocks
//
// Implement: saxpy_kernel (one thread per element, global index, bounds guard) and a
//            launch with enough 256-thread blocks to cover n.
// Contract:  x, y, out are DEVICE float32 arrays of n elements; x and y are read-only,
//            out is written; out does not overlap x or y. 1 <= n <= 2^27.
//            out[i] = alpha * x[i] + y[i]. Returns the launch error; does not synchronize.
// Test:      make test-lab1 TASK=03

#include "course.h"

// x (n,), y (n,) -> out (n,)
__global__ void saxpy_kernel(int n, float alpha, const float* __restrict__ x,
                             const float* __restrict__ y, float* __restrict__ out) {
    // TODO(lab1/03) begin: each thread of every block computes the one output it owns, and threads past the end touch nothing; see §2.5; about 2 lines; try n = 1, 255, 256 and 257.
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = alpha * x[i] + y[i];
    // TODO(lab1/03) end
}

COURSE_API cudaError_t saxpy(int n, float alpha, const float* x, const float* y, float* out) {
    // TODO(lab1/03) begin: 256-thread blocks, and just enough of them to cover any n from 1 to 2^27 without a block that has no work; see §2.5; about 3 lines; count your blocks by hand for n = 1, 256 and 257.
    constexpr int THREADS = 256;
    int blocks = (n + THREADS - 1) / THREADS;
    saxpy_kernel<<<blocks, THREADS>>>(n, alpha, x, y, out);
    // TODO(lab1/03) end
    return cudaGetLastError();
}

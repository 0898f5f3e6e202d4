// Lab 1 · Task 05 — SiLU from the host, end to end
//
// Implement: everything: a silu_kernel with a grid-stride loop, and silu(), which allocates
//            device buffers, copies x in, launches, copies y out and frees the buffers,
//            checking every runtime call.
// Contract:  x and y are HOST float32 arrays of n elements; x is read-only, y is written.
//            y[i] = x[i] / (1 + exp(-x[i])). n may be 0 (returns cudaSuccess at once) and
//            has no upper limit of its own: when the device buffers cannot be allocated the
//            function returns cudaErrorMemoryAllocation, leaks nothing and leaves y
//            untouched. Synchronous: y is ready when it returns. Returns cudaSuccess or the
//            first error met.
// Test:      make test-lab1 TASK=05

#include "course.h"

#include <algorithm>
#include <cstdint>

// TODO(lab1/05) begin: write silu_kernel(x, y, n): 256-thread blocks, a grid-stride loop with size_t indices, y[i] = x[i] / (1.0f + expf(-x[i])).
// TODO(lab1/05) end

COURSE_API cudaError_t silu(const float* x, float* y, size_t n) {
    // TODO(lab1/05) begin: return early for n == 0; cudaMalloc, cudaMemcpy in, launch, cudaGetLastError, cudaMemcpy out, all in CUDA_CHECK; cudaFree on every path.
    return cudaErrorNotYetImplemented;  //~
    // TODO(lab1/05) end
}

// BROKEN ON PURPOSE (never frees one of its buffers): the grader's own tests check that it is caught.
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
constexpr int THREADS = 256;
// A few waves of blocks keep every SM of any current GPU busy; the grid-stride loop covers
// the rest, so the grid stays far below its limits whatever n is.
constexpr size_t MAX_BLOCKS = 4096;

// x (n,) -> y (n,)
__global__ void silu_kernel(const float* __restrict__ x, float* __restrict__ y, size_t n) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float v = x[i];
        y[i] = v / (1.0f + expf(-v));
    }
}
// TODO(lab1/05) end

COURSE_API cudaError_t silu(const float* x, float* y, size_t n) {
    // TODO(lab1/05) begin: return early for n == 0; cudaMalloc, cudaMemcpy in, launch, cudaGetLastError, cudaMemcpy out, all in CUDA_CHECK; cudaFree on every path.
    if (n == 0) return cudaSuccess;
    // n * sizeof(float) must not wrap around to a small size that would then "succeed".
    if (n > SIZE_MAX / sizeof(float)) return cudaErrorMemoryAllocation;
    const size_t bytes = n * sizeof(float);

    float* d_x = nullptr;  // (n,) device copy of x
    float* d_y = nullptr;  // (n,) device result
    // CUDA_CHECK returns from this lambda, not from silu, so the frees below run on every path.
    auto run = [&]() -> cudaError_t {
        CUDA_CHECK(cudaMalloc(&d_x, bytes));
        CUDA_CHECK(cudaMalloc(&d_y, bytes));
        CUDA_CHECK(cudaMemcpy(d_x, x, bytes, cudaMemcpyHostToDevice));
        const size_t blocks = std::min((n + THREADS - 1) / THREADS, MAX_BLOCKS);
        silu_kernel<<<(unsigned int)blocks, THREADS>>>(d_x, d_y, n);
        CUDA_CHECK(cudaGetLastError());
        CUDA_CHECK(cudaMemcpy(y, d_y, bytes, cudaMemcpyDeviceToHost));
        return cudaSuccess;
    };
    cudaError_t err = run();
    // A failed call is also remembered as the runtime's "last error"; clear it, or the
    // cudaGetLastError() after the next healthy launch would report it again.
    if (err != cudaSuccess) (void)cudaGetLastError();
    // cudaFree(nullptr) does nothing, so this frees exactly what was allocated.
    CUDA_CHECK(cudaFree(d_x));
    return err;
    //~ return cudaErrorNotYetImplemented;
    // TODO(lab1/05) end
}

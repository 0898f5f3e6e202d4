// Lab 1 · Task 05 — SiLU from the host, end to end
//
// Implement: everything: a kernel that computes SiLU for any n, and silu(), which moves x to
//            the device, runs the kernel with a launch you choose, brings y back and frees
//            what it allocated, checking every runtime call.
// Contract:  x and y are HOST float32 arrays of n elements; x is read-only, y is written.
//            y[i] = x[i] / (1 + exp(-x[i])). n may be 0 (returns cudaSuccess at once) and
//            has no upper limit of its own: when the device buffers cannot be allocated (the
//            first one, or only the second) the function returns cudaErrorMemoryAllocation,
//            leaks nothing and leaves y untouched. Synchronous: y is ready when it returns.
//            Returns cudaSuccess or the first error met.
// Test:      make test-lab1 TASK=05

#include "course.h"

#include <algorithm>
#include <cstdint>

// TODO(lab1/05) begin: write the SiLU kernel: correct for every size_t n, whatever grid you decide to launch; see §5.6 and §2.5 (index types); about 8 lines; think about n = 1, n = 1000 and n above 2^31.
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
    // TODO(lab1/05) begin: the whole host side: n == 0 succeeds at once; device buffers, both copies and a launch of your choosing; every runtime call and the launch checked; every buffer freed on every exit path, a failure after the first allocation included, and y untouched when an allocation fails; see §4.2, §4.5, §4.6 (clean-up) and §5.6; about 25 lines; try n = 0, 1, 1000 and an n too large to allocate.
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
    // Both frees are made on every path (cudaFree(nullptr) does nothing, so this frees exactly
    // what was allocated). A free's own error is kept only when nothing failed before it: after
    // a failure the first error is the one to return (chapter, section 4.6).
    auto keep_first = [&err](cudaError_t e) {
        if (err == cudaSuccess) err = e;
    };
    keep_first(cudaFree(d_x));
    keep_first(cudaFree(d_y));
    // A failed call is also remembered as the runtime's "last error"; clear it, or the
    // cudaGetLastError() after the next healthy launch would report it again.
    if (err != cudaSuccess) (void)cudaGetLastError();
    return err;
    //~ return cudaErrorNotYetImplemented;
    // TODO(lab1/05) end
}

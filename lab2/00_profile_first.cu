// Lab 2 · Task 00 — profile first: four classic mistakes, found with the profilers
//
// Implement: smooth_fast, which computes exactly what smooth_slow (given) computes: `iters`
//            rounds of a 3-point moving average. smooth_slow is correct but makes four classic
//            performance mistakes; the chapter's walk-through finds them with Nsight Systems and
//            Nsight Compute before anything is fixed. You write smooth_kernel (one thread per
//            element), scratch (a device buffer allocated once, grown when a call needs more)
//            and smooth_fast's loop of launches. Profile smooth_slow first:
//            make profile-lab2 TASK=00 profiles both entry points once you have touched a region.
// Contract:  x and y are DEVICE float32 vectors of n elements; x is read-only, y is written and
//            overlaps nothing. 1 <= n < 2^31, iters >= 1. One round maps a vector v to w with
//            w[i] = average3(v[i - 1], v[i], v[i + 1]), the indices clamped to [0, n - 1] (an
//            end element stands in for its missing neighbour); y is x after iters rounds, bit for
//            bit as smooth_slow computes it. Both return the first error met. smooth_fast launches
//            on the default stream and does not synchronize (except once, when its scratch buffer
//            grows); smooth_slow synchronizes every round.
// Test:      make test-lab2 TASK=00

#include "course.h"

#include <cstddef>
#include <vector>

constexpr int THREADS = 256;  // threads per block of smooth_kernel: 8 warps

// The 3-point average, as both versions compute it: two float32 additions in this order, then
// one division. IEEE 754 rounds each of them correctly, and nvcc neither reorders them nor
// turns / 3 into * (1 / 3) (that needs --use_fast_math), so the same three inputs give the same
// bits in every kernel that calls this: the grader compares smooth_fast with tolerance 0.
__device__ __forceinline__ float average3(float left, float mid, float right) {
    return (left + mid + right) / 3.0f;
}

// ---- given: the slow version -------------------------------------------------------------------

// src (n,) -> dst (n,). Block b computes element b.
__global__ void smooth_one_thread_kernel(const float* __restrict__ src, float* __restrict__ dst, int n) {
    const int i = blockIdx.x;
    const int left = i > 0 ? i - 1 : 0;
    const int right = i < n - 1 ? i + 1 : n - 1;
    dst[i] = average3(src[left], src[i], src[right]);
}

// Correct, and written the way code grows while it is being debugged: a fresh buffer for every
// round, a wait for every round, every round's values brought to the host to look at (a printf
// of a few of them once stood between the two copies) and written back from there into y, which
// the next round reads.
COURSE_API cudaError_t smooth_slow(const float* x, float* y, int n, int iters) {
    const size_t bytes = (size_t)n * sizeof(float);
    std::vector<float> host(n);
    const float* src = x;
    for (int r = 0; r < iters; ++r) {
        float* tmp = nullptr;
        CUDA_CHECK(cudaMalloc(&tmp, bytes));
        smooth_one_thread_kernel<<<n, 1>>>(src, tmp, n);
        CUDA_CHECK(cudaGetLastError());
        CUDA_CHECK(cudaDeviceSynchronize());
        CUDA_CHECK(cudaMemcpy(host.data(), tmp, bytes, cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(y, host.data(), bytes, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaFree(tmp));
        src = y;
    }
    return cudaSuccess;
}

// ---- the task ----------------------------------------------------------------------------------

// src (n,) -> dst (n,), one thread per element. Launched with THREADS threads per block, which
// __launch_bounds__ promises ptxas.
__global__ void __launch_bounds__(THREADS)
    smooth_kernel(const float* __restrict__ src, float* __restrict__ dst, int n) {
    // TODO(lab2/00) begin: dst[i] = average3 of src at i - 1, i and i + 1 for every i < n, one element per thread in blocks of THREADS, the neighbours' indices clamped to [0, n - 1] and nothing read or written past either end (the last block is partial); see the walk-through's step on the kernel (Nsight Compute); about 6 lines; try n = 1, 2 and 257.
    // TODO(lab2/00) end
}

// TODO(lab2/00) begin: a helper, say scratch(size_t floats, float** buffer), that hands out one device buffer of at least `floats` floats living from call to call: allocated by the first call, freed and allocated again only when a call needs more than any call before (synchronize before that free: kernels still queued may read the old buffer); see the walk-through's step on allocations (Nsight Systems); about 16 lines; call it with 1000, 10 and 2^20 floats in turn and count the cudaMalloc calls.
// TODO(lab2/00) end

COURSE_API cudaError_t smooth_fast(const float* x, float* y, int n, int iters) {
    // TODO(lab2/00) begin: iters launches of smooth_kernel on the default stream, the first reading x, each next one reading what the previous wrote, the rounds alternating between y and your scratch buffer so that the last one writes y; no allocation, copy or synchronization in this function (the grader checks): the grader synchronizes; see the walk-through's steps on the timeline (Nsight Systems); about 12 lines; work out which buffer the first round writes for iters = 1, 2 and 3.
    return cudaErrorNotYetImplemented;  //~
    // TODO(lab2/00) end
}

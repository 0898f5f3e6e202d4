// Lab 1 · Task 07 — Byte histogram: global vs. shared-memory atomics
//
// Implement: histogram_global_kernel (every count is an atomicAdd on global memory),
//            histogram_shared_kernel (each block counts into its own shared-memory copy of
//            the bins, then merges it into the global bins once), and in both host
//            functions: zero the bins, then launch.
// Contract:  data is a DEVICE array of n bytes (read-only; any alignment), 1 <= n <= 2^28.
//            bins is a DEVICE array of 256 uint32 counters, written: on return
//            (after synchronization) bins[v] = number of i with data[i] == v. Its old
//            contents are ignored (both functions zero it first). Kernels run on the
//            default stream; each function returns the first error met; does not synchronize.
// Test:      make test-lab1 TASK=07

#include "course.h"

#include <algorithm>
#include <cstdint>

// [[maybe_unused]]: only code inside the TODO regions uses BINS.
[[maybe_unused]] constexpr int BINS = 256;  // one per byte value
constexpr int THREADS = 256;  // threads per block

// data (n,) bytes -> bins (BINS,) counts; bins must be zero beforehand
__global__ void histogram_global_kernel(const unsigned char* __restrict__ data, int n,
                                        unsigned int* __restrict__ bins) {
    // TODO(lab1/07) begin: count every one of the n bytes into the global bins, also when the grid you are given has fewer threads than n; see §3.7 and §5.8; about 3 lines; try n = 1 and an n far larger than the grid.
    // TODO(lab1/07) end
}

// data (n,) bytes -> bins (BINS,) counts; bins must be zero beforehand
__global__ void histogram_shared_kernel(const unsigned char* __restrict__ data, int n,
                                        unsigned int* __restrict__ bins) {
    // TODO(lab1/07) begin: the same counts, but each block first counts into its own shared-memory bins and then adds them to the global bins with at most one update per bin; every bin zeroed before counting and merged after it, whatever the block size; see §3.6, §3.7 and §5.8; about 15 lines; try n = 1, 255 and an input whose bytes are all equal.
    // TODO(lab1/07) end
}

// Blocks for n bytes: enough to cover n, but no more than 4 per SM; the grid-stride loops
// do the rest, and fewer blocks mean fewer merges into the global bins.
static cudaError_t grid_size(int n, int* blocks) {
    static int sm_count = 0;  // a fixed property of the device: query it once, not per call
    if (sm_count == 0) {
        int device = 0;
        CUDA_CHECK(cudaGetDevice(&device));
        CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
    }
    *blocks = std::min((n + THREADS - 1) / THREADS, 4 * sm_count);
    return cudaSuccess;
}

COURSE_API cudaError_t histogram_global(const unsigned char* data, int n, unsigned int* bins) {
    int blocks = 0;
    CUDA_CHECK(grid_size(n, &blocks));
    // TODO(lab1/07) begin: the bins must read zero before the kernel counts into them, without making the host wait; then launch the kernel with the grid computed above; see §2.2 (stream order) and §5.8; about 2 lines.
    // TODO(lab1/07) end
    return cudaGetLastError();
}

COURSE_API cudaError_t histogram_shared(const unsigned char* data, int n, unsigned int* bins) {
    int blocks = 0;
    CUDA_CHECK(grid_size(n, &blocks));
    // TODO(lab1/07) begin: the bins must read zero before the kernel counts into them, without making the host wait; then launch the kernel with the grid computed above; see §2.2 (stream order) and §5.8; about 2 lines.
    // TODO(lab1/07) end
    return cudaGetLastError();
}

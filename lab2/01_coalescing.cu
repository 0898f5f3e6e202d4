// Lab 2 · Task 01 — coalescing: an int64 vector add at the speed of memory
//
// Implement: add_coalesced_kernel, a grid-stride loop in which the threads of a warp touch
//            neighbouring elements at every step, and its launch in add_coalesced with a
//            fixed grid that fills the GPU once. add_strided, given, computes the same sum
//            with each thread owning one contiguous chunk: time both and compare.
// Contract:  a, b, c are DEVICE int64 arrays of n elements; a and b are read-only, c is
//            written; c does not overlap a or b. 1 <= n, n a size_t (2^27 and beyond). The
//            pointers are 8-byte aligned but need not be 16-byte aligned: the grader also
//            passes views that start one element into a buffer. c[i] = a[i] + b[i] (inputs
//            small enough never to overflow). Returns the launch error; does not synchronize.
// Test:      make test-lab2 TASK=01

#include "course.h"

#include <cstddef>
#include <cstdint>

constexpr int THREADS = 256;

// How many THREADS-thread blocks of `kernel` the whole GPU holds at once: the resident blocks
// per SM (the occupancy API) times the number of SMs. A grid-stride kernel launched with this
// many blocks (or fewer when n is small) keeps every SM busy in one wave.
static cudaError_t resident_blocks(const void* kernel, int* blocks) {
    int device = 0, sms = 0, per_sm = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, THREADS, 0));
    *blocks = sms * (per_sm > 0 ? per_sm : 1);
    return cudaSuccess;
}

// ---- given: the uncoalesced version the chapter contrasts ------------------------------------

// a (n,), b (n,) -> c (n,). Thread t owns the chunk [t * chunk, (t + 1) * chunk): correct, but at
// every step the 32 threads of a warp read addresses `chunk` elements apart, so one warp-wide
// load touches 32 different memory segments instead of two.
__global__ void add_strided_kernel(const int64_t* __restrict__ a, const int64_t* __restrict__ b,
                                   int64_t* __restrict__ c, size_t n) {
    const size_t threads = (size_t)gridDim.x * blockDim.x;
    const size_t chunk = (n + threads - 1) / threads;
    const size_t begin = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * chunk;
    const size_t end = begin + chunk < n ? begin + chunk : n;
    for (size_t i = begin; i < end; ++i) c[i] = a[i] + b[i];
}

COURSE_API cudaError_t add_strided(const int64_t* a, const int64_t* b, int64_t* c, size_t n) {
    int blocks = 0;
    CUDA_CHECK(resident_blocks((const void*)add_strided_kernel, &blocks));
    const size_t needed = (n + THREADS - 1) / THREADS;
    if (needed < (size_t)blocks) blocks = (int)needed;
    add_strided_kernel<<<blocks, THREADS>>>(a, b, c, n);
    return cudaGetLastError();
}

// ---- the task --------------------------------------------------------------------------------

// TODO(lab2/01) begin: a kernel that adds all n elements with a grid-stride loop, so that at every step the threads of a warp read and write neighbouring elements whatever the grid, with size_t indices; wider (16-byte) loads are welcome but must stay correct when a, b or c starts 8 bytes past a 16-byte boundary; see the chapter's section on coalescing; about 10 lines for a plain loop, 25 with vector loads; try n = 1, 2, 33 and 4097.
// TODO(lab2/01) end

COURSE_API cudaError_t add_coalesced(const int64_t* a, const int64_t* b, int64_t* c, size_t n) {
    // TODO(lab2/01) begin: launch your kernel on a fixed grid that fills every SM once (resident_blocks gives that count), and on fewer blocks when n is too small to give each of them work; see the chapter's section on coalescing; about 8 lines; count the blocks for n = 1 and n = 2^26.
    return cudaErrorNotYetImplemented;  //~
    // TODO(lab2/01) end
}

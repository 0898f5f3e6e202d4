// Lab 2 · Task 06 — pinned memory and asynchronous copies: stage, transfer and compute at once
//
// Implement: copy_pinned, which computes y = a * x on the GPU for HOST arrays x and y, as
//            copy_pageable (given) does, but moves the data in chunks of CHUNK floats through
//            pinned (page-locked) staging buffers that it allocates once with cudaMallocHost and
//            keeps, two of each kind (double buffering), with cudaMemcpyAsync on two streams: while
//            the GPU copies in, scales and copies back one chunk, the host copies the next chunk
//            of x into a staging buffer and the previous chunk's result out to y, both at once on
//            several CPU threads (host_copy, from course_host_copy.h). setup allocates the buffers,
//            streams and events (once); pipeline runs one call.
//            copy_pageable, given, does it the plain way (cudaMemcpy from and to the caller's
//            pageable memory, through the driver's own staging): it is the baseline.
// Contract:  x and y are HOST float32 arrays of n elements in ordinary pageable memory, as the
//            caller allocated them; x is read-only, y is written; they do not overlap.
//            1 <= n < 2^31; any other n returns cudaErrorInvalidValue. y[i] = a * x[i] in float32.
//            Synchronous: y is complete when the function returns, and nothing it queued still
//            touches x or y. x and y are left as they were found: not registered with CUDA
//            (cudaHostRegister), since the caller may free them the moment the call returns.
//            Returns the first error met.
// Test:      make test-lab2 TASK=06

#include "course.h"
#include "course_host_copy.h"
#include "course_scratch.h"

#include <algorithm>
#include <cstddef>
#include <cstring>

constexpr int THREADS = 256;
constexpr unsigned MAX_BLOCKS = 4096;        // a few waves on any current GPU; the loop does the rest
// [[maybe_unused]]: only code inside the TODO regions uses CHUNK.
[[maybe_unused]] constexpr size_t CHUNK = size_t(1) << 21;  // floats per chunk: 8 MiB, about 170 µs at 50 GB/s
constexpr int SLOTS = 2;                     // double buffering: chunk k uses slot k % 2

// v (n,) -> v (n,) in place: v[i] = a * v[i]
__global__ void scale_kernel(float* __restrict__ v, size_t n, float a) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) v[i] *= a;
}

static unsigned blocks_for(size_t n) {
    return (unsigned)std::min((n + THREADS - 1) / THREADS, (size_t)MAX_BLOCKS);
}

// ---- given: the baseline ------------------------------------------------------------------------


// Copy in, scale, copy back, one after the other. Both cudaMemcpy calls see pageable memory: the
// driver copies it through a pinned buffer of its own, and each call returns only when its part
// is done, so nothing overlaps.
COURSE_API cudaError_t copy_pageable(const float* x, float* y, int n, float a) {
    if (n < 1) return cudaErrorInvalidValue;
    const size_t bytes = (size_t)n * sizeof(float);
    float* d = nullptr;
    CUDA_CHECK(scratch((size_t)n, &d));  // course_scratch.h: no timed call pays for cudaMalloc
    CUDA_CHECK(cudaMemcpy(d, x, bytes, cudaMemcpyHostToDevice));
    scale_kernel<<<blocks_for((size_t)n), THREADS>>>(d, (size_t)n, a);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaMemcpy(y, d, bytes, cudaMemcpyDeviceToHost));  // the default stream: after the kernel
    return cudaSuccess;
}

// ---- the task ----------------------------------------------------------------------------------

// What copy_pinned keeps from call to call (never freed: the process's end frees it). Slot s
// carries every chunk k with k % SLOTS == s.
struct Pipeline {
    float* in_stage[SLOTS] = {};    // pinned: a chunk of x on its way to the device
    float* out_stage[SLOTS] = {};   // pinned: a chunk of y on its way back
    float* dev[SLOTS] = {};         // device: the chunk, scaled in place
    cudaStream_t stream[SLOTS] = {};
    cudaEvent_t done[SLOTS] = {};   // recorded after the slot's last copy back
};

// Creates what p lacks: a failed call leaves the rest to the next one.
static cudaError_t setup(Pipeline* p) {
    // TODO(lab2/06) begin: for each slot, whatever is still missing (null): two pinned staging buffers of CHUNK floats (cudaMallocHost), one device buffer of CHUNK floats, a stream of its own and an event (no timing needed); allocated on the first call only, kept afterwards; see the chapter's section "Pinned memory and asynchronous copies"; about 12 lines; call it twice and check that nothing is allocated the second time.
    return cudaErrorNotYetImplemented;  //~
    // TODO(lab2/06) end
}

// x (n,) host -> y (n,) host, chunk by chunk through p's slots.
static cudaError_t pipeline(const Pipeline& p, const float* x, float* y, size_t n, float a) {
    // TODO(lab2/06) begin: chunk k (CHUNK floats, fewer for the last) goes through slot s = k % 2: an async copy of in_stage[s] to dev[s], the kernel, an async copy back to out_stage[s] and the slot's event, all on stream[s]; the first chunk is staged before the loop; after queueing chunk k, the host waits for the other slot's event (chunk k - 1 done: its input read, its output written), then, in one host_copy call, stages chunk k + 1 into it and copies chunk k - 1's result to y; after the loop, wait for the last chunk and copy it out; see the chapter's section "Pinned memory and asynchronous copies" (double buffering); about 30 lines; try n = 1, 2^21 + 1 and 2^22 + 3.
    return cudaErrorNotYetImplemented;  //~
    // TODO(lab2/06) end
}

COURSE_API cudaError_t copy_pinned(const float* x, float* y, int n, float a) {
    if (n < 1) return cudaErrorInvalidValue;
    static Pipeline p;
    CUDA_CHECK(setup(&p));
    const cudaError_t err = pipeline(p, x, y, (size_t)n, a);
    // On an error, chunks may still be queued on the staging buffers that the next call refills
    // first: let them finish. (They never touch x or y: only the host copies those.)
    if (err != cudaSuccess)
        for (int s = 0; s < SLOTS; ++s) (void)cudaStreamSynchronize(p.stream[s]);
    return err;
}

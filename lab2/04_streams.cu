// Lab 2 · Task 04 — Streams, pinned memory and a CUDA graph: overlapping copies with compute
//
// Implement: the pinned staging buffer and the device buffer (reserve), the streams and events the
//            pipeline keeps (pipeline), the chunked upload -> kernel -> download sequence spread
//            over those streams (enqueue_chunks), and the two entry points built on them:
//            pipeline_streams, which enqueues every chunk and waits, and pipeline_graph, which
//            records the same work once by stream capture into a CUDA graph and replays it.
//            pipeline_serial, given, does the same work one chunk after another on the default
//            stream: it is the baseline both are timed against. The kernel, scramble_kernel, and
//            the CPU copies between the caller's buffers and the staging buffer are given too.
// Contract:  x and y are HOST float32 arrays of n elements in ordinary (pageable) memory; x is
//            read-only, y is written and does not overlap x. Every x[i] is an integer in
//            [0, MODULUS) held in a float. y[i] = x[i] after ROUNDS steps of
//            v -> (2 v + INCREMENT) mod MODULUS, every step exact in float32. 0 <= n < 2^31;
//            n = 0 returns cudaSuccess at once. Synchronous: y is complete when the function
//            returns. Returns cudaSuccess or the first error met. The buffers, streams and graph
//            are kept from call to call (static): not thread-safe.
// Test:      make test-lab2 TASK=04

#include "course.h"
#include "course_host_copy.h"

#include <algorithm>
#include <cstddef>
#include <cstring>

constexpr size_t CHUNK = size_t(1) << 20;  // floats per chunk (4 MiB): the pipeline's unit of work
constexpr int STREAMS = 4;                 // chunk c runs on stream c % STREAMS
constexpr int THREADS = 256;               // threads per block of scramble_kernel

// The kernel's arithmetic: every value stays an integer below 3 * MODULUS < 2^24, where float32
// holds every integer exactly, so the result is the same bit for bit on any GPU.
constexpr float MODULUS = 4194301.0f;    // a prime below 2^22
constexpr float INCREMENT = 2718281.0f;  // any integer in [0, MODULUS)
// Steps per element, 5 instructions each (FFMA, then a compare and a predicated FADD twice). They
// stand for real per-element work and are sized so that on an H100 a chunk's kernel takes about as
// long as its upload over PCIe 5 (see the chapter): PCIe moves bytes some 50 times slower than HBM,
// so an element needs a few thousand instructions to keep pace with its 4 bytes.
constexpr int ROUNDS = 512;

// ---------------------------------------------------------------------------------------------
// The kernel (given): one thread per element, ROUNDS dependent steps in registers.
// ---------------------------------------------------------------------------------------------

__device__ __forceinline__ float scramble_step(float v) {
    v = 2.0f * v + INCREMENT;                // < 3 * MODULUS: exact
    v = v >= MODULUS ? v - MODULUS : v;      // back below 2 * MODULUS
    return v >= MODULUS ? v - MODULUS : v;   // and below MODULUS
}

// v (count,) -> v (count,), in place
__global__ void scramble_kernel(float* __restrict__ v, size_t count) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    float x = v[i];
#pragma unroll 8
    for (int r = 0; r < ROUNDS; ++r) x = scramble_step(x);
    v[i] = x;
}

static unsigned blocks_for(size_t count) { return (unsigned)((count + THREADS - 1) / THREADS); }

// The CPU side of the staging (given): the grader's x and y are pageable, and only pinned memory
// can take part in an asynchronous copy, so every call copies x into a pinned buffer first and the
// result out of it last, with course_host_copy.h's host_copy, which splits a copy over up to 8 CPU
// threads: on one thread this copy alone would outlast every GPU stage together (see the chapter).

// ---------------------------------------------------------------------------------------------
// What every call shares: the buffers, and the streams and events of the pipeline.
// ---------------------------------------------------------------------------------------------

struct Buffers {
    float* host = nullptr;    // (capacity,) PINNED staging buffer: x goes in, y comes out, in place
    float* dev = nullptr;     // (capacity,) device buffer the kernel works on, in place
    size_t capacity = 0;      // floats both hold
    unsigned generation = 0;  // bumped whenever the pointers change: a graph built on the old ones is stale
};
static Buffers buf;

// Makes both buffers hold at least n floats.
static cudaError_t reserve(size_t n) {
    // TODO(lab2/04) begin: both buffers (buf.host pinned with cudaMallocHost, buf.dev with cudaMalloc) hold at least n floats; they are allocated once and kept, and replaced by larger ones (the old ones freed after the device is synchronized, generation bumped) only when n grows past the capacity, because pinning memory is slow; see the chapter's section on pinned memory; about 14 lines; try n = 1000, then 2^20 + 3, then 1000 again.
    return cudaErrorNotYetImplemented;  //~
    // TODO(lab2/04) end
}

struct Pipeline {
    cudaStream_t streams[STREAMS];  // chunk c runs on streams[c % STREAMS]
    cudaEvent_t fork;               // recorded on streams[0]: the others wait for it (graph capture)
    cudaEvent_t join[STREAMS];      // join[s] recorded on streams[s]: streams[0] waits for it
};

// The streams and events, created on the first call and kept for the life of the process.
// ([[maybe_unused]] until your streams_body and graph_body call it, as enqueue_chunks below.)
[[maybe_unused]] static cudaError_t pipeline(Pipeline** out) {
    // TODO(lab2/04) begin: on the first call only, create STREAMS streams that do not synchronize with the legacy default stream, the fork event and the join events (no timing needed), in a Pipeline that outlives the call; every later call hands back the same one; see the chapter's sections on streams and on stream capture; about 12 lines.
    return cudaErrorNotYetImplemented;  //~
    // TODO(lab2/04) end
}

// ---------------------------------------------------------------------------------------------
// The three ways through the GPU. Each takes buf.host[0..n) (x, staged), leaves the result there
// and returns only when the last download has landed.
// ---------------------------------------------------------------------------------------------

// Given: every chunk's upload, kernel and download on the legacy default stream, one chunk after
// another. cudaMemcpy returns only when its copy is done, so nothing ever overlaps.
static cudaError_t serial_body(size_t n) {
    for (size_t offset = 0; offset < n; offset += CHUNK) {
        const size_t count = std::min(CHUNK, n - offset);
        float* h = buf.host + offset;  // (count,) pinned
        float* d = buf.dev + offset;   // (count,) device
        CUDA_CHECK(cudaMemcpy(d, h, count * sizeof(float), cudaMemcpyHostToDevice));
        scramble_kernel<<<blocks_for(count), THREADS>>>(d, count);
        CUDA_CHECK(cudaGetLastError());
        CUDA_CHECK(cudaMemcpy(h, d, count * sizeof(float), cudaMemcpyDeviceToHost));
    }
    return cudaSuccess;
}

// Queues, for every chunk, its upload, its kernel and its download on its stream; waits for nothing.
[[maybe_unused]] static cudaError_t enqueue_chunks(size_t n, const cudaStream_t* streams) {
    // TODO(lab2/04) begin: for every chunk of CHUNK floats (the last one may be shorter), the upload of buf.host's chunk into buf.dev's, the kernel on it and the download back, asynchronous and in that order on stream chunk % STREAMS, so that one chunk's kernel runs while the next chunk is uploaded and the previous one downloaded; nothing waits; see the chapter's section on the three engines (the overlap timeline); about 12 lines; try n = 1, 2^20 (one whole chunk) and 2^20 + 3 (a last chunk of 3).
    return cudaErrorNotYetImplemented;  //~
    // TODO(lab2/04) end
}

static cudaError_t streams_body(size_t n) {
    // TODO(lab2/04) begin: the chunks enqueued on the pipeline's streams, then wait until every stream has finished (the caller copies buf.host into y as soon as this returns); see the chapter's section on streams; about 6 lines.
    return cudaErrorNotYetImplemented;  //~
    // TODO(lab2/04) end
}

static cudaError_t graph_body(size_t n) {
    // TODO(lab2/04) begin: the same work as streams_body, recorded by stream capture on streams[0] (the other streams forked off it and joined back with the events) into a graph that is instantiated once and replayed with cudaGraphLaunch; captured again (and updated in place with cudaGraphExecUpdate, or instantiated anew when that fails) only when n or the buffers' generation changed since it was built, because a graph keeps every pointer and size it recorded; a failed capture must still be ended; wait before returning; see the chapter's sections on stream capture and on what a graph remembers; about 45 lines; try n = 5000, then 2^20 + 3, then 5000 again, with a larger n for another entry point in between.
    return cudaErrorNotYetImplemented;  //~
    // TODO(lab2/04) end
}

// ---------------------------------------------------------------------------------------------
// The entry points (given): x into the pinned buffer, through the GPU, out into y.
// ---------------------------------------------------------------------------------------------

using Body = cudaError_t (*)(size_t n);

static cudaError_t staged(const float* x, float* y, int n, Body body) {
    if (n < 0) return cudaErrorInvalidValue;
    if (n == 0) return cudaSuccess;
    CUDA_CHECK(reserve((size_t)n));
    host_copy({{buf.host, x, (size_t)n * sizeof(float)}});  // pageable -> pinned
    CUDA_CHECK(body((size_t)n));        // pinned -> device -> scramble -> pinned, finished on return
    host_copy({{y, buf.host, (size_t)n * sizeof(float)}});  // pinned -> pageable
    return cudaSuccess;
}

COURSE_API cudaError_t pipeline_serial(const float* x, float* y, int n) { return staged(x, y, n, serial_body); }

COURSE_API cudaError_t pipeline_streams(const float* x, float* y, int n) { return staged(x, y, n, streams_body); }

COURSE_API cudaError_t pipeline_graph(const float* x, float* y, int n) { return staged(x, y, n, graph_body); }

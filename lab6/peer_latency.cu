// Lab 6 · given code for lab6/bench_peer.py — the round trip of a flag between two GPUs' memories
//
// What it measures: one thread on GPU a stores r into a flag in GPU b's memory and spins until
// GPU b's thread has stored r back into a flag in a's memory; b's thread waits for r, then answers.
// `rounds` such exchanges, timed by events on a's stream, give the time of one round trip over the
// link: the cost a barrier of tasks 02 and 03 pays per step. Nothing else runs on either GPU.
// Contract: peer_round_trip(a, b, rounds, &us) with a != b two devices that can access each other;
//           us = microseconds per round trip (the median call is the bench's business). Enables
//           peer access both ways (an access already enabled is no error), leaves the caller's
//           device current, returns the first error. A pair without peer access:
//           cudaErrorPeerAccessUnsupported before anything is launched.
// Built and called by: python lab6/bench_peer.py (make bench-lab6)

#include <cstdint>

#include "course.h"

__device__ __forceinline__ void store_relaxed_sys(uint32_t* p, uint32_t v) {
    asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t load_relaxed_sys(const uint32_t* p) {
    uint32_t v;
    asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// one thread: `serve` answers each round; the other side starts it. No data travels but the
// flags, so relaxed accesses at system scope (seen across GPUs, never cached in L1) are enough.
__global__ void ping_pong(uint32_t* mine, uint32_t* theirs, int rounds, bool serve) {
    for (uint32_t r = 1; r <= static_cast<uint32_t>(rounds); ++r) {
        if (!serve) store_relaxed_sys(theirs, r);
        while (load_relaxed_sys(mine) != r) {
        }
        if (serve) store_relaxed_sys(theirs, r);
    }
}

static cudaError_t enable_peer(int from, int to) {
    int can = 0;
    CUDA_CHECK(cudaDeviceCanAccessPeer(&can, from, to));
    if (!can) return cudaErrorPeerAccessUnsupported;
    CUDA_CHECK(cudaSetDevice(from));
    const cudaError_t err = cudaDeviceEnablePeerAccess(to, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError();  // enabled before (by torch, or an earlier call): no error
        return cudaSuccess;
    }
    return err;
}

static cudaError_t round_trip(int a, int b, int rounds, float* us) {
    CUDA_CHECK(enable_peer(a, b));
    CUDA_CHECK(enable_peer(b, a));
    uint32_t *flag_a = nullptr, *flag_b = nullptr;
    cudaStream_t sa = nullptr, sb = nullptr;
    cudaEvent_t start = nullptr, stop = nullptr;
    cudaError_t err = cudaSuccess;
    float ms = 0.0f;
    // each flag in its GPU's memory: a spins on flag_a locally and stores into flag_b over the link
    if ((err = cudaSetDevice(b)) != cudaSuccess || (err = cudaMalloc(&flag_b, 256)) != cudaSuccess ||
        (err = cudaMemset(flag_b, 0, 256)) != cudaSuccess ||
        (err = cudaStreamCreateWithFlags(&sb, cudaStreamNonBlocking)) != cudaSuccess)
        goto done;
    if ((err = cudaSetDevice(a)) != cudaSuccess || (err = cudaMalloc(&flag_a, 256)) != cudaSuccess ||
        (err = cudaMemset(flag_a, 0, 256)) != cudaSuccess ||
        (err = cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking)) != cudaSuccess ||
        (err = cudaEventCreate(&start)) != cudaSuccess || (err = cudaEventCreate(&stop)) != cudaSuccess)
        goto done;
    if ((err = cudaDeviceSynchronize()) != cudaSuccess) goto done;  // the memset done before b's thread reads
    // b's server first: it waits; a's side starts each round once its own launch has begun
    if ((err = cudaSetDevice(b)) != cudaSuccess) goto done;
    ping_pong<<<1, 1, 0, sb>>>(flag_b, flag_a, rounds, true);
    if ((err = cudaGetLastError()) != cudaSuccess) goto done;
    if ((err = cudaSetDevice(a)) != cudaSuccess) goto done;
    if ((err = cudaEventRecord(start, sa)) != cudaSuccess) goto done;
    ping_pong<<<1, 1, 0, sa>>>(flag_a, flag_b, rounds, false);
    if ((err = cudaGetLastError()) != cudaSuccess) goto done;
    if ((err = cudaEventRecord(stop, sa)) != cudaSuccess) goto done;
    if ((err = cudaEventSynchronize(stop)) != cudaSuccess) goto done;
    if ((err = cudaEventElapsedTime(&ms, start, stop)) != cudaSuccess) goto done;
    if ((err = cudaSetDevice(b)) != cudaSuccess || (err = cudaStreamSynchronize(sb)) != cudaSuccess) goto done;
    *us = 1000.0f * ms / static_cast<float>(rounds);
done:
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
    if (sa) cudaStreamDestroy(sa);
    if (sb) cudaStreamDestroy(sb);
    if (flag_a) cudaFree(flag_a);
    if (flag_b) cudaFree(flag_b);
    return err;
}

COURSE_API cudaError_t peer_round_trip(int a, int b, int rounds, float* us) {
    int count = 0;
    CUDA_CHECK(cudaGetDeviceCount(&count));
    if (a == b || a < 0 || b < 0 || a >= count || b >= count || rounds < 1) return cudaErrorInvalidValue;
    int caller = 0;
    CUDA_CHECK(cudaGetDevice(&caller));
    const cudaError_t err = round_trip(a, b, rounds, us);
    CUDA_CHECK(cudaSetDevice(caller));
    if (err != cudaSuccess) (void)cudaGetLastError();
    return err;
}

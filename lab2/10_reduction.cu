// Lab 2 · Task 10 — The reduction ladder: six ways to sum n floats
//
// Implement: the kernels of rungs 2 to 6 of the chapter's reduction ladder, each a block-wide
//            sum that writes one partial sum per block: reduce_sequential_kernel (sequential
//            addressing), reduce_first_add_kernel (two elements per thread, added while
//            loading), reduce_last_warp_kernel (the last 32 partial sums without
//            __syncthreads), reduce_shuffle_kernel (warp shuffles instead of shared memory)
//            and reduce_vec4_kernel (a fixed grid that walks the array with float4 loads).
//            Rung 1 (reduce_interleaved_kernel) is given complete: it is where you start.
//            The host code, the same for every rung, is given too: it launches a rung's kernel
//            again and again on the partial sums until one block is left, which writes out[0].
// Contract:  in is a DEVICE float32 array of n elements (read-only; 4-byte aligned, not
//            necessarily 16-byte aligned), out is a DEVICE float32 array of at least one
//            element: on return (after synchronization) out[0] is the sum of in[0..n), added in
//            float32. 1 <= n < 2^32. Kernels run on the default stream; each entry point returns
//            the first error met and does not synchronize (except once, when its scratch buffer
//            grows).
// Test:      make test-lab2 TASK=10

#include "course.h"
#include "course_scratch.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>

constexpr int THREADS = 256;  // threads per block, every rung: a power of two, at least 64
constexpr int WARP = 32;

// ---------------------------------------------------------------------------------------------
// The kernels. Each reads `count` floats of `in` and writes out[blockIdx.x], the sum of the
// elements its block covers (0 for a block past the end: there is none, the grids are exact).
// ---------------------------------------------------------------------------------------------

// Rung 1 · interleaved addressing. One element per thread; at step s the threads whose index is
// a multiple of 2s add their neighbour s away. Correct, but threads that work and threads that
// idle sit in the same warp (divergence), and the % is slow.
__global__ void reduce_interleaved_kernel(const float* __restrict__ in, float* __restrict__ out, size_t count) {
    __shared__ float partial[THREADS];
    const unsigned t = threadIdx.x;
    const size_t i = (size_t)blockIdx.x * blockDim.x + t;
    partial[t] = i < count ? in[i] : 0.0f;
    __syncthreads();
    for (unsigned s = 1; s < blockDim.x; s *= 2) {
        if (t % (2 * s) == 0) partial[t] += partial[t + s];
        __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = partial[0];
}

// Rung 2 · sequential addressing. One element per thread, as rung 1.
__global__ void reduce_sequential_kernel(const float* __restrict__ in, float* __restrict__ out, size_t count) {
    // TODO(lab2/10) begin: the block's sum into out[blockIdx.x], with the active threads of every step contiguous (threads 0 .. s-1 add the element s away, s halving from blockDim.x / 2), so whole warps idle instead of half of each; see the chapter's reduction ladder, rung 2; about 10 lines; try n = 1, 33 and 257 (a block that is mostly past the end).
    // TODO(lab2/10) end
}

// Rung 3 · first add during load. Each block covers 2 * blockDim.x elements.
__global__ void reduce_first_add_kernel(const float* __restrict__ in, float* __restrict__ out, size_t count) {
    // TODO(lab2/10) begin: as rung 2, but every thread loads two elements blockDim.x apart and adds them before the tree, so no thread idles at the first step and half as many blocks are needed; either element may be past the end; see the chapter's reduction ladder, rung 3; about 12 lines; try n = 1, 257, 511 and 513.
    // TODO(lab2/10) end
}

// Rung 4 · unrolled last warp. Each block covers 2 * blockDim.x elements, as rung 3.
__global__ void reduce_last_warp_kernel(const float* __restrict__ in, float* __restrict__ out, size_t count) {
    // TODO(lab2/10) begin: as rung 3 while more than 64 partial sums are left; the last 64 are summed by the first warp alone, unrolled, with no __syncthreads: its lanes do not run in lockstep (independent thread scheduling, Volta and later), so every read of a neighbour's value must be separated from that neighbour's write by __syncwarp() (volatile alone is not enough); see the chapter's reduction ladder, rung 4; about 20 lines; try n = 1, 65 and 513, and run the sanitizer (racecheck).
    // TODO(lab2/10) end
}

// Rung 5 · warp shuffles. Each block covers 2 * blockDim.x elements, as rung 3.
__global__ void reduce_shuffle_kernel(const float* __restrict__ in, float* __restrict__ out, size_t count) {
    // TODO(lab2/10) begin: the same sums, but inside a warp the values move between registers with __shfl_down_sync (full mask) instead of through shared memory: each warp reduces its 32 values, lane 0 of each warp leaves one partial sum in shared memory, one barrier, then the first warp reduces those (as many as the block has warps, at most 32); see the chapter's reduction ladder, rung 5; about 20 lines; try n = 1, 33 and 513.
    // TODO(lab2/10) end
}

// Rung 6 · grid-stride with float4 loads. The grid is fixed (a few blocks per SM, whatever the
// size); the blocks together walk the whole array.
__global__ void reduce_vec4_kernel(const float* __restrict__ in, float* __restrict__ out, size_t count) {
    // TODO(lab2/10) begin: each thread sums, in a register, every (gridDim.x * blockDim.x)-th float4 of the array, then the block reduces those sums as in rung 5; float4 loads need a 16-byte-aligned address, so the first (up to 3) elements before the first aligned one and the last (up to 3) after the last whole float4 are added one by one; see the chapter's reduction ladder, rung 6; about 30 lines; try n = 1, 3, 5, 4097 and a view that starts one float into an array.
    // TODO(lab2/10) end
}

// ---------------------------------------------------------------------------------------------
// The host side, shared by every rung.
// ---------------------------------------------------------------------------------------------

// The partial sums between passes live in one device buffer that all rungs share: the scratch
// buffer of course_scratch.h, kept from call to call and grown when a larger n needs more, so
// the timed calls (after warm-up) pay for no cudaMalloc.

using Kernel = void (*)(const float*, float*, size_t);
using Blocks = size_t (*)(size_t count);  // how many blocks a rung launches for `count` floats

// Sums in[0..n) into out[0]: pass after pass, `kernel` turns `count` values into one partial sum
// per block, until a pass runs as a single block, which writes out[0]. Two passes of partial sums
// alternate between two halves of the scratch buffer (the first pass's size, then the second's;
// later passes are smaller still). Two-pass rather than atomics: no zeroing of out before the
// launch, every rung's whole sum is that rung's own kernel, and the result does not change from
// run to run (a float atomicAdd adds in whatever order the blocks finish).
static cudaError_t reduce_in_passes(Kernel kernel, Blocks blocks_for, const float* in, float* out, size_t n) {
    const size_t first = blocks_for(n);
    const size_t second = first > 1 ? blocks_for(first) : 0;
    float* ping = nullptr;
    if (first > 1) CUDA_CHECK(scratch(first + second, &ping));
    float* pong = ping + first;
    const float* src = in;
    for (size_t count = n;;) {
        const size_t blocks = blocks_for(count);
        float* dst = blocks == 1 ? out : ping;
        kernel<<<(unsigned)blocks, THREADS>>>(src, dst, count);
        CUDA_CHECK(cudaGetLastError());
        if (blocks == 1) return cudaSuccess;
        src = dst;
        count = blocks;
        std::swap(ping, pong);
    }
}

static size_t one_per_thread(size_t count) { return (count + THREADS - 1) / THREADS; }
static size_t two_per_thread(size_t count) { return (count + 2 * THREADS - 1) / (2 * THREADS); }

// Rung 6's grid: at least 8 floats per thread (so that the second pass, over at most 8 blocks per
// SM, runs as one block), and no more blocks than fit on the GPU at once (8 of 256 threads per SM
// on every card since Volta): beyond that, more blocks only queue behind the first wave.
static size_t grid_stride_blocks(size_t count) {
    static int sm_count = 0;  // a fixed property of the device: query it once, not per call
    if (sm_count == 0) {
        int device = 0;
        if (cudaGetDevice(&device) != cudaSuccess ||
            cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
            sm_count = 1;  // a failing runtime is reported by the launch that follows
    }
    return std::min((count + 8 * THREADS - 1) / (8 * THREADS), (size_t)8 * sm_count);
}

COURSE_API cudaError_t reduce_1(const float* in, float* out, size_t n) {
    return reduce_in_passes(reduce_interleaved_kernel, one_per_thread, in, out, n);
}

COURSE_API cudaError_t reduce_2(const float* in, float* out, size_t n) {
    return reduce_in_passes(reduce_sequential_kernel, one_per_thread, in, out, n);
}

COURSE_API cudaError_t reduce_3(const float* in, float* out, size_t n) {
    return reduce_in_passes(reduce_first_add_kernel, two_per_thread, in, out, n);
}

COURSE_API cudaError_t reduce_4(const float* in, float* out, size_t n) {
    return reduce_in_passes(reduce_last_warp_kernel, two_per_thread, in, out, n);
}

COURSE_API cudaError_t reduce_5(const float* in, float* out, size_t n) {
    return reduce_in_passes(reduce_shuffle_kernel, two_per_thread, in, out, n);
}

COURSE_API cudaError_t reduce_6(const float* in, float* out, size_t n) {
    return reduce_in_passes(reduce_vec4_kernel, grid_stride_blocks, in, out, n);
}

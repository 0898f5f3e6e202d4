// Lab 2 · Task 15 — Tensor cores: FP16 GEMM with FP32 accumulation, WMMA then mma.sync
//
// Implement: the three rungs of the chapter's tensor-core ladder, each computing the whole product
//            C = A @ B on the tensor cores. Rungs 1 and 2 use the WMMA API of <mma.h>:
//            hgemm_wmma_naive_kernel (one warp per 16 x 16 tile of C, its fragments loaded
//            straight from global memory) and hgemm_smem_kernel (a 128 x 128 tile of C per block
//            of 8 warps, each warp 4 x 2 accumulator fragments, the tiles of A and B staged
//            through padded shared memory). Rung 3, hgemm_mma_kernel, drops to PTX (sm_80 and
//            later): mma.sync m16n8k16 on fragments loaded with ldmatrix from XOR-swizzled
//            shared memory, filled by a 4-stage cp.async pipeline. The PTX wrappers, the swizzle
//            and the host code, which launches each rung, are given.
// Contract:  A (M, K) and B (K, N) are DEVICE float16 (half) matrices, C (M, N) a DEVICE float32
//            matrix, all row-major and contiguous, each starting on a 32-byte boundary (cudaMalloc
//            and torch give 256). A and B are read-only; C is written and overlaps neither.
//            M, N and K are multiples of 16 (the WMMA tile), at least 16, and each matrix has
//            fewer than 2^31 elements (offsets are formed in size_t). On return (after
//            synchronization) C[m][n] = sum over k of A[m][k] * B[k][n]: the products of halves
//            added in float32 (the tensor cores' FP32 accumulation, in any order). C is float32,
//            not half, because the accumulators are float32: rounding them to half would add an
//            error of up to 2^-11 of every result, ten to a hundred times the accumulation error, and
//            would hide a kernel that accumulates in half. Each entry point launches on the
//            default stream, returns the launch error and does not synchronize.
// Test:      make test-lab2 TASK=15

#include "course.h"
#include "course_mma.h"

#include <cuda_fp16.h>
#include <mma.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

using namespace nvcuda;

// ---------------------------------------------------------------------------------------------
// The shapes of the rungs. They are given because the host code launches with them.
// ---------------------------------------------------------------------------------------------

constexpr int WARP = 32;
constexpr int WM = 16, WN = 16, WK = 16;  // the WMMA shape both rungs use: m16n16k16, half in, float out

namespace r1 {  // rung 1: 4 warps per block, 2 x 2 of them, each one 16 x 16 tile of C
inline constexpr int WARPS_M = 2, WARPS_N = 2;
inline constexpr int BM = WARPS_M * WM, BN = WARPS_N * WN;  // 32 x 32 of C per block
inline constexpr int THREADS = WARPS_M * WARPS_N * WARP;
}  // namespace r1

namespace r2 {  // rung 2: a 128 x 128 tile of C per block of 8 warps (2 x 4), each 64 x 32 of it
inline constexpr int BM = 128, BN = 128, BK = 32;
inline constexpr int WARPS_M = 2, WARPS_N = 4;
inline constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N;  // one warp's tile of C: 64 x 32
inline constexpr int FM = WTM / WM, FN = WTN / WN;            // its 4 x 2 accumulator fragments
inline constexpr int THREADS = WARPS_M * WARPS_N * WARP;
// Shared rows are padded by 8 halves (16 bytes): load_matrix_sync wants a leading dimension that
// is a multiple of 8 halves, and the padding moves consecutive rows onto different banks.
inline constexpr int PAD = 8;
inline constexpr int LDA = BK + PAD;  // 40 halves = 80 bytes per row of A's tile
inline constexpr int LDB = BN + PAD;  // 136 halves = 272 bytes per row of B's tile
inline constexpr int CHUNK = 8;       // halves per 16-byte load (one uint4)
}  // namespace r2
static_assert(r2::BK % WK == 0 && r2::WTM % WM == 0 && r2::WTN % WN == 0, "whole WMMA tiles per step and per warp");

namespace r3 {  // rung 3: rung 2's tiles, multiplied with mma.sync m16n8k16 and fed by a cp.async pipeline
inline constexpr int BM = 128, BN = 128, BK = 32;
inline constexpr int STAGES = 4;  // tiles of K in shared memory at once: 1 being multiplied, up to 3 in flight
// 4 warps, not rung 2's 8: a 64 x 64 warp tile loads 4 + 4 fragments per 16 of k for 32 mma.syncs,
// where 64 x 32 loads 4 + 2 for 16 (measured on an H100 at 4096^3: 0.47x cuBLAS with 8 warps, 0.52x with 4)
inline constexpr int WARPS_M = 2, WARPS_N = 2;
inline constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N;  // one warp's tile of C: 64 x 64
inline constexpr int MMA_M = 16, MMA_N = 8, MMA_K = 16;       // the shape of one mma.sync
inline constexpr int MI = WTM / MMA_M, NI = WTN / MMA_N;      // 4 x 8 mma tiles of C per warp
inline constexpr int KSTEPS = BK / MMA_K;                     // 2 slices of 16 along k per tile
inline constexpr int THREADS = WARPS_M * WARPS_N * WARP;
inline constexpr int CHUNK = 8;                               // halves per 16-byte copy (and ldmatrix row)
inline constexpr int A_CPR = BK / CHUNK, B_CPR = BN / CHUNK;  // chunks per tile row: 4 of A, 16 of B
inline constexpr int A_TILE = BM * BK, B_TILE = BK * BN;      // halves per stage: 8 KiB each, unpadded
inline constexpr int A_ROWS = THREADS / A_CPR, B_ROWS = THREADS / B_CPR;  // rows one pass of the block copies: 32 of A, 8 of B
inline constexpr int PASSES = BM / A_ROWS;                    // 4 chunks of each tile per thread
inline constexpr int SMEM_BYTES = STAGES * (A_TILE + B_TILE) * (int)sizeof(half);  // 64 KiB: past the 48 KiB default
}  // namespace r3
static_assert(r3::KSTEPS * r3::MMA_K == r3::BK && r3::NI % 2 == 0, "whole k slices; B's ldmatrix.x4 loads n8 tiles in pairs");
static_assert(r3::BM == r3::PASSES * r3::A_ROWS && r3::BK == r3::PASSES * r3::B_ROWS, "as many chunks of A as of B per thread");

// ---------------------------------------------------------------------------------------------
// Given to every kernel.
// ---------------------------------------------------------------------------------------------

// The first row (.x) and column (.y) of the BM x BN tile of C this block computes. The grid is
// one-dimensional, the tiles numbered row by row (gridDim.y stops at 65535).
template <int BM, int BN>
__device__ __forceinline__ int2 tile_origin(int N) {
    const int tiles_n = (N + BN - 1) / BN;
    return make_int2((int)(blockIdx.x / tiles_n) * BM, (int)(blockIdx.x % tiles_n) * BN);
}

// ---------------------------------------------------------------------------------------------
// Given to rung 3: the swizzle and the PTX it needs, from course_mma.h (grader/include: read it),
// and the mma below. The instructions exist from sm_80 on (ldmatrix from sm_75); for an older
// target these compile to nothing and hgemm_3 refuses to launch (cudaErrorNotSupported).
// ---------------------------------------------------------------------------------------------

// d = a · b + d for one 16 x 8 tile of C, k = 16: A 16 x 16 (row-major fragment, four registers
// of two halves), B 16 x 8 (the .col fragment, two registers), d four floats. With g = lane / 4
// and t = lane % 4: a[0] = A[g][2t, 2t+1], a[1] = A[g+8][2t, 2t+1], a[2] = A[g][2t+8, 2t+9],
// a[3] = A[g+8][2t+8, 2t+9]; b[0] = B[2t, 2t+1][g], b[1] = B[2t+8, 2t+9][g];
// d[0], d[1] = D[g][2t, 2t+1], d[2], d[3] = D[g+8][2t, 2t+1]. Warp-collective: all 32 lanes.
__device__ __forceinline__ void mma_m16n8k16(float* d, const uint32_t* a, const uint32_t* b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// ---------------------------------------------------------------------------------------------
// The kernels. M and N are multiples of 16, not of a block's tile: a block whose tile sticks out
// of C has warps (rung 1) or fragments (rung 2) that lie wholly outside it, and those store nothing.
// ---------------------------------------------------------------------------------------------

// Rung 1 · WMMA, naive. r1::THREADS threads per block, one warp per 16 x 16 tile of C.
__global__ void hgemm_wmma_naive_kernel(const half* __restrict__ A, const half* __restrict__ B,
                                        float* __restrict__ C, int M, int N, int K) {
    // TODO(lab2/15) begin: the warp's 16 x 16 tile of C, accumulated in one float fragment over K in steps of 16: each step loads a 16 x 16 fragment of A and one of B straight from global memory (their row strides are K and N), multiplies them into the accumulator on the tensor cores, and at the end the warp stores the accumulator into C; a warp whose tile lies outside C returns at once (the whole warp: the WMMA calls need all 32 lanes); see the chapter's tensor-core ladder, rung 1; about 14 lines; try 16x16x16, 48x48x80 and 16x4096x16 (M x K x N).
    // TODO(lab2/15) end
}

// Rung 2 · shared-memory tiles. r2::THREADS threads per block, a 128 x 128 tile of C per block.
__global__ void __launch_bounds__(r2::THREADS, 2) hgemm_smem_kernel(const half* __restrict__ A,
                                                                    const half* __restrict__ B,
                                                                    float* __restrict__ C, int M, int N, int K) {
    // TODO(lab2/15) begin: for each step of BK = 32 along K the block copies A's 128 x 32 and B's 32 x 128 tiles into padded shared arrays (16-byte loads, two of each per thread, zeros for rows of A past M, columns of B past N and either past K), waits until both are complete, and each warp multiplies its 64 x 32 part: per 16 of k, 2 fragments of B and 4 of A loaded from shared memory into 8 mma_syncs on its 4 x 2 float accumulators; it waits again before the next step overwrites the tiles; at the end each warp stores the accumulators that lie inside C; see the chapter's tensor-core ladder, rung 2; about 45 lines; try 48x48x80, 144x80x208 and 1008x1024x992, and run the sanitizer (racecheck).
    // TODO(lab2/15) end
}

// Rung 3 · mma.sync, ldmatrix, swizzled shared memory, a cp.async pipeline. r3::THREADS threads
// per block, a 128 x 128 tile of C, r3::SMEM_BYTES of dynamic shared memory: STAGES tiles of A
// (128 x 32 halves each) followed by STAGES tiles of B (32 x 128), every one laid out by swizzle.
__global__ void __launch_bounds__(r3::THREADS, 2) hgemm_mma_kernel(const half* __restrict__ A,
                                                                   const half* __restrict__ B,
                                                                   float* __restrict__ C, int M, int N, int K) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    // No mma.sync m16n8k16 or cp.async before sm_80: an empty kernel, which hgemm_3 never launches.
#else
    // TODO(lab2/15) begin: prologue: copy the first STAGES - 1 tiles of K (A's 128 x 32 and B's 32 x 128, four 16-byte cp_async_16 chunks of each per thread, at the places swizzle gives, src_bytes 0 for a chunk past M, N or K) into stages 0 .. STAGES - 2, one cp_async_commit per tile (also when there is no tile left: an empty group keeps the count); then for each tile kt: cp_async_wait until tile kt's group has landed (how many younger groups may stay in flight?), __syncthreads, issue tile kt + STAGES - 1 into the stage tile kt - 1 used and commit, then per 16 of k load the warp's 4 A fragments (ldmatrix_x4) and 8 B fragments (4 x ldmatrix_x4_trans, B is k-major) and issue 32 mma_m16n8k16 into its 4 x 8 x 4 float accumulators (the next slice's fragments loaded before this slice's mmas); at the end store each lane's accumulators that lie inside C; see the chapter's tensor-core ladder, rung 3; about 60 lines; try 16x16x16, 48x48x80, 16x4096x16 and 1008x1024x992, and run the sanitizer (racecheck).
    // TODO(lab2/15) end
#endif
}

// ---------------------------------------------------------------------------------------------
// The host side, shared by the rungs.
// ---------------------------------------------------------------------------------------------

// Blocks for a grid of BM x BN tiles over C: fewer than 2^31 / 256 (C has fewer than 2^31
// elements, a tile at least 32 x 32), far below gridDim.x's limit of 2^31 - 1.
static unsigned blocks_for(int M, int N, int BM, int BN) {
    return (unsigned)((size_t)((M + BM - 1) / BM) * (size_t)((N + BN - 1) / BN));
}

COURSE_API cudaError_t hgemm_1(const half* A, const half* B, float* C, int M, int N, int K) {
    hgemm_wmma_naive_kernel<<<blocks_for(M, N, r1::BM, r1::BN), r1::THREADS>>>(A, B, C, M, N, K);
    return cudaGetLastError();
}

COURSE_API cudaError_t hgemm_2(const half* A, const half* B, float* C, int M, int N, int K) {
    hgemm_smem_kernel<<<blocks_for(M, N, r2::BM, r2::BN), r2::THREADS>>>(A, B, C, M, N, K);
    return cudaGetLastError();
}

// Whether rung 3 can run on the current device, and its opt-in to more than 48 KiB of dynamic
// shared memory (a per-device attribute of the kernel). The kernel must have been compiled for
// sm_80 or later (a build for an older architecture has only the empty kernel); that is read
// from the kernel itself, so a binary JIT-compiled from older PTX is refused too.
static cudaError_t rung3_setup() {
    cudaFuncAttributes attr{};
    CUDA_CHECK(cudaFuncGetAttributes(&attr, hgemm_mma_kernel));
    if (attr.ptxVersion < 80) return cudaErrorNotSupported;
    return cudaFuncSetAttribute(hgemm_mma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, r3::SMEM_BYTES);
}

// rung3_setup once per device: its success is remembered, a failure is tried again next call.
// Two threads may both run it the first time; setting the same attribute twice is harmless.
static cudaError_t rung3_ready() {
    constexpr int MAX_DEVICES = 64;
    static std::atomic<bool> ready[MAX_DEVICES];  // static storage: all false at start
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    const bool tracked = dev >= 0 && dev < MAX_DEVICES;
    if (tracked && ready[dev].load(std::memory_order_acquire)) return cudaSuccess;
    CUDA_CHECK(rung3_setup());
    if (tracked) ready[dev].store(true, std::memory_order_release);
    return cudaSuccess;
}

COURSE_API cudaError_t hgemm_3(const half* A, const half* B, float* C, int M, int N, int K) {
    CUDA_CHECK(rung3_ready());  // cudaErrorNotSupported before sm_80
    hgemm_mma_kernel<<<blocks_for(M, N, r3::BM, r3::BN), r3::THREADS, r3::SMEM_BYTES>>>(A, B, C, M, N, K);
    return cudaGetLastError();
}

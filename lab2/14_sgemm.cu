// Lab 2 · Task 14 — The SGEMM ladder: C = A @ B in float32, from a naive kernel towards cuBLAS
//
// Implement: the kernels of rungs 2 to 7 of the chapter's SGEMM ladder, each computing the
//            whole product C = A @ B: sgemm_coalesced_kernel (one thread per element of C,
//            neighbouring lanes on neighbouring columns), sgemm_smem_kernel (32 x 32 tiles of A
//            and B staged in shared memory), sgemm_reg1d_kernel (each thread a column of 8
//            results), sgemm_reg2d_kernel (each thread an 8 x 8 block), sgemm_vec4_kernel (float4
//            loads, A's tile transposed in shared memory) and sgemm_warptile_kernel (a warp-level
//            tile between the block's and the thread's, with the next tile loaded while the
//            current one is multiplied), plus load4 and store4, the guarded float4 helpers of
//            rungs 6 and 7. Rung 1 (sgemm_naive_kernel) is given complete: it is where you
//            start. The host code, which picks each rung's grid and its float4 or scalar path, is
//            given too.
// Contract:  A (M, K), B (K, N) and C (M, N) are DEVICE float32 matrices, row-major and
//            contiguous. A and B are read-only and 4-byte aligned, not necessarily 16-byte
//            aligned (a view may start one float into a buffer); C is written and overlaps
//            neither. M, N, K >= 1 and each matrix has fewer than 2^29 elements (so element
//            offsets are formed in size_t, and every index fits an int). On return (after
//            synchronization) C[m][n] = sum over k of A[m][k] * B[k][n], added in float32 in
//            any order (no TF32, no lower precision). Each entry point launches on the default
//            stream, returns the launch error and does not synchronize.
// Test:      make test-lab2 TASK=14

#include "course.h"

#include <cstddef>
#include <cstdint>

// ---------------------------------------------------------------------------------------------
// The shapes of the rungs. They are given because the host code launches with them.
// ---------------------------------------------------------------------------------------------

constexpr int WARP = 32;
constexpr int TILE = 32;  // rungs 1 to 3: a TILE x TILE block of C per block of TILE x TILE threads

namespace r4 {  // rung 4: a 64 x 64 block of C per block; each of its 512 threads a column of 8
inline constexpr int BM = 64, BN = 64, BK = 8, TM = 8;
inline constexpr int THREADS = BM * BN / TM;
}  // namespace r4

namespace r5 {  // rungs 5 and 6: a 128 x 128 block of C per block; each of 256 threads 8 x 8 of it
inline constexpr int BM = 128, BN = 128, BK = 8, TM = 8, TN = 8;
inline constexpr int THREADS = BM * BN / (TM * TN);
}  // namespace r5

namespace r7 {  // rung 7: the same block and thread tiles as rung 6, and 8 warps of 32 x 64 between
inline constexpr int BM = 128, BN = 128, BK = 16;
inline constexpr int WM = 32, WN = 64;            // one warp's tile of C
inline constexpr int LANES_M = 4, LANES_N = 8;    // a warp's lanes over a 16 x 32 sub-tile, 4 x 4 each
inline constexpr int WMITER = WM / (LANES_M * 4);  // 2 sub-tiles down the warp tile
inline constexpr int WNITER = WN / (LANES_N * 4);  // 2 across: 2 x 2 x 16 = 64 results per thread
inline constexpr int THREADS = (BM / WM) * (BN / WN) * WARP;
}  // namespace r7

// ---------------------------------------------------------------------------------------------
// Given to every kernel.
// ---------------------------------------------------------------------------------------------

// The first row (.x) and column (.y) of the BM x BN tile of C this block computes. The grid is
// one-dimensional, the tiles numbered row by row: gridDim.y and gridDim.z stop at 65535, and a C
// of 2^28 x 1 has millions of tile rows, while ceil(M / BM) * ceil(N / BN) always fits gridDim.x.
template <int BM, int BN>
__device__ __forceinline__ int2 tile_origin(int N) {
    const int tiles_n = (N + BN - 1) / BN;
    return make_int2((int)(blockIdx.x / tiles_n) * BM, (int)(blockIdx.x % tiles_n) * BN);
}

// v into four consecutive registers (a float array indexed with constants, as the unrolled loops
// do, lives in registers; a reinterpret_cast to float4* of it would need 16-byte alignment).
__device__ __forceinline__ void unpack(float4 v, float* out) {
    out[0] = v.x;
    out[1] = v.y;
    out[2] = v.z;
    out[3] = v.w;
}

// ---------------------------------------------------------------------------------------------
// The kernels. Each computes its tile of C; blocks whose tile sticks out of C (M or N not a
// multiple of the tile) load zeros for the missing rows and columns and store only what is in C.
// ---------------------------------------------------------------------------------------------

// Rung 1 · naive. One thread per element of C, threadIdx.x along M: the 32 lanes of a warp read 32
// different rows of A (32 sectors for 32 floats) and write 32 different rows of C.
__global__ void sgemm_naive_kernel(const float* __restrict__ A, const float* __restrict__ B,
                                   float* __restrict__ C, int M, int N, int K) {
    const int2 tile = tile_origin<TILE, TILE>(N);
    const int row = tile.x + threadIdx.x, col = tile.y + threadIdx.y;
    if (row >= M || col >= N) return;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) acc += A[(size_t)row * K + k] * B[(size_t)k * N + col];
    C[(size_t)row * N + col] = acc;
}

// Rung 2 · coalesced. One thread per element of C, blocks of TILE x TILE threads as rung 1.
__global__ void sgemm_coalesced_kernel(const float* __restrict__ A, const float* __restrict__ B,
                                       float* __restrict__ C, int M, int N, int K) {
    // TODO(lab2/14) begin: C[row][col] for the element this thread owns, with threadIdx.x along N this time, so that the lanes of a warp read one row of A (the same float: a broadcast) and 32 neighbouring floats of a row of B, and write 32 neighbouring floats of C; see the chapter's SGEMM ladder, rung 2; about 8 lines; try 1x1x7, 7x1x1 and 33x17x65 (M x K x N).
    // TODO(lab2/14) end
}

// Rung 3 · shared-memory tiles. Blocks of TILE x TILE threads, one element of C each.
__global__ void sgemm_smem_kernel(const float* __restrict__ A, const float* __restrict__ B,
                                  float* __restrict__ C, int M, int N, int K) {
    // TODO(lab2/14) begin: the same element of C, but A and B go through shared memory: for each step of TILE along K the block loads a TILE x TILE tile of A and one of B (one float per thread each, coalesced, zero where the tile sticks out of A or B, the last step of K included), waits until both are complete, adds the TILE products, and waits again before the next step overwrites them; a thread outside C still loads its share; see the chapter's SGEMM ladder, rung 3; about 18 lines; try 33x17x65 and 65x129x31, and run the sanitizer (racecheck).
    // TODO(lab2/14) end
}

// Rung 4 · 1D register tiling. r4::THREADS threads per block, a 64 x 64 tile of C per block.
__global__ void sgemm_reg1d_kernel(const float* __restrict__ A,
                                                                  const float* __restrict__ B,
                                                                  float* __restrict__ C, int M, int N, int K) {
    // TODO(lab2/14) begin: each thread computes TM = 8 elements of C stacked in one column, accumulated in registers; per step of BK along K the block stages A's BM x BK and B's BK x BN tiles in shared memory (one float of each per thread, zero-filled past the edges), and for every k the thread reads its B value once and reuses it for its 8 rows; see the chapter's SGEMM ladder, rung 4; about 30 lines; try 65x129x31, 127x255x129 and 100x36x68.
    // TODO(lab2/14) end
}

// Rung 5 · 2D register tiling. r5::THREADS threads per block, a 128 x 128 tile of C per block.
__global__ void __launch_bounds__(r5::THREADS, 2) sgemm_reg2d_kernel(const float* __restrict__ A,
                                                                     const float* __restrict__ B,
                                                                     float* __restrict__ C, int M, int N, int K) {
    // TODO(lab2/14) begin: each thread computes an 8 x 8 block of C in registers; per step of BK = 8 along K the block stages A's 128 x 8 and B's 8 x 128 tiles in shared memory (four floats of each per thread, zero-filled past the edges), and for every k the thread copies its 8 values of A's column and 8 of B's row into registers and adds their 64 products (an outer product); see the chapter's SGEMM ladder, rung 5; about 40 lines; try 1x1x1, 127x255x129 and 100x36x68.
    // TODO(lab2/14) end
}

// Four consecutive floats of row `row` of a row-major rows x cols matrix P, from column `col` (a
// multiple of 4), zero for each one past the last row or column. VEC: the host has checked that
// every row of P starts on a 16-byte boundary (P aligned, cols a multiple of 4), so the four are
// one aligned float4, and either all of them are inside the row or none is.
template <bool VEC>
__device__ __forceinline__ float4 load4(const float* __restrict__ P, int row, int rows, int cols, int col) {
    // TODO(lab2/14) begin: the four floats as one float4 load when VEC, else one by one, each element guarded (zero past the last row or column: rung 6 and 7's tiles stick out of A and B); see the chapter's SGEMM ladder, rung 6; about 12 lines; work out what it returns for cols = 5 and col = 4, and for row = rows.
    return make_float4(0.0f, 0.0f, 0.0f, 0.0f);  //~
    // TODO(lab2/14) end
}

// The store that matches load4: v into row `row` of a rows x cols matrix P from column `col`,
// leaving out what falls past the last row or column.
template <bool VEC>
__device__ __forceinline__ void store4(float* __restrict__ P, int row, int rows, int cols, int col, float4 v) {
    // TODO(lab2/14) begin: one float4 store when VEC, else up to four scalar stores, never past the last row or column of C; see the chapter's SGEMM ladder, rung 6; about 10 lines; work out what it writes for cols = 5 and col = 4.
    // TODO(lab2/14) end
}

// Rung 6 · float4 loads. The tiles and threads of rung 5; VEC as for load4.
template <bool VEC>
__global__ void __launch_bounds__(r5::THREADS, 2) sgemm_vec4_kernel(const float* __restrict__ A,
                                                                    const float* __restrict__ B,
                                                                    float* __restrict__ C, int M, int N, int K) {
    // TODO(lab2/14) begin: rung 5 with one float4 of A and one of B per thread and per step (load4), B's stored as it is and A's transposed (As[k][m]), so that for every k a thread's 8 values of A, like its 8 of B, are two float4 reads of shared memory; the results leave through store4; see the chapter's SGEMM ladder, rung 6; about 45 lines; try 1x1x7, 100x36x68 and the case whose A and B start one float in.
    // TODO(lab2/14) end
}

// Rung 7 · warp tiling. r7::THREADS threads per block, a 128 x 128 tile of C; VEC as for load4.
template <bool VEC>
__global__ void __launch_bounds__(r7::THREADS, 2) sgemm_warptile_kernel(const float* __restrict__ A,
                                                                        const float* __restrict__ B,
                                                                        float* __restrict__ C, int M, int N, int K) {
    // TODO(lab2/14) begin: rung 6 with the block's 8 warps each owning a 32 x 64 tile of C, and within it each lane 2 x 2 sub-tiles of 4 x 4 placed so that every float4 read of shared memory by a warp covers one contiguous 64- or 128-byte span (no bank conflicts); with BK = 16 and two shared buffers, the next step's float4s are loaded into registers before the current step's products and stored into the other buffer after them, one barrier per step; every step of K is computed, the last partial one too; see the chapter's SGEMM ladder, rung 7; about 70 lines; try 1x1x1, 33x17x65, 100x36x68 and 1000x1000x1000.
    // TODO(lab2/14) end
}

// ---------------------------------------------------------------------------------------------
// The host side, shared by every rung.
// ---------------------------------------------------------------------------------------------

// Blocks for a grid of BM x BN tiles over C: about 2^24 at most (C has fewer than 2^29 elements),
// far below gridDim.x's limit of 2^31 - 1.
static unsigned blocks_for(int M, int N, int BM, int BN) {
    return (unsigned)((size_t)((M + BM - 1) / BM) * (size_t)((N + BN - 1) / BN));
}

// Whether every row of A, B and C starts on a 16-byte boundary, so that rungs 6 and 7 may move
// them as float4: aligned pointers and row lengths (K for A, N for B and C) a multiple of 4.
static bool rows_are_float4(const float* A, const float* B, const float* C, int N, int K) {
    const uintptr_t any = (uintptr_t)A | (uintptr_t)B | (uintptr_t)C;
    return any % 16 == 0 && K % 4 == 0 && N % 4 == 0;
}

COURSE_API cudaError_t sgemm_1(const float* A, const float* B, float* C, int M, int N, int K) {
    sgemm_naive_kernel<<<blocks_for(M, N, TILE, TILE), dim3(TILE, TILE)>>>(A, B, C, M, N, K);
    return cudaGetLastError();
}

COURSE_API cudaError_t sgemm_2(const float* A, const float* B, float* C, int M, int N, int K) {
    sgemm_coalesced_kernel<<<blocks_for(M, N, TILE, TILE), dim3(TILE, TILE)>>>(A, B, C, M, N, K);
    return cudaGetLastError();
}

COURSE_API cudaError_t sgemm_3(const float* A, const float* B, float* C, int M, int N, int K) {
    sgemm_smem_kernel<<<blocks_for(M, N, TILE, TILE), dim3(TILE, TILE)>>>(A, B, C, M, N, K);
    return cudaGetLastError();
}

COURSE_API cudaError_t sgemm_4(const float* A, const float* B, float* C, int M, int N, int K) {
    sgemm_reg1d_kernel<<<blocks_for(M, N, r4::BM, r4::BN), r4::THREADS>>>(A, B, C, M, N, K);
    return cudaGetLastError();
}

COURSE_API cudaError_t sgemm_5(const float* A, const float* B, float* C, int M, int N, int K) {
    sgemm_reg2d_kernel<<<blocks_for(M, N, r5::BM, r5::BN), r5::THREADS>>>(A, B, C, M, N, K);
    return cudaGetLastError();
}

COURSE_API cudaError_t sgemm_6(const float* A, const float* B, float* C, int M, int N, int K) {
    const unsigned blocks = blocks_for(M, N, r5::BM, r5::BN);
    if (rows_are_float4(A, B, C, N, K))
        sgemm_vec4_kernel<true><<<blocks, r5::THREADS>>>(A, B, C, M, N, K);
    else
        sgemm_vec4_kernel<false><<<blocks, r5::THREADS>>>(A, B, C, M, N, K);
    return cudaGetLastError();
}

COURSE_API cudaError_t sgemm_7(const float* A, const float* B, float* C, int M, int N, int K) {
    const unsigned blocks = blocks_for(M, N, r7::BM, r7::BN);
    if (rows_are_float4(A, B, C, N, K))
        sgemm_warptile_kernel<true><<<blocks, r7::THREADS>>>(A, B, C, M, N, K);
    else
        sgemm_warptile_kernel<false><<<blocks, r7::THREADS>>>(A, B, C, M, N, K);
    return cudaGetLastError();
}

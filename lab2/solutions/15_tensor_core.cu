// Lab 2 · Task 15 — Tensor cores: FP16 GEMM with FP32 accumulation through WMMA
//
// Implement: the two rungs of the chapter's tensor-core ladder, each computing the whole product
//            C = A @ B on the tensor cores with the WMMA API of <mma.h>: hgemm_wmma_naive_kernel
//            (one warp per 16 x 16 tile of C, its fragments loaded straight from global memory)
//            and hgemm_smem_kernel (a 128 x 128 tile of C per block of 8 warps, each warp 4 x 2
//            accumulator fragments, the tiles of A and B staged through padded shared memory).
//            The host code, which launches each rung, is given.
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

#include <cuda_fp16.h>
#include <mma.h>

#include <cstddef>

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
// The kernels. M and N are multiples of 16, not of a block's tile: a block whose tile sticks out
// of C has warps (rung 1) or fragments (rung 2) that lie wholly outside it, and those store nothing.
// ---------------------------------------------------------------------------------------------

// Rung 1 · WMMA, naive. r1::THREADS threads per block, one warp per 16 x 16 tile of C.
__global__ void hgemm_wmma_naive_kernel(const half* __restrict__ A, const half* __restrict__ B,
                                        float* __restrict__ C, int M, int N, int K) {
    // TODO(lab2/15) begin: the warp's 16 x 16 tile of C, accumulated in one float fragment over K in steps of 16: each step loads a 16 x 16 fragment of A and one of B straight from global memory (their row strides are K and N), multiplies them into the accumulator on the tensor cores, and at the end the warp stores the accumulator into C; a warp whose tile lies outside C returns at once (the whole warp: the WMMA calls need all 32 lanes); see the chapter's tensor-core ladder, rung 1; about 14 lines; try 16x16x16, 48x48x80 and 16x4096x16 (M x K x N).
    const int2 tile = tile_origin<r1::BM, r1::BN>(N);
    const int warp = threadIdx.x / WARP;
    const int row0 = tile.x + (warp / r1::WARPS_N) * WM, col0 = tile.y + (warp % r1::WARPS_N) * WN;
    if (row0 >= M || col0 >= N) return;  // the same for all 32 lanes of the warp

    wmma::fragment<wmma::matrix_a, WM, WN, WK, half, wmma::row_major> a;  // A[row0 .. +16][k .. +16]
    wmma::fragment<wmma::matrix_b, WM, WN, WK, half, wmma::row_major> b;  // B[k .. +16][col0 .. +16]
    wmma::fragment<wmma::accumulator, WM, WN, WK, float> acc;             // C[row0 .. +16][col0 .. +16]
    wmma::fill_fragment(acc, 0.0f);
    for (int k = 0; k < K; k += WK) {
        wmma::load_matrix_sync(a, A + (size_t)row0 * K + k, K);
        wmma::load_matrix_sync(b, B + (size_t)k * N + col0, N);
        wmma::mma_sync(acc, a, b, acc);
    }
    wmma::store_matrix_sync(C + (size_t)row0 * N + col0, acc, N, wmma::mem_row_major);
    // TODO(lab2/15) end
}

// Rung 2 · shared-memory tiles. r2::THREADS threads per block, a 128 x 128 tile of C per block.
__global__ void __launch_bounds__(r2::THREADS, 2) hgemm_smem_kernel(const half* __restrict__ A,
                                                                    const half* __restrict__ B,
                                                                    float* __restrict__ C, int M, int N, int K) {
    // TODO(lab2/15) begin: for each step of BK = 32 along K the block copies A's 128 x 32 and B's 32 x 128 tiles into padded shared arrays (16-byte loads, two of each per thread, zeros for rows of A past M, columns of B past N and either past K), waits until both are complete, and each warp multiplies its 64 x 32 part: per 16 of k, 2 fragments of B and 4 of A loaded from shared memory into 8 mma_syncs on its 4 x 2 float accumulators; it waits again before the next step overwrites the tiles; at the end each warp stores the accumulators that lie inside C; see the chapter's tensor-core ladder, rung 2; about 45 lines; try 48x48x80, 144x80x208 and 1008x1024x992, and run the sanitizer (racecheck).
    using namespace r2;
    __shared__ __align__(32) half As[BM][LDA];  // As[i][k] = A[row0 + i][k0 + k]
    __shared__ __align__(32) half Bs[BK][LDB];  // Bs[k][j] = B[k0 + k][col0 + j]
    const int2 tile = tile_origin<BM, BN>(N);
    const int tid = threadIdx.x, warp = tid / WARP;
    const int wrow = (warp / WARPS_N) * WTM, wcol = (warp % WARPS_N) * WTN;  // the warp's 64 x 32 in the tile

    wmma::fragment<wmma::accumulator, WM, WN, WK, float> acc[FM][FN];
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

    for (int k0 = 0; k0 < K; k0 += BK) {
        // A's tile is 128 rows of 4 chunks of 8 halves, B's 32 rows of 16 chunks: 512 chunks each,
        // two per thread. K, N and every chunk's first column are multiples of 8, so a chunk lies
        // wholly inside its matrix or wholly outside (then it is zeros: they add nothing).
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int c = tid + r * THREADS;
            const int ai = c / (BK / CHUNK), ak = (c % (BK / CHUNK)) * CHUNK;
            const int a_row = tile.x + ai, a_k = k0 + ak;
            uint4 va = make_uint4(0, 0, 0, 0);
            if (a_row < M && a_k < K) va = *reinterpret_cast<const uint4*>(A + (size_t)a_row * K + a_k);
            *reinterpret_cast<uint4*>(&As[ai][ak]) = va;

            const int bk = c / (BN / CHUNK), bj = (c % (BN / CHUNK)) * CHUNK;
            const int b_k = k0 + bk, b_col = tile.y + bj;
            uint4 vb = make_uint4(0, 0, 0, 0);
            if (b_k < K && b_col < N) vb = *reinterpret_cast<const uint4*>(B + (size_t)b_k * N + b_col);
            *reinterpret_cast<uint4*>(&Bs[bk][bj]) = vb;
        }
        __syncthreads();  // both tiles complete before any warp loads a fragment from them
#pragma unroll
        for (int kk = 0; kk < BK; kk += WK) {
            wmma::fragment<wmma::matrix_b, WM, WN, WK, half, wmma::row_major> b[FN];
#pragma unroll
            for (int j = 0; j < FN; ++j) wmma::load_matrix_sync(b[j], &Bs[kk][wcol + j * WN], LDB);
#pragma unroll
            for (int i = 0; i < FM; ++i) {
                wmma::fragment<wmma::matrix_a, WM, WN, WK, half, wmma::row_major> a;
                wmma::load_matrix_sync(a, &As[wrow + i * WM][kk], LDA);
#pragma unroll
                for (int j = 0; j < FN; ++j) wmma::mma_sync(acc[i][j], a, b[j], acc[i][j]);
            }
        }
        __syncthreads();  // every warp done with the tiles before the next step overwrites them
    }

    // M and N are multiples of 16: each fragment lies wholly inside C or wholly outside it
#pragma unroll
    for (int i = 0; i < FM; ++i) {
        const int row = tile.x + wrow + i * WM;
#pragma unroll
        for (int j = 0; j < FN; ++j) {
            const int col = tile.y + wcol + j * WN;
            if (row < M && col < N)
                wmma::store_matrix_sync(C + (size_t)row * N + col, acc[i][j], N, wmma::mem_row_major);
        }
    }
    // TODO(lab2/15) end
}

// ---------------------------------------------------------------------------------------------
// The host side, shared by both rungs.
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

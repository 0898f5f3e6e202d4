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
    using namespace r3;
    extern __shared__ __align__(128) unsigned char smem_bytes[];
    half* const As = reinterpret_cast<half*>(smem_bytes);  // stage s: As + s * A_TILE, 128 rows of 4 chunks
    half* const Bs = As + STAGES * A_TILE;                  // stage s: Bs + s * B_TILE, 32 rows (k) of 16 chunks
    const int2 tile = tile_origin<BM, BN>(N);
    const int tid = threadIdx.x, warp = tid / WARP, lane = tid % WARP;
    const int wrow = (warp / WARPS_N) * WTM, wcol = (warp % WARPS_N) * WTN;  // the warp's 64 x 64 in the tile
    const int tiles_k = (K + BK - 1) / BK;  // the last may be half a tile (K is a multiple of 16 only)

    // Tile kt of K into stage s: 512 chunks of A and 512 of B, PASSES = 4 of each per thread, row by
    // row (4 consecutive threads per row of A, 16 per row of B: coalesced). Thread t's chunks are
    // A's rows a_i + 32 p at chunk a_c and B's rows (k) b_k + 8 p at chunk b_c, p = 0 .. 3; every
    // place that does not depend on kt is worked out once, here. Rows 32 or 8 apart keep their
    // swizzle (it reads row bits 0-2 only), so pass p's chunk lands p * 32 (8) rows further.
    // K, N and every chunk's first column are multiples of 8: a chunk lies wholly inside its matrix
    // or wholly outside, where src_bytes = 0 stores zeros (they add nothing) and reads nothing.
    const int a_i = tid / A_CPR, a_c = tid % A_CPR, b_k = tid / B_CPR, b_c = tid % B_CPR;
    const int a_dst = swizzle<A_CPR>(a_i, a_c), b_dst = swizzle<B_CPR>(b_k, b_c);
    const int a_col = a_c * CHUNK, b_col = tile.y + b_c * CHUNK;  // at kt = 0
    const bool b_in_n = b_col < N;
    const half* const a_src = A + (size_t)min(tile.x + a_i, M - 1) * K + a_col;  // clamped: valid (a row past M is past M in every pass)
    const half* const b_src = B + (size_t)b_k * N + min(b_col, N - CHUNK);
    auto load_tile = [&](int kt, int s) {
        const int k0 = kt * BK;
        half* const as = As + s * A_TILE;
        half* const bs = Bs + s * B_TILE;
#pragma unroll
        for (int p = 0; p < PASSES; ++p) {
            const bool a_in = tile.x + a_i + p * A_ROWS < M && k0 + a_col < K;
            cp_async_16(as + a_dst + p * A_ROWS * BK, a_in ? a_src + (size_t)p * A_ROWS * K + k0 : A, a_in ? 16 : 0);
            const bool b_in = b_in_n && k0 + b_k + p * B_ROWS < K;
            cp_async_16(bs + b_dst + p * B_ROWS * BN, b_in ? b_src + (size_t)(k0 + p * B_ROWS) * N : B, b_in ? 16 : 0);
        }
    };

    // The warp's fragments for slice ks (16 of k) of a stage. Lane l points ldmatrix at row l % 16,
    // chunk l / 16 of a 16 x 16 block: lanes 0-7 rows 0-7 and 8-15 rows 8-15 of the first 8 columns,
    // lanes 16-31 the same rows of the next 8. For A (rows m, columns k) the four matrices come
    // out as a[0..3] of mma's A fragment. For B (rows k, columns n) .trans turns each 8 x 8 block
    // into B^T's, i.e. pairs of consecutive k per n: matrices 0 and 1 (k 0-7 and 8-15 of columns
    // n .. n + 7) are b[0], b[1] of one n8 tile, matrices 2 and 3 those of the next n8 tile.
    // The blocks of a warp lie 16 rows apart (A's fragments i, B's slices ks), which keeps the
    // swizzle: only each lane's place in the first block of a slice (A) or of a pair of n8 tiles
    // (B) needs it, the rest is 16 rows further.
    int a_ld[KSTEPS], b_ld[NI / 2];
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ++ks) a_ld[ks] = swizzle<A_CPR>(wrow + lane % 16, ks * (MMA_K / CHUNK) + lane / 16);
#pragma unroll
    for (int j = 0; j < NI; j += 2) b_ld[j / 2] = swizzle<B_CPR>(lane % 16, (wcol + j * MMA_N) / CHUNK + lane / 16);
    auto load_fragments = [&](uint32_t (&a)[MI][4], uint32_t (&b)[NI][2], const half* as, const half* bs, int ks) {
#pragma unroll
        for (int i = 0; i < MI; ++i) ldmatrix_x4(a[i], as + a_ld[ks] + i * MMA_M * BK);
#pragma unroll
        for (int j = 0; j < NI; j += 2) ldmatrix_x4_trans(&b[j][0], bs + b_ld[j / 2] + ks * MMA_K * BN);
    };

    float acc[MI][NI][4] = {};           // acc[i][j]: the 16 x 8 tile at (wrow + 16 i, wcol + 8 j)
    uint32_t af[2][MI][4], bf[2][NI][2];  // two slices of fragments: the next loads while this one multiplies

    // Prologue: tiles 0 .. STAGES - 2 in flight, one commit group each (empty past the last tile)
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < tiles_k) load_tile(s, s);
        cp_async_commit();
    }

    for (int kt = 0; kt < tiles_k; ++kt) {
        // STAGES - 1 + kt groups committed so far; with at most STAGES - 2 in flight, groups 0 .. kt,
        // so tile kt, have landed for this thread. The barrier makes every thread's copies visible,
        // and it is also where every warp has finished reading tile kt - 1 (its last ldmatrix came
        // before this barrier): only after it may that stage be refilled.
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        if (kt + STAGES - 1 < tiles_k) load_tile(kt + STAGES - 1, (kt + STAGES - 1) % STAGES);
        cp_async_commit();  // one group per iteration, empty at the end, so the count above holds

        const half* as = As + (kt % STAGES) * A_TILE;
        const half* bs = Bs + (kt % STAGES) * B_TILE;
        load_fragments(af[0], bf[0], as, bs, 0);
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ++ks) {
            if (ks + 1 < KSTEPS) load_fragments(af[(ks + 1) % 2], bf[(ks + 1) % 2], as, bs, ks + 1);
#pragma unroll
            for (int i = 0; i < MI; ++i)
#pragma unroll
                for (int j = 0; j < NI; ++j) mma_m16n8k16(acc[i][j], af[ks % 2][i], bf[ks % 2][j]);
        }
    }
    cp_async_wait<0>();  // nothing may still be in flight when the block exits (only empty groups are)

    // Lane (g, t) = (lane / 4, lane % 4) holds D[g][2t, 2t+1] and D[g+8][2t, 2t+1] of each 16 x 8
    // tile: two float2 stores (8-byte aligned: N and 2t are even). M and N are multiples of 16, so
    // each 8-row half and each n8 tile lies wholly inside C or wholly outside.
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int i = 0; i < MI; ++i) {
#pragma unroll
        for (int j = 0; j < NI; ++j) {
            const int row = tile.x + wrow + i * MMA_M + g, col = tile.y + wcol + j * MMA_N + 2 * t;
            if (col >= N) continue;
            if (row < M)
                *reinterpret_cast<float2*>(C + (size_t)row * N + col) = make_float2(acc[i][j][0], acc[i][j][1]);
            if (row + 8 < M)
                *reinterpret_cast<float2*>(C + (size_t)(row + 8) * N + col) = make_float2(acc[i][j][2], acc[i][j][3]);
        }
    }
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

// Lab 2 · Task 15 — Tensor cores: FP16 GEMM with FP32 accumulation, WMMA, mma.sync, then wgmma
//
// Implement: the four rungs of the chapter's tensor-core ladder, each computing the whole product
//            C = A @ B on the tensor cores. Rungs 1 and 2 use the WMMA API of <mma.h>:
//            hgemm_wmma_naive_kernel (one warp per 16 x 16 tile of C, its fragments loaded
//            straight from global memory) and hgemm_smem_kernel (a 128 x 128 tile of C per block
//            of 8 warps, each warp 4 x 2 accumulator fragments, the tiles of A and B staged
//            through padded shared memory). Rung 3, hgemm_mma_kernel, drops to PTX (sm_80 and
//            later): mma.sync m16n8k16 on fragments loaded with ldmatrix from XOR-swizzled
//            shared memory, filled by a 4-stage cp.async pipeline. Rung 4,
//            hgemm_tma_wgmma_kernel, is Hopper's (sm_90a, an H100 or H200 only): one thread copies
//            128 x 256 tiles of C's operands with TMA into a 4-stage pipeline handed over through
//            mbarriers, two consumer warpgroups multiply them with wgmma.mma_async straight from
//            shared memory, the two CTAs of a cluster share B's tile (TMA multicast) and each CTA
//            walks its tiles persistently; you write the producer's loop and the consumers' loop
//            and epilogue. The PTX wrappers, the swizzle, the tensor maps and the host code, which
//            launches each rung, are given.
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
//            default stream, returns the launch error and does not synchronize. hgemm_4 returns
//            cudaErrorNotSupported on any card but compute capability 9.0 (the grader skips it
//            there), hgemm_3 below 8.0.
// Test:      make test-lab2 TASK=15

#include "course.h"
#include "course_mma.h"

#include <cuda_fp16.h>
#include <mma.h>

#include <algorithm>
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

namespace r4 {  // rung 4 (sm_90a): TMA, mbarriers, wgmma, a producer and two consumer warpgroups
inline constexpr int BM = 128, BN = 256;  // a CTA's tile of C: 85 FLOPs per byte of A and B loaded (rung 2: 64)
inline constexpr int BK = 64;             // one stage of K: 64 halves, one 128-byte swizzle row of A
inline constexpr int STAGES = 4;          // 4 stages of 48 KiB: as many as fit in shared memory
inline constexpr int CLUSTER = 2;         // CTAs per cluster, neighbours along M: one tile of B serves both
inline constexpr int WG = 128;            // threads per warpgroup (4 warps)
inline constexpr int CONSUMERS = 2;       // consumer warpgroups, 64 rows of the tile each
inline constexpr int THREADS = (1 + CONSUMERS) * WG;  // warpgroup 0 produces, 1 and 2 consume: 384
inline constexpr int WGMMA_M = 64, WGMMA_N = BN, WGMMA_K = 16;  // one wgmma: m64n256k16
inline constexpr int KSTEPS = BK / WGMMA_K;                     // 4 wgmmas per stage per consumer
inline constexpr int ACC = WGMMA_M * WGMMA_N / WG;              // 128 float accumulators per consumer thread
inline constexpr int B_COLS = 64;                               // columns of B per TMA box: 128-byte rows
inline constexpr int B_BOXES = BN / B_COLS;                     // 4 boxes per stage of B, half issued by each CTA
inline constexpr int A_BYTES = BM * BK * 2;                     // 16 KiB per stage
inline constexpr int B_BOX_BYTES = BK * B_COLS * 2;             // 8 KiB
inline constexpr int B_BYTES = B_BOXES * B_BOX_BYTES;           // 32 KiB per stage
inline constexpr int STAGE_BYTES = A_BYTES + B_BYTES;           // 48 KiB: what a stage's full barrier waits for
inline constexpr int BARRIERS = 2 * STAGES;                     // a full and an empty barrier per stage
inline constexpr int SMEM_BYTES = 1024 + STAGES * STAGE_BYTES + BARRIERS * 8;  // 1 KiB of room to align: 193 KiB
inline constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232;  // setmaxnreg: 40 x 128 + 232 x 256 <= 65,536
inline constexpr int GROUP = 8;  // pairs of tile rows per band of the order in which the clusters take tiles
}  // namespace r4
static_assert(r4::BK * 2 == 128 && r4::B_COLS * 2 == 128, "a row of A's tile and of B's box: one 128-byte swizzle row");
static_assert(r4::CONSUMERS * r4::WGMMA_M == r4::BM && r4::B_BOXES % r4::CLUSTER == 0, "the consumers cover the tile");
static_assert(r4::PRODUCER_REGS * r4::WG + r4::CONSUMERS * r4::CONSUMER_REGS * r4::WG <= 65536, "the register file");
static_assert(r4::SMEM_BYTES <= 227 * 1024, "an H100's shared memory per block");

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
// Given to rung 4: the Hopper PTX of course_mma.h (TMA, mbarriers, clusters, wgmma's fence,
// commit and wait, descriptors, setmaxnreg: read it), the wgmma below, the layout of shared
// memory and the order of the tiles. The instructions exist on sm_90a only; for any other target
// these compile to nothing and hgemm_4 refuses to launch (cudaErrorNotSupported).
// ---------------------------------------------------------------------------------------------

// D (64 x 256, float) = A (64 x 16, half) · B (16 x 256, half) + (accumulate ? D : 0), issued by
// the 128 threads of a warpgroup, asynchronously (wgmma_commit, wgmma_wait), with A and B read
// from shared memory through their descriptors (wgmma_desc_sw128). A is K-major (a row of A's
// tile holds k contiguous). TRANS_B says how B's tile is stored: 0 K-major (a row holds k
// contiguous: B^T row-major), 1 MN-major (a row holds n contiguous: B row-major, as here).
// Thread tid of the warpgroup holds, with w = tid / 32, g = tid % 32 / 4 and t = tid % 4, for
// j = 0 .. 31: d[4j], d[4j+1] = D[16w + g][8j + 2t, 8j + 2t + 1] and d[4j+2], d[4j+3] =
// D[16w + g + 8][8j + 2t, 8j + 2t + 1]: each warp 16 rows, laid out as mma.sync's D fragments.
template <int TRANS_B>
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[r4::ACC], uint64_t desc_a, uint64_t desc_b,
                                                 bool accumulate) {
#if defined(COURSE_SM90A)
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,\n"
        " %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,\n"
        " %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,\n"
        " %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,\n"
        " %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,\n"
        " %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,\n"
        " %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,\n"
        " %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127},\n"
        " %128, %129, p, 1, 1, 0, %131;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate ? 1 : 0), "n"(TRANS_B));
#endif
}

// Rung 4's shared memory, from a base aligned to 1024 bytes (the 128-byte swizzle repeats every
// 1024 bytes, and TMA and wgmma both apply it to the address bits, so every tile starts at a
// multiple of 1024): STAGES tiles of A, STAGES tiles of B, then a full and an empty barrier per
// stage. A's tile of stage s is BM = 128 rows of BK = 64 halves (16 KiB, as TMA writes a 64 x 128
// box with 128-byte swizzling: row r's 16-byte chunk c at chunk c ^ (r % 8)); B's is B_BOXES = 4
// boxes of BK = 64 rows (k) of B_COLS = 64 halves (n), 8 KiB each: box j holds columns 64j .. 64j + 63
// of the tile, swizzled the same way.
struct Rung4Smem {
    unsigned char* base;

    __device__ half* a(int s) const { return reinterpret_cast<half*>(base) + s * r4::BM * r4::BK; }
    __device__ half* b(int s) const {
        return reinterpret_cast<half*>(base) + r4::STAGES * r4::BM * r4::BK + s * r4::BK * r4::BN;
    }
    // the full barrier of stage s: its tiles have landed (one arrival, the producer's, and STAGE_BYTES)
    __device__ uint64_t* full(int s) const {
        return reinterpret_cast<uint64_t*>(base + r4::STAGES * r4::STAGE_BYTES) + s;
    }
    // the empty barrier of stage s: every consumer of both CTAs is done reading it (one arrival per
    // consumer warp of the cluster)
    __device__ uint64_t* empty(int s) const { return full(s) + r4::STAGES; }
};

// Which tiles of C rung 4's CTAs compute. The two CTAs of a cluster take the two tiles of a pair:
// the tile rows 2q and 2q + 1 (CTA rank 0 and 1) of one tile column, whose tiles of B are the same.
// Pair p of `pairs` goes to cluster p % clusters, and a cluster walks its pairs p, p + clusters, ...
// (the grid has no more clusters than fit on the GPU at once: a persistent kernel). The pairs are
// numbered down bands of GROUP pairs of tile rows, column after column, so that the clusters at
// work at the same time read the same few tiles of A and B, which L2 then holds.
struct Rung4Tiles {
    int tiles_m, pairs_m, tiles_n, pairs, k_tiles;

    __device__ Rung4Tiles(int M, int N, int K)
        : tiles_m((M + r4::BM - 1) / r4::BM),
          pairs_m((tiles_m + r4::CLUSTER - 1) / r4::CLUSTER),
          tiles_n((N + r4::BN - 1) / r4::BN),
          pairs(pairs_m * tiles_n),
          k_tiles((K + r4::BK - 1) / r4::BK) {}  // the last may be a part of BK: TMA reads zeros past K

    // The first row (.x) and column (.y) of the tile this CTA (rank `rank` in its cluster) computes
    // for pair p. With an odd number of tile rows, the second tile of the last row of pairs lies
    // wholly below C: its row is M or more.
    __device__ int2 origin(int p, int rank) const {
        const int band = r4::GROUP * tiles_n;                              // pairs per band
        const int q0 = p / band * r4::GROUP;                               // the band's first pair row
        const int rows = min(r4::GROUP, pairs_m - q0);                     // its pair rows (the last band fewer)
        const int q = q0 + p % band % rows, n = p % band / rows;           // down the band, then across
        return make_int2((q * r4::CLUSTER + rank) * r4::BM, n * r4::BN);
    }
};

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

// Rung 4 · TMA, mbarriers, wgmma, a warp-specialised persistent pipeline, clusters of 2 (sm_90a).
// r4::THREADS = 384 threads per CTA, in clusters of CLUSTER = 2 CTAs, r4::SMEM_BYTES of dynamic
// shared memory (Rung4Smem), and as many clusters as fit on the GPU at once: each walks its pairs
// of 128 x 256 tiles of C (Rung4Tiles). Warpgroup 0 is the producer: one thread of it copies, for
// every tile and every step of BK = 64 along K, A's 128 x 64 tile and its half of B's 64 x 256
// tile (both CTAs' stages get it: multicast) into the next stage, once both CTAs' consumers have
// released it. Warpgroups 1 and 2 are the consumers: each multiplies its 64 rows of the tile by
// the whole of B's, 4 wgmma m64n256k16 per stage into 128 float accumulators per thread, and
// stores them into C at the end of the tile. map_a describes A (boxes of 64 columns x 128 rows),
// map_b B (boxes of 64 x 64), both with 128-byte swizzling.
__global__ void __launch_bounds__(r4::THREADS, 1)
    hgemm_tma_wgmma_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                           float* __restrict__ C, int M, int N, int K) {
#if !defined(COURSE_SM90A)
    // No wgmma, TMA multicast or setmaxnreg outside sm_90a: an empty kernel, which hgemm_4 never launches.
#else
    using namespace r4;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const Rung4Smem sm{smem_raw + (1024 - smem_u32(smem_raw) % 1024) % 1024};
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(sm.full(s), 1);                             // the producer's arrive_expect_tx
            mbar_init(sm.empty(s), CONSUMERS * (WG / WARP) * CLUSTER);  // each consumer warp of both CTAs
        }
        mbar_fence_init();
    }
    // Both CTAs' barriers are initialised before any thread of the cluster arrives on one or copies into one.
    cluster_sync();

    if (threadIdx.x / WG == 0) {  // the producer warpgroup: it needs few registers, and gives the rest back
        setmaxnreg_dec<PRODUCER_REGS>();
        if (threadIdx.x == 0) {
            // TODO(lab2/15) begin: the producer, one thread: walk this cluster's pairs (p from blockIdx.x / CLUSTER, step gridDim.x / CLUSTER, below Rung4Tiles::pairs) and for each the k_tiles steps of K, counting steps over all tiles in one counter `it` (stage it % STAGES, round it / STAGES): wait until the stage is empty (mbar_wait on sm.empty(s); which parity lets the first round through a fresh barrier?), announce the stage's bytes on sm.full(s) (mbar_arrive_expect_tx: all that lands in this CTA, the partner's half of B included), then copy A's box at (k, row) with tma_load_2d and this CTA's half of B's boxes (2 of 4, by cluster_rank()) at (column, k) with tma_load_2d_multicast to both CTAs; a tile wholly below C copies the rows of the last real tile (its partner needs its half of B all the same); see the chapter's tensor-core ladder, rung 4; about 20 lines; try 16x16x16, 16x4096x16 and 1040x1296x2112.
            const Rung4Tiles tiles(M, N, K);
            const int rank = (int)cluster_rank();
            tma_prefetch_map(&map_a);
            tma_prefetch_map(&map_b);
            int it = 0;  // steps of K issued so far, over all of this CTA's tiles
            for (int p = blockIdx.x / CLUSTER; p < tiles.pairs; p += gridDim.x / CLUSTER) {
                const int2 tile = tiles.origin(p, rank);
                const int a_row = min(tile.x, (tiles.tiles_m - 1) * BM);  // rows of a real tile: see Rung4Tiles
                for (int kt = 0; kt < tiles.k_tiles; ++kt, ++it) {
                    const int s = it % STAGES;
                    // round it / STAGES of stage s may start once round it / STAGES - 1 has been read by
                    // both CTAs; a fresh barrier counts as having completed the phase before its first
                    mbar_wait(sm.empty(s), ((it / STAGES) & 1) ^ 1);
                    mbar_arrive_expect_tx(sm.full(s), STAGE_BYTES);
                    tma_load_2d(sm.a(s), &map_a, kt * BK, a_row, sm.full(s));
                    for (int j = rank * (B_BOXES / CLUSTER); j < (rank + 1) * (B_BOXES / CLUSTER); ++j)
                        tma_load_2d_multicast(sm.b(s) + j * BK * B_COLS, &map_b, tile.y + j * B_COLS, kt * BK,
                                              sm.full(s), (1 << CLUSTER) - 1);
                }
            }
            // TODO(lab2/15) end
        }
        __syncwarp();  // the first warp whole again before the cluster barrier below
    } else {  // a consumer warpgroup: 64 rows of the tile, 128 accumulators per thread
        setmaxnreg_inc<CONSUMER_REGS>();
        // TODO(lab2/15) begin: a consumer warpgroup (w = threadIdx.x / WG - 1: rows 64w .. 64w + 63 of the tile): walk the same pairs and steps as the producer, with the same counter; per step wait until the stage is full (mbar_wait on sm.full(s), parity round % 2), wgmma_fence, issue 4 wgmma_m64n256k16 (one per 16 of k; A's descriptor from this warpgroup's rows of sm.a(s) and B's from sm.b(s), both through wgmma_desc_sw128: which byte offsets for a K-major A and an MN-major B, and which TRANS_B?; D = A·B on the tile's first step), wgmma_commit, then wgmma_wait<1> so the previous step's wgmmas are done and lane 0 of each warp releases that step's stage to both CTAs (mbar_arrive_cluster on sm.empty, ranks 0 and 1); after the last step wgmma_wait<0> and release it too; then store the accumulators that lie inside C (two float2 per 8 columns, the layout of wgmma_m64n256k16's comment); see the chapter's tensor-core ladder, rung 4; about 40 lines; try 16x16x16, 304x48x464 and 1040x1296x2112.
        const Rung4Tiles tiles(M, N, K);
        const int rank = (int)cluster_rank();
        const int w = threadIdx.x / WG - 1;                                  // rows 64w .. 64w + 63 of the tile
        const int warp = threadIdx.x % WG / WARP, lane = threadIdx.x % WARP;  // warp 16 rows of those 64
        // Lane 0 of each warp, once wgmma_wait says its reads of stage s are over: one arrival on stage
        // s's empty barrier in each CTA of the cluster (the partner's producer writes B into this CTA too).
        auto release = [&](int s) {
            if (lane == 0)
                for (int c = 0; c < CLUSTER; ++c) mbar_arrive_cluster(sm.empty(s), c);
        };
        float acc[ACC];  // D: the warpgroup's 64 x 256 of the tile, laid out as wgmma_m64n256k16 says
        for (int i = 0; i < ACC; ++i) acc[i] = 0.0f;  // defined values; each tile starts with D = A·B anyway
        int it = 0;  // steps of K consumed so far: the producer's count, step for step
        for (int p = blockIdx.x / CLUSTER; p < tiles.pairs; p += gridDim.x / CLUSTER) {
            const int2 tile = tiles.origin(p, rank);
            for (int kt = 0; kt < tiles.k_tiles; ++kt, ++it) {
                const int s = it % STAGES;
                mbar_wait(sm.full(s), (it / STAGES) & 1);  // round it / STAGES of stage s has landed
                wgmma_fence_operands(acc);
                wgmma_fence();  // the accumulators written before (zeros, the last tile's) before wgmma reads them
#pragma unroll
                for (int ks = 0; ks < KSTEPS; ++ks) {
                    // A: this warpgroup's 64 rows, k = 16 ks .. 16 ks + 15: 32 bytes into each 128-byte
                    // row (the swizzle is applied to the address: a start inside the pattern is allowed);
                    // groups of 8 rows 1024 bytes apart. B: k rows 16 ks .. 16 ks + 15, 2048 bytes into
                    // each box; groups of 8 k rows 1024 bytes apart, boxes of 64 columns 8 KiB apart.
                    const uint64_t da = wgmma_desc_sw128(sm.a(s) + w * WGMMA_M * BK + ks * WGMMA_K, 16, 1024);
                    const uint64_t db = wgmma_desc_sw128(sm.b(s) + ks * WGMMA_K * B_COLS, B_BOX_BYTES, 1024);
                    wgmma_m64n256k16<1>(acc, da, db, kt > 0 || ks > 0);  // B's tile is n-major: transposed
                }
                wgmma_commit();
                wgmma_wait<1>();  // this step's group may still run; the previous step's is done
                wgmma_fence_operands(acc);
                if (kt > 0) release((it - 1) % STAGES);
            }
            wgmma_wait<0>();
            wgmma_fence_operands(acc);
            release((it - 1) % STAGES);  // K >= 16: every tile has a step

            // Row r (and r + 8) of C, columns c, c + 1 for c = c0 + 8 j: a float2 each (8-byte aligned:
            // N and c are even). M and N are multiples of 16 only: rows and columns past C are skipped.
            const int r = tile.x + w * WGMMA_M + warp * 16 + lane / 4;
            const int c0 = tile.y + 2 * (lane % 4);
#pragma unroll
            for (int j = 0; j < WGMMA_N / 8; ++j) {
                const int c = c0 + 8 * j;
                if (c >= N) break;
                if (r < M) *reinterpret_cast<float2*>(C + (size_t)r * N + c) = make_float2(acc[4 * j], acc[4 * j + 1]);
                if (r + 8 < M)
                    *reinterpret_cast<float2*>(C + (size_t)(r + 8) * N + c) =
                        make_float2(acc[4 * j + 2], acc[4 * j + 3]);
            }
        }
        // TODO(lab2/15) end
    }
    // No CTA leaves while its partner may still arrive on its barriers or copy into its shared memory.
    cluster_sync();
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

COURSE_API cudaError_t hgemm_3(const half* A, const half* B, float* C, int M, int N, int K) {
    // cudaErrorNotSupported before sm_80; the kernel's opt-in to its shared memory (course_mma.h)
    CUDA_CHECK(tensor_core_kernel_ready<hgemm_mma_kernel>(r3::SMEM_BYTES));
    hgemm_mma_kernel<<<blocks_for(M, N, r3::BM, r3::BN), r3::THREADS, r3::SMEM_BYTES>>>(A, B, C, M, N, K);
    return cudaGetLastError();
}

// Rung 4's set-up, once per device: only a 9.0 card runs the sm_90a build; the kernel's opt-in to
// SMEM_BYTES of shared memory; and how many clusters of CLUSTER CTAs fit on the device at once
// (the persistent grid: one CTA per SM at 193 KiB of shared memory, clusters placed by the
// hardware; the SMs over CLUSTER if the occupancy query fails). The kernel must also have been
// built for sm_90a: an sm_90 build compiles it empty, and the grader's rules catch that build.
static cudaError_t rung4_setup(int dev, int* clusters) {
    int major = 0, minor = 0, sms = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    if (major != 9 || minor != 0) return cudaErrorNotSupported;
    CUDA_CHECK(
        cudaFuncSetAttribute(hgemm_tma_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, r4::SMEM_BYTES));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    cudaLaunchAttribute cluster{};
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = r4::CLUSTER;
    cluster.val.clusterDim.y = 1;
    cluster.val.clusterDim.z = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(r4::CLUSTER);
    config.blockDim = dim3(r4::THREADS);
    config.dynamicSmemBytes = r4::SMEM_BYTES;
    config.attrs = &cluster;
    config.numAttrs = 1;
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, hgemm_tma_wgmma_kernel, &config) != cudaSuccess || n < 1) {
        (void)cudaGetLastError();  // not the launch's error: the hgemm_4 after this returns that
        n = sms / r4::CLUSTER;
    }
    *clusters = n;
    return cudaSuccess;
}

// rung4_setup once per device (its success remembered, a failure tried again next call), as rung 3.
static cudaError_t rung4_ready(int* clusters) {
    constexpr int MAX_DEVICES = 64;
    static std::atomic<int> found[MAX_DEVICES];  // clusters per device; 0: not set up yet
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    const bool tracked = dev >= 0 && dev < MAX_DEVICES;
    if (tracked && (*clusters = found[dev].load(std::memory_order_acquire)) > 0) return cudaSuccess;
    const cudaError_t err = rung4_setup(dev, clusters);
    if (err != cudaSuccess) return err;
    if (tracked) found[dev].store(*clusters, std::memory_order_release);
    return cudaSuccess;
}

COURSE_API cudaError_t hgemm_4(const half* A, const half* B, float* C, int M, int N, int K) {
    using namespace r4;
    int clusters = 0;
    CUDA_CHECK(rung4_ready(&clusters));  // cudaErrorNotSupported but on a 9.0 card
    // The tensor maps: A (M rows of K halves) in boxes of BK x BM, B (K rows of N) in boxes of
    // B_COLS x BK, both with 128-byte swizzling. Made at every call (host work only: the driver
    // encodes 128 bytes, nothing reaches the GPU): a map holds the matrix's address and shape, so a
    // cache of them would have to be keyed by both.
    CUtensorMap map_a{}, map_b{};
    const CUtensorMapDataType f16 = CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    const CUtensorMapSwizzle sw128 = CU_TENSOR_MAP_SWIZZLE_128B;
    CUDA_CHECK(course_tensor_map_2d(&map_a, f16, A, K, M, (uint64_t)K * sizeof(half), BK, BM, sw128));
    CUDA_CHECK(course_tensor_map_2d(&map_b, f16, B, N, K, (uint64_t)N * sizeof(half), B_COLS, BK, sw128));
    const int pairs = (((M + BM - 1) / BM + CLUSTER - 1) / CLUSTER) * ((N + BN - 1) / BN);
    cudaLaunchAttribute cluster{};
    cluster.id = cudaLaunchAttributeClusterDimension;  // a launch attribute, not __cluster_dims__: the
    cluster.val.clusterDim.x = CLUSTER;                 // file still compiles for cards before sm_90
    cluster.val.clusterDim.y = 1;
    cluster.val.clusterDim.z = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3((unsigned)(std::min(pairs, clusters) * CLUSTER));
    config.blockDim = dim3(THREADS);
    config.dynamicSmemBytes = SMEM_BYTES;
    config.stream = 0;  // the default stream
    config.attrs = &cluster;
    config.numAttrs = 1;
    const cudaError_t err = cudaLaunchKernelEx(&config, hgemm_tma_wgmma_kernel, map_a, map_b, C, M, N, K);
    return err != cudaSuccess ? err : cudaGetLastError();
}

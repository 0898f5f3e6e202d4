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
            // TODO(lab2/15) end
        }
        __syncwarp();  // the first warp whole again before the cluster barrier below
    } else {  // a consumer warpgroup: 64 rows of the tile, 128 accumulators per thread
        setmaxnreg_inc<CONSUMER_REGS>();
        // TODO(lab2/15) begin: a consumer warpgroup (w = threadIdx.x / WG - 1: rows 64w .. 64w + 63 of the tile): walk the same pairs and steps as the producer, with the same counter; per step wait until the stage is full (mbar_wait on sm.full(s), parity round % 2), wgmma_fence, issue 4 wgmma_m64n256k16 (one per 16 of k; A's descriptor from this warpgroup's rows of sm.a(s) and B's from sm.b(s), both through wgmma_desc_sw128: which byte offsets for a K-major A and an MN-major B, and which TRANS_B?; D = A·B on the tile's first step), wgmma_commit, then wgmma_wait<1> so the previous step's wgmmas are done and lane 0 of each warp releases that step's stage to both CTAs (mbar_arrive_cluster on sm.empty, ranks 0 and 1); after the last step wgmma_wait<0> and release it too; then store the accumulators that lie inside C (two float2 per 8 columns, the layout of wgmma_m64n256k16's comment); see the chapter's tensor-core ladder, rung 4; about 40 lines; try 16x16x16, 304x48x464 and 1040x1296x2112.
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

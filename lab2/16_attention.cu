// Lab 2 · Task 16 — Attention: scores in memory, flash-attention's fused online softmax, then on tensor cores
//
// Implement: the kernels of the chapter's attention ladder. Rung 1, three kernels with the
//            scores in global memory: scores_kernel (S = Q K^T / sqrt(D) for every query and
//            key), softmax_rows_kernel (each row of S turned into probabilities in place, with
//            the causal mask) and pv_kernel (O = P V). Rung 2, one kernel that never stores a
//            score: attention_fused_kernel (one block per head and tile of BR query rows, one
//            thread per query row; tiles of BC keys and values staged in shared memory; a
//            running max, a running sum and the output row kept in registers and rescaled
//            whenever the max grows; key tiles past the diagonal skipped when causal). Rung 3,
//            FlashAttention-2's forward pass on the tensor cores (sm_80 and later), in half
//            precision: attention_mma_kernel, one warp per 16 query rows, and its pieces: scores
//            (S = Q K^T with mma.sync m16n8k16, K's fragments by ldmatrix from swizzled shared
//            memory), mask_scores (the causal and tail mask), online_softmax (on the accumulator
//            registers, the row statistics shared by the 4 lanes of a quad), pack2 and pv (P
//            rounded to the input type and reused in its registers as the A operand of O += P V),
//            and the kernel's two-stage cp.async pipeline over the tiles of K and V. The warp
//            reductions, the block-to-tile mapping, rung 3's PTX wrappers, swizzle, tile copies, Q
//            loads and O stores, and the host code of every rung are given.
// Contract:  Q, K and V are DEVICE tensors of shape (BH, T, D) (BH = batch x heads, T tokens, D
//            the head dimension), contiguous, 16-byte aligned (as cudaMalloc and torch give them),
//            read-only; O, of the same shape and type, is written and overlaps none of them.
//            1 <= BH <= 65535, 1 <= T <= 65535 and BH * T * D < 2^31. causal is 0 or 1.
//            O[b][i] = sum over j of P[b][i][j] V[b][j], with P[b][i][.] = softmax over j of
//            (Q[b][i] . K[b][j] / sqrt(D) + mask[i][j]) and mask[i][j] = -inf where causal and
//            j > i (token i sees tokens 0..i), else 0. Any finite inputs: no overflow for scores in
//            the hundreds. attention_1 and attention_2 take float32 tensors and D = 64 (HEAD_DIM);
//            attention_3 takes float16 (half) and attention_3_bf16 bfloat16 (__nv_bfloat16)
//            tensors and D = 64 or 128. Any other D returns cudaErrorInvalidValue and launches
//            nothing. Rung 3 computes the scores, their scale, the softmax's running max and sum
//            and the products P V in float32 (P itself rounded to the input type, as the operand
//            of the tensor cores), and rounds O to its type once, at the end; below compute
//            capability 8.0 it returns cudaErrorNotSupported. Rung 1 keeps BH * T * T floats of
//            scratch in device memory (a static buffer that grows; 512 MiB at BH = 32, T = 2048)
//            and returns the allocation error when that does not fit. Each entry point launches on
//            the default stream, returns the first error and does not synchronize (except once,
//            when rung 1's scratch grows).
// Test:      make test-lab2 TASK=16

#include "course.h"
#include "course_mma.h"
#include "course_scratch.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

constexpr int HEAD_DIM = 64;                       // D: the only head dimension the entry points accept
[[maybe_unused]] constexpr int D4 = HEAD_DIM / 4;  // float4s per row of Q, K, V and O (rung 2)
constexpr int WARP = 32;
constexpr unsigned FULL = 0xffffffffu;  // every lane of a warp takes part in a shuffle
constexpr float LOG2E = 1.4426950408889634f;

// Rung 1's launch shapes
constexpr int SCORE_COLS = 32, SCORE_ROWS = 8;  // scores_kernel: a block per 8 x 32 patch of S
constexpr int SOFTMAX_THREADS = 256;           // softmax_rows_kernel: one warp per row of S
constexpr int PV_ROWS = 4;                     // pv_kernel: HEAD_DIM x PV_ROWS threads, 4 rows of O

// Rung 2's tiles
namespace fa {
inline constexpr int BR = 64;     // query rows per block = threads per block: one thread per row
inline constexpr int BC = 64;     // keys (and values) per tile staged in shared memory
inline constexpr int CHUNK = 16;  // scores a thread holds in registers at once (BC is a multiple)
}  // namespace fa

// ---------------------------------------------------------------------------------------------
// Given: warp-wide max and sum (the xor butterfly of the softmax ladder: every lane gets the result).
// ---------------------------------------------------------------------------------------------

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int offset = WARP / 2; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(FULL, v, offset));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = WARP / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(FULL, v, offset);
    return v;
}

// ---------------------------------------------------------------------------------------------
// Rung 1 · naive: S = Q K^T * scale into global memory, a softmax over each row of S (in place),
// then O = P V. Three launches, and a T x T matrix per head written twice and read twice.
// ---------------------------------------------------------------------------------------------

// Q, K (BH, T, D) -> S (BH, T, T). Block (SCORE_COLS, SCORE_ROWS) covers S[b][i0..i0+7][j0..j0+31],
// b = blockIdx.z; threadIdx.x runs along the keys j.
__global__ void scores_kernel(const float* __restrict__ Q, const float* __restrict__ K, float* __restrict__ S,
                              int T, float scale) {
    // TODO(lab2/16) begin: S[b][i][j] = scale * (row i of Q[b]) . (row j of K[b]) for the one (i, j) this thread owns, neighbouring lanes on neighbouring keys j (so the warp shares its row of Q and writes 32 neighbouring floats of S), nothing written outside the T x T matrix; offsets in size_t; see the chapter's attention ladder, rung 1; about 10 lines; try BH=1,T=1 and BH=2,T=17.
    // TODO(lab2/16) end
}

// S (BH * T rows, T) -> P in place. One warp per row r = b * T + i; its lanes stride over the row.
__global__ void softmax_rows_kernel(float* __restrict__ S, int rows, int T, int causal) {
    // TODO(lab2/16) begin: row r of S becomes its softmax: the max m of the entries the row may see (columns 0..i when causal, i = r % T, else all T), then d = sum of exp(s - m) over them, then exp(s - m) / d written back and exactly 0 in every column the mask hides; the lanes stride over the row 32 apart and combine with warp_max and warp_sum; a warp past the last row leaves as a whole; see the chapter's attention ladder, rung 1; about 15 lines; try BH=3,T=100 causal and not.
    // TODO(lab2/16) end
}

// P (BH, T, T), V (BH, T, D) -> O (BH, T, D). Block (HEAD_DIM, PV_ROWS): threadIdx.x is the
// column d of O, threadIdx.y one of PV_ROWS query rows; b = blockIdx.y.
__global__ void pv_kernel(const float* __restrict__ P, const float* __restrict__ V, float* __restrict__ O, int T,
                          int causal) {
    // TODO(lab2/16) begin: O[b][i][d] = sum over j of P[b][i][j] * V[b][j][d] for the one (i, d) this thread owns, neighbouring lanes on neighbouring d (the warp shares P's element and reads 32 neighbouring floats of V); P is 0 past the diagonal when causal, so those terms may be skipped; see the chapter's attention ladder, rung 1; about 10 lines; try BH=2,T=17 and BH=3,T=100 causal.
    // TODO(lab2/16) end
}

// ---------------------------------------------------------------------------------------------
// Rung 2 · fused. One block of BR threads per head and tile of BR query rows, one thread per row.
// The thread keeps its query row q (scaled by log2(e) / sqrt(D), so that exp2 gives the softmax's
// exponentials), its output row o, the running max m and the running sum l in registers. For every
// tile of BC keys the block stages K and V in shared memory; each thread takes the tile CHUNK keys
// at a time: CHUNK scores, the new max, o and l rescaled by exp2(m_old - m_new), then o += p v for
// each key. At the end O = o / l. No score ever leaves the thread.
// ---------------------------------------------------------------------------------------------

// Given: the head and the first query row of this block's tile. The blocks go tile-major, last
// tile first: with the causal mask, tile t reads t + 1 tiles of keys, so the longest blocks start
// in the first wave and the short ones fill the gaps behind them.
struct QueryTile {
    int head;  // 0 .. BH - 1
    int row0;  // first query row, a multiple of BR
};

template <int BR>  // query rows per block (rung 3's is a template parameter)
__device__ __forceinline__ QueryTile query_tile_of(int BH, int T) {
    const int tiles = (T + BR - 1) / BR;
    const int t = tiles - 1 - (int)(blockIdx.x / BH);
    return {(int)(blockIdx.x % BH), t * BR};
}

__device__ __forceinline__ QueryTile query_tile(int BH, int T) { return query_tile_of<fa::BR>(BH, T); }

// Q, K, V (BH, T, D) -> O (BH, T, D); qscale = log2(e) / sqrt(D)
__global__ void __launch_bounds__(fa::BR) attention_fused_kernel(const float* __restrict__ Q,
                                                                 const float* __restrict__ K,
                                                                 const float* __restrict__ V, float* __restrict__ O,
                                                                 int BH, int T, int causal, float qscale) {
    // TODO(lab2/16) begin: row row0 + threadIdx.x of O[head] (nothing stored for a row past T, though that thread loads and waits with the others): q, o, m and l in registers; the key tiles from 0 up to T (or, when causal, up to the block's last row: tiles wholly past the diagonal are never loaded), each loaded cooperatively into shared memory (coalesced float4s, zeros past T) between two __syncthreads (the first keeps a fast warp from overwriting a tile others still read); within a tile, per CHUNK keys: the scores (masked to -inf past T and, when causal, past the row), the new max, o and l rescaled to it, p = exp2(s - m), l += p, o += p v; finally O = o / l; see the chapter's attention ladder, rung 2; about 70 lines; try BH=1,T=1, BH=2,T=17, BH=3,T=100 causal and the large-input case, and run the sanitizer (racecheck).
    // TODO(lab2/16) end
}

// ---------------------------------------------------------------------------------------------
// Rung 3 · tensor cores: FlashAttention-2's forward pass (sm_80 and later). Q, K, V and O in half
// precision, E = half (float16) or __nv_bfloat16, D = 64 or 128. One block of WARPS warps per
// head and tile of BR = 16 * WARPS query rows; warp w owns rows 16 w .. 16 w + 15 of the tile and
// keeps their Q fragments, their output accumulators and their softmax statistics in registers.
// Per tile of BC keys: S = Q K^T with mma.sync m16n8k16 (float accumulators), the mask, the online
// softmax on S's accumulator registers, P rounded to E and reused in place as the A operand of
// O += P V. K and V come through a two-stage cp.async pipeline into XOR-swizzled shared memory.
// ---------------------------------------------------------------------------------------------

// Rung 3's shape for head dimension D_: given, because the host code launches with it.
template <int D_, int WARPS_ = 4, int BC_ = 64, int MINB_ = 2>
struct Flash {
    static constexpr int D = D_;                 // head dimension
    static constexpr int WARPS = WARPS_;         // warps per block, 16 query rows each
    static constexpr int BR = 16 * WARPS;        // query rows per block
    static constexpr int BC = BC_;               // keys per K and V tile
    static constexpr int THREADS = WARPS * WARP;
    static constexpr int CPR = D / 8;            // 16-byte chunks (8 elements) per row of K or V
    static constexpr int KD = D / 16;            // k slices of S = Q K^T, 16 of d each
    static constexpr int NS = BC / 8;            // n8 tiles of a warp's S (8 keys each)
    static constexpr int NO = D / 8;             // n8 tiles of a warp's O (8 of d each)
    static constexpr int TILE = BC * D;          // elements of one K or V tile
    static constexpr int SMEM_BYTES = 2 * 2 * TILE * 2;  // two stages of K and V, 2 bytes an element
    // blocks an SM must be able to hold at once (__launch_bounds__): occupancy traded for registers
    static constexpr int MIN_BLOCKS = MINB_;
    static_assert(D % 16 == 0 && BC % 16 == 0 && CPR >= 8, "whole mma slices; rows of at least 128 bytes");
    static_assert(BC * CPR % THREADS == 0, "every thread copies as many chunks of a tile");
};

// ---------------------------------------------------------------------------------------------
// Given to rung 3: the swizzle and the PTX of task 15's rung 3 (course_mma.h, grader/include), the
// mma for both types, and the loads and stores that are not the lesson. The instructions exist from sm_80 on (ldmatrix from
// sm_75); for an older target they compile to nothing and attention_3 refuses to launch.
// ---------------------------------------------------------------------------------------------

// d = a · b + d for one 16 x 8 tile, k = 16, with elements of type E (half or __nv_bfloat16): A
// 16 x 16 (row-major fragment, four registers of two elements), B 16 x 8 (the .col fragment, two
// registers), d four floats. With g = lane / 4 and t = lane % 4: a[0] = A[g][2t, 2t+1],
// a[1] = A[g+8][2t, 2t+1], a[2] = A[g][2t+8, 2t+9], a[3] = A[g+8][2t+8, 2t+9];
// b[0] = B[2t, 2t+1][g], b[1] = B[2t+8, 2t+9][g]; d[0], d[1] = D[g][2t, 2t+1],
// d[2], d[3] = D[g+8][2t, 2t+1]. In each register the element of the lower column (or row, for B)
// is in the low 16 bits. Warp-collective: all 32 lanes.
template <typename E>
__device__ __forceinline__ void mma_m16n8k16(float* d, const uint32_t* a, const uint32_t* b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (std::is_same_v<E, half>) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    } else {
        static_assert(std::is_same_v<E, __nv_bfloat16>, "rung 3 takes half or __nv_bfloat16");
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
#endif
}

// Keys k0 .. k0 + BC - 1 of one head's K and V (rows of D elements) into one stage, Ks and Vs, each
// BC rows of CPR chunks laid out by swizzle<CPR>. Consecutive threads take consecutive chunks of a
// row (coalesced): thread i copies chunk i % CPR of rows i / CPR + n ROWS. ROWS is a multiple of 8,
// so all of a thread's chunks keep the swizzle of its first: their places, like their sources, lie
// a constant distance apart. A key at or past T gets zeros (src_bytes 0, the source kept a valid
// address): its score is masked anyway, but its row of V is multiplied by p = 0, and 0 times
// whatever shared memory held may be NaN.
template <typename F, typename E>
__device__ __forceinline__ void load_kv_tile(E* Ks, E* Vs, const E* K, const E* V, int k0, int T) {
    constexpr int ROWS = F::THREADS / F::CPR;  // rows one pass of the block copies
    static_assert(ROWS % 8 == 0 && F::BC % ROWS == 0, "whole passes that keep the swizzle");
    const int row = (int)threadIdx.x / F::CPR, chunk = (int)threadIdx.x % F::CPR;
    const int dst = swizzle<F::CPR>(row, chunk);
    const size_t src = (size_t)(k0 + row) * F::D + chunk * 8;
#pragma unroll
    for (int n = 0; n < F::BC / ROWS; ++n) {
        const bool inside = k0 + row + n * ROWS < T;
        cp_async_16(Ks + dst + n * ROWS * F::D, inside ? K + src + n * ROWS * F::D : K, inside ? 16 : 0);
        cp_async_16(Vs + dst + n * ROWS * F::D, inside ? V + src + n * ROWS * F::D : V, inside ? 16 : 0);
    }
}

// The warp's 16 rows of Q as mma.sync A fragments, read once straight from global memory (each row
// is read by one block only): for slice kk (d = 16 kk .. 16 kk + 15), lane (g, t) holds
// Q[r][16kk + 2t, +1], Q[r + 8][16kk + 2t, +1], Q[r][16kk + 8 + 2t, +1] and Q[r + 8][16kk + 8 + 2t, +1],
// r = the warp's first row + g. Q points at the head's first row; rows at or past T are zeros.
template <typename F, typename E>
__device__ __forceinline__ void load_q_fragments(uint32_t (&qf)[F::KD][4], const E* Q, int r, int T) {
    const int t = (int)threadIdx.x % 4;
    const bool in0 = r < T, in8 = r + 8 < T;
    const uint32_t* q0 = reinterpret_cast<const uint32_t*>(Q + (size_t)(in0 ? r : 0) * F::D + 2 * t);
    const uint32_t* q8 = reinterpret_cast<const uint32_t*>(Q + (size_t)(in8 ? r + 8 : 0) * F::D + 2 * t);
#pragma unroll
    for (int kk = 0; kk < F::KD; ++kk) {  // a register is 2 elements: column 16 kk is word 8 kk
        qf[kk][0] = in0 ? __ldg(q0 + 8 * kk) : 0u;
        qf[kk][1] = in8 ? __ldg(q8 + 8 * kk) : 0u;
        qf[kk][2] = in0 ? __ldg(q0 + 8 * kk + 4) : 0u;
        qf[kk][3] = in8 ? __ldg(q8 + 8 * kk + 4) : 0u;
    }
}

template <typename E>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);

// Rows r and r + 8 of O from the warp's accumulators: lane (g, t) holds O[r][8n + 2t, +1] in
// o[n][0..1] and O[r + 8][8n + 2t, +1] in o[n][2..3]. Each pair is multiplied by its row's 1 / l,
// rounded to E with pack2 and stored as one 32-bit word. O points at the head's first row; rows at
// or past T are not stored.
template <typename F, typename E>
__device__ __forceinline__ void store_o(E* O, const float (&o)[F::NO][4], float inv0, float inv8, int r, int T) {
    const int t = (int)threadIdx.x % 4;
#pragma unroll
    for (int n = 0; n < F::NO; ++n) {
        const int col = 8 * n + 2 * t;
        if (r < T) *reinterpret_cast<uint32_t*>(O + (size_t)r * F::D + col) = pack2<E>(o[n][0] * inv0, o[n][1] * inv0);
        if (r + 8 < T)
            *reinterpret_cast<uint32_t*>(O + (size_t)(r + 8) * F::D + col) = pack2<E>(o[n][2] * inv8, o[n][3] * inv8);
    }
}

// ---------------------------------------------------------------------------------------------
// Rung 3's pieces. In all of them a warp works on its 16 query rows; lane (g, t) = (lane / 4,
// lane % 4) holds, of every 16 x 8 accumulator tile, row g in elements [0], [1] (columns 2t, 2t+1)
// and row g + 8 in [2], [3]: the 4 lanes of a quad (same g) share two rows.
// ---------------------------------------------------------------------------------------------

// Two floats as one register of two E's, each rounded to nearest: lo in the low 16 bits.
template <typename E>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
    // TODO(lab2/16) begin: lo and hi rounded to E (half or __nv_bfloat16), lo in the low 16 bits; see the chapter's attention ladder, rung 3; about 8 lines.
    return 0u;  //~
    // TODO(lab2/16) end
}

// s = the warp's 16 x BC tile of S = Q K^T (raw dot products, not yet scaled): s[j] is the 16 x 8
// accumulator tile of keys 8j .. 8j + 7 of the stage Ks.
template <typename F, typename E>
__device__ __forceinline__ void scores(float (&s)[F::NS][4], const uint32_t (&qf)[F::KD][4], const E* Ks) {
    // TODO(lab2/16) begin: s = 0, then per slice of 16 of d and per 16 keys one ldmatrix_x4 of K's fragments from the swizzled stage and two mma_m16n8k16<E>; see the chapter's attention ladder, rung 3; about 15 lines.
    // TODO(lab2/16) end
}

// -inf for the scores a query must not see in the tile of keys k0 .. k0 + BC - 1: keys at or past T,
// and, when causal, keys past the query's own row. r is the row of this lane's s[.][0..1] (r + 8
// that of s[.][2..3]). The kernel calls it only for the tiles that need it.
template <typename F>
__device__ __forceinline__ void mask_scores(float (&s)[F::NS][4], int k0, int r, int T, int causal) {
    // TODO(lab2/16) begin: -INFINITY for each of this lane's scores whose key is at or past T or, when causal, past its query's row; see the chapter's attention ladder, rung 3; about 8 lines.
    // TODO(lab2/16) end
}

// One tile's online-softmax step for rows r and r + 8 (h = 0 and 1). Turns the scores s into
// p = exp2(s c - m_new) in place, c = log2(e) / sqrt(D), m_new the running max (log2 units) over
// the keys seen so far; rescales l (this lane's part of the row's sum) and the output accumulators
// o by exp2(m - m_new) before l takes the new terms; m becomes m_new.
template <typename F>
__device__ __forceinline__ void online_softmax(float (&s)[F::NS][4], float (&m)[2], float (&l)[2],
                                               float (&o)[F::NO][4], float c) {
    // TODO(lab2/16) begin: per row: the tile's max over the quad, the new running max, l and o rescaled to it, p = exp2 in place of s and added to l; see the chapter's attention ladder, rung 3; about 20 lines.
    // TODO(lab2/16) end
}

// o += P V for one tile: P (16 x BC) is the warp's S accumulators after online_softmax, and
// becomes the A operand of mma.sync without leaving the registers; V's fragments come from the
// stage Vs.
template <typename F, typename E>
__device__ __forceinline__ void pv(float (&o)[F::NO][4], const float (&p)[F::NS][4], const E* Vs) {
    // TODO(lab2/16) begin: P's accumulators repacked with pack2 as A fragments, V's fragments from the swizzled stage, o += P V with mma_m16n8k16<E>; see the chapter's attention ladder, rung 3; about 15 lines.
    // TODO(lab2/16) end
}

// Q, K, V (BH, T, D) -> O (BH, T, D), all of type E. F::THREADS threads per block and
// F::SMEM_BYTES of dynamic shared memory: stages 0 and 1 of K's tile, then of V's.
template <typename E, typename F>
__global__ void __launch_bounds__(F::THREADS, F::MIN_BLOCKS)
    attention_mma_kernel(const E* __restrict__ Q, const E* __restrict__ K, const E* __restrict__ V, E* __restrict__ O,
                         int BH, int T, int causal) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    // No mma.sync m16n8k16 or cp.async before sm_80: an empty kernel, which attention_3 never launches.
#else
    // TODO(lab2/16) begin: the warp's Q fragments and its o, m and l; the key tiles (up to the block's last row when causal) through a two-stage cp.async pipeline; per tile scores, mask_scores where a tile needs it, online_softmax and pv; at the end O = o / l; see the chapter's attention ladder, rung 3; about 35 lines; try BH=1,T=1, BH=2,T=17 causal and BH=3,T=100, and run the sanitizer (racecheck).
    // TODO(lab2/16) end
#endif
}

// ---------------------------------------------------------------------------------------------
// The host side, given.
// ---------------------------------------------------------------------------------------------

// Rung 1's scores live in the scratch buffer of course_scratch.h, kept from call to call and
// grown when a larger BH * T * T needs more, so the timed calls pay for no cudaMalloc.

COURSE_API cudaError_t attention_1(const float* Q, const float* K, const float* V, float* O, int BH, int T, int D,
                                   int causal) {
    if (D != HEAD_DIM) return cudaErrorInvalidValue;
    float* S = nullptr;  // (BH, T, T)
    CUDA_CHECK(scratch((size_t)BH * T * T, &S));
    const float scale = 1.0f / sqrtf((float)HEAD_DIM);
    const dim3 score_grid((T + SCORE_COLS - 1) / SCORE_COLS, (T + SCORE_ROWS - 1) / SCORE_ROWS, BH);
    scores_kernel<<<score_grid, dim3(SCORE_COLS, SCORE_ROWS)>>>(Q, K, S, T, scale);
    CUDA_CHECK(cudaGetLastError());
    const int rows = BH * T, rows_per_block = SOFTMAX_THREADS / WARP;
    softmax_rows_kernel<<<(rows + rows_per_block - 1) / rows_per_block, SOFTMAX_THREADS>>>(S, rows, T, causal);
    CUDA_CHECK(cudaGetLastError());
    pv_kernel<<<dim3((T + PV_ROWS - 1) / PV_ROWS, BH), dim3(HEAD_DIM, PV_ROWS)>>>(S, V, O, T, causal);
    return cudaGetLastError();
}

COURSE_API cudaError_t attention_2(const float* Q, const float* K, const float* V, float* O, int BH, int T, int D,
                                   int causal) {
    if (D != HEAD_DIM) return cudaErrorInvalidValue;
    const unsigned tiles = (unsigned)(T + fa::BR - 1) / fa::BR;
    const float qscale = LOG2E / sqrtf((float)HEAD_DIM);
    attention_fused_kernel<<<(unsigned)BH * tiles, fa::BR>>>(Q, K, V, O, BH, T, causal, qscale);
    return cudaGetLastError();
}

template <typename E, typename F>
static cudaError_t launch_rung3(const E* Q, const E* K, const E* V, E* O, int BH, int T, int causal) {
    // cudaErrorNotSupported before sm_80; the kernel's opt-in to 64 KiB for D = 128 (course_mma.h)
    CUDA_CHECK((tensor_core_kernel_ready<attention_mma_kernel<E, F>>(F::SMEM_BYTES)));
    const unsigned tiles = (unsigned)(T + F::BR - 1) / F::BR;
    attention_mma_kernel<E, F><<<(unsigned)BH * tiles, F::THREADS, F::SMEM_BYTES>>>(Q, K, V, O, BH, T, causal);
    return cudaGetLastError();
}

// The dispatch on D: one instantiation of the kernel per head dimension (its loops unroll over D).
template <typename E>
static cudaError_t rung3(const E* Q, const E* K, const E* V, E* O, int BH, int T, int D, int causal) {
    if (D == 64) return launch_rung3<E, Flash<64, 4, 64, 3>>(Q, K, V, O, BH, T, causal);
    if (D == 128) return launch_rung3<E, Flash<128>>(Q, K, V, O, BH, T, causal);
    return cudaErrorInvalidValue;
}

COURSE_API cudaError_t attention_3(const half* Q, const half* K, const half* V, half* O, int BH, int T, int D,
                                   int causal) {
    return rung3(Q, K, V, O, BH, T, D, causal);
}

COURSE_API cudaError_t attention_3_bf16(const __nv_bfloat16* Q, const __nv_bfloat16* K, const __nv_bfloat16* V,
                                        __nv_bfloat16* O, int BH, int T, int D, int causal) {
    return rung3(Q, K, V, O, BH, T, D, causal);
}

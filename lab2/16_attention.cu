// Lab 2 · Task 16 — Attention: scores in memory, then flash-attention's fused online softmax
//
// Implement: the kernels of the chapter's attention ladder. Rung 1, three kernels with the
//            scores in global memory: scores_kernel (S = Q K^T / sqrt(D) for every query and
//            key), softmax_rows_kernel (each row of S turned into probabilities in place, with
//            the causal mask) and pv_kernel (O = P V). Rung 2, one kernel that never stores a
//            score: attention_fused_kernel (one block per head and tile of BR query rows, one
//            thread per query row; tiles of BC keys and values staged in shared memory; a
//            running max, a running sum and the output row kept in registers and rescaled
//            whenever the max grows; key tiles past the diagonal skipped when causal). The warp
//            reductions, the block-to-tile mapping and the host code of both rungs are given.
// Contract:  Q, K and V are DEVICE float32 tensors of shape (BH, T, D) (BH = batch x heads, T
//            tokens, D the head dimension), contiguous, 16-byte aligned (as cudaMalloc and
//            torch give them), read-only; O, of the same shape, is written and overlaps none of
//            them. D must be 64 (HEAD_DIM; any other value returns cudaErrorInvalidValue and
//            launches nothing). 1 <= BH <= 65535, 1 <= T <= 65535 and BH * T * D < 2^31.
//            causal is 0 or 1. O[b][i] = sum over j of P[b][i][j] V[b][j], with
//            P[b][i][.] = softmax over j of (Q[b][i] . K[b][j] / sqrt(D) + mask[i][j]) and
//            mask[i][j] = -inf where causal and j > i (token i sees tokens 0..i), else 0. Any
//            finite inputs: no overflow for scores in the hundreds. Rung 1 keeps BH * T * T floats
//            of scratch in device memory (a static buffer that grows; 512 MiB at BH = 32,
//            T = 2048) and returns the allocation error when that does not fit. Each entry point
//            launches on the default stream, returns the first error and does not synchronize
//            (except once, when rung 1's scratch grows).
// Test:      make test-lab2 TASK=16

#include "course.h"
#include "course_scratch.h"

#include <cmath>
#include <cstddef>

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

__device__ __forceinline__ QueryTile query_tile(int BH, int T) {
    const int tiles = (T + fa::BR - 1) / fa::BR;
    const int t = tiles - 1 - (int)(blockIdx.x / BH);
    return {(int)(blockIdx.x % BH), t * fa::BR};
}

// Q, K, V (BH, T, D) -> O (BH, T, D); qscale = log2(e) / sqrt(D)
__global__ void __launch_bounds__(fa::BR) attention_fused_kernel(const float* __restrict__ Q,
                                                                 const float* __restrict__ K,
                                                                 const float* __restrict__ V, float* __restrict__ O,
                                                                 int BH, int T, int causal, float qscale) {
    // TODO(lab2/16) begin: row row0 + threadIdx.x of O[head] (nothing stored for a row past T, though that thread loads and waits with the others): q, o, m and l in registers; the key tiles from 0 up to T (or, when causal, up to the block's last row: tiles wholly past the diagonal are never loaded), each loaded cooperatively into shared memory (coalesced float4s, zeros past T) between two __syncthreads (the first keeps a fast warp from overwriting a tile others still read); within a tile, per CHUNK keys: the scores (masked to -inf past T and, when causal, past the row), the new max, o and l rescaled to it, p = exp2(s - m), l += p, o += p v; finally O = o / l; see the chapter's attention ladder, rung 2; about 70 lines; try BH=1,T=1, BH=2,T=17, BH=3,T=100 causal and the large-input case, and run the sanitizer (racecheck).
    // TODO(lab2/16) end
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

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
    const int j = blockIdx.x * blockDim.x + threadIdx.x;  // key
    const int i = blockIdx.y * blockDim.y + threadIdx.y;  // query
    if (i >= T || j >= T) return;
    const size_t head = (size_t)blockIdx.z * T;
    const float* q = Q + (head + i) * HEAD_DIM;  // (D,)
    const float* k = K + (head + j) * HEAD_DIM;  // (D,)
    float acc = 0.0f;
#pragma unroll 16
    for (int d = 0; d < HEAD_DIM; ++d) acc = fmaf(q[d], k[d], acc);
    S[(head + i) * T + j] = acc * scale;
    // TODO(lab2/16) end
}

// S (BH * T rows, T) -> P in place. One warp per row r = b * T + i; its lanes stride over the row.
__global__ void softmax_rows_kernel(float* __restrict__ S, int rows, int T, int causal) {
    // TODO(lab2/16) begin: row r of S becomes its softmax: the max m of the entries the row may see (columns 0..i when causal, i = r % T, else all T), then d = sum of exp(s - m) over them, then exp(s - m) / d written back and exactly 0 in every column the mask hides; the lanes stride over the row 32 apart and combine with warp_max and warp_sum; a warp past the last row leaves as a whole; see the chapter's attention ladder, rung 1; about 15 lines; try BH=3,T=100 causal and not.
    const int lane = threadIdx.x % WARP;
    const int r = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (r >= rows) return;  // the same r for the 32 lanes: whole warps leave, the shuffles stay full
    float* s = S + (size_t)r * T;  // (T,)
    const int seen = causal ? r % T + 1 : T;  // columns 0 .. seen - 1 take part
    float m = -INFINITY;
    for (int j = lane; j < seen; j += WARP) m = fmaxf(m, s[j]);
    m = warp_max(m);
    float d = 0.0f;
    for (int j = lane; j < seen; j += WARP) d += expf(s[j] - m);
    const float inv = 1.0f / warp_sum(d);
    for (int j = lane; j < T; j += WARP) s[j] = j < seen ? expf(s[j] - m) * inv : 0.0f;
    // TODO(lab2/16) end
}

// P (BH, T, T), V (BH, T, D) -> O (BH, T, D). Block (HEAD_DIM, PV_ROWS): threadIdx.x is the
// column d of O, threadIdx.y one of PV_ROWS query rows; b = blockIdx.y.
__global__ void pv_kernel(const float* __restrict__ P, const float* __restrict__ V, float* __restrict__ O, int T,
                          int causal) {
    // TODO(lab2/16) begin: O[b][i][d] = sum over j of P[b][i][j] * V[b][j][d] for the one (i, d) this thread owns, neighbouring lanes on neighbouring d (the warp shares P's element and reads 32 neighbouring floats of V); P is 0 past the diagonal when causal, so those terms may be skipped; see the chapter's attention ladder, rung 1; about 10 lines; try BH=2,T=17 and BH=3,T=100 causal.
    const int d = threadIdx.x;
    const int i = blockIdx.x * blockDim.y + threadIdx.y;
    if (i >= T) return;
    const size_t head = (size_t)blockIdx.y * T;
    const float* p = P + (head + i) * T;  // (T,) row i of P
    const float* v = V + head * HEAD_DIM + d;  // column d of V[b], HEAD_DIM floats between rows
    const int seen = causal ? i + 1 : T;
    float acc = 0.0f;
    for (int j = 0; j < seen; ++j) acc = fmaf(p[j], v[(size_t)j * HEAD_DIM], acc);
    O[(head + i) * HEAD_DIM + d] = acc;
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
    using namespace fa;
    __shared__ float4 Ks[BC][D4];  // Ks[j][.] = row k0 + j of K[head]
    __shared__ float4 Vs[BC][D4];  // Vs[j][.] = row k0 + j of V[head]
    const QueryTile tile = query_tile(BH, T);
    const int row = tile.row0 + threadIdx.x;
    const size_t head = (size_t)tile.head * T * D4;  // in float4s
    const float4* K4 = reinterpret_cast<const float4*>(K) + head;
    const float4* V4 = reinterpret_cast<const float4*>(V) + head;

    float q[HEAD_DIM];  // (D,) this thread's query row, times qscale
    if (row < T) {
        const float4* qr = reinterpret_cast<const float4*>(Q) + head + (size_t)row * D4;
#pragma unroll
        for (int c = 0; c < D4; ++c) {
            const float4 v = qr[c];
            q[4 * c] = v.x * qscale;
            q[4 * c + 1] = v.y * qscale;
            q[4 * c + 2] = v.z * qscale;
            q[4 * c + 3] = v.w * qscale;
        }
    } else {
#pragma unroll
        for (int d = 0; d < HEAD_DIM; ++d) q[d] = 0.0f;
    }
    float o[HEAD_DIM];  // (D,) sum over the keys so far of exp2(s - m) * v
#pragma unroll
    for (int d = 0; d < HEAD_DIM; ++d) o[d] = 0.0f;
    float m = -INFINITY;  // the largest score so far (log2 units)
    float l = 0.0f;       // sum over the keys so far of exp2(s - m)

    const int last = causal ? min(row, T - 1) : T - 1;     // the last key this row sees
    const int keys = causal ? min(T, tile.row0 + BR) : T;  // the keys any row of the block sees
    for (int k0 = 0; k0 < keys; k0 += BC) {
        __syncthreads();  // every warp is done with the previous tile before it is overwritten
#pragma unroll 4
        for (int n = 0; n < BC * D4 / BR; ++n) {  // 16 float4s of K and 16 of V per thread
            const int e = n * BR + threadIdx.x;    // a warp loads 2 whole rows: coalesced
            const int j = e / D4, c = e % D4;
            const bool inside = k0 + j < T;
            // zeros past T: a masked key gets p = 0, and 0 * (whatever shared memory held) could be NaN
            Ks[j][c] = inside ? K4[(size_t)(k0 + j) * D4 + c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            Vs[j][c] = inside ? V4[(size_t)(k0 + j) * D4 + c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        __syncthreads();  // the tile is complete before anyone reads it

        // A chunk starts at a key this row sees, so its max, and m, are finite from the first one on.
        for (int c0 = 0; c0 < BC && k0 + c0 <= last; c0 += CHUNK) {
            float s[CHUNK];  // scores of keys k0 + c0 .. k0 + c0 + CHUNK - 1, log2 units
#pragma unroll
            for (int j = 0; j < CHUNK; ++j) {
                // four partial sums, over d = 0, 4, 8, ..., d = 1, 5, 9, ... and so on: four
                // independent chains of 16 FMAs instead of one chain of 64 that waits on itself
                float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
                for (int c = 0; c < D4; ++c) {
                    const float4 k = Ks[c0 + j][c];  // the same address in every lane: a broadcast
                    acc.x = fmaf(q[4 * c], k.x, acc.x);
                    acc.y = fmaf(q[4 * c + 1], k.y, acc.y);
                    acc.z = fmaf(q[4 * c + 2], k.z, acc.z);
                    acc.w = fmaf(q[4 * c + 3], k.w, acc.w);
                }
                s[j] = (acc.x + acc.y) + (acc.z + acc.w);
            }
            float m_new = m;
#pragma unroll
            for (int j = 0; j < CHUNK; ++j) {
                if (k0 + c0 + j > last) s[j] = -INFINITY;  // past T, or past the row when causal
                m_new = fmaxf(m_new, s[j]);
            }
            const float alpha = exp2f(m - m_new);  // 1 when the max did not grow; 0 on the first chunk
            l *= alpha;  // the sum so far, rescaled to the new max
#pragma unroll
            for (int d = 0; d < HEAD_DIM; ++d) o[d] *= alpha;
#pragma unroll
            for (int j = 0; j < CHUNK; ++j) {
                const float p = exp2f(s[j] - m_new);  // 0 for a masked key
                l += p;
#pragma unroll
                for (int c = 0; c < D4; ++c) {
                    const float4 v = Vs[c0 + j][c];
                    o[4 * c] = fmaf(p, v.x, o[4 * c]);
                    o[4 * c + 1] = fmaf(p, v.y, o[4 * c + 1]);
                    o[4 * c + 2] = fmaf(p, v.z, o[4 * c + 2]);
                    o[4 * c + 3] = fmaf(p, v.w, o[4 * c + 3]);
                }
            }
            m = m_new;
        }
    }

    if (row < T) {
        const float inv = 1.0f / l;  // l >= 1: the largest term of the sum is exp2(0)
        float4* out = reinterpret_cast<float4*>(O) + head + (size_t)row * D4;
#pragma unroll
        for (int c = 0; c < D4; ++c)
            out[c] = make_float4(o[4 * c] * inv, o[4 * c + 1] * inv, o[4 * c + 2] * inv, o[4 * c + 3] * inv);
    }
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
    if constexpr (std::is_same_v<E, half>) {
        const half2 v = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<const uint32_t*>(&v);
    } else {
        const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<const uint32_t*>(&v);
    }
    //~ return 0u;
    // TODO(lab2/16) end
}

// s = the warp's 16 x BC tile of S = Q K^T (raw dot products, not yet scaled): s[j] is the 16 x 8
// accumulator tile of keys 8j .. 8j + 7 of the stage Ks.
template <typename F, typename E>
__device__ __forceinline__ void scores(float (&s)[F::NS][4], const uint32_t (&qf)[F::KD][4], const E* Ks) {
    // TODO(lab2/16) begin: s = 0, then per slice of 16 of d and per 16 keys one ldmatrix_x4 of K's fragments from the swizzled stage and two mma_m16n8k16<E>; see the chapter's attention ladder, rung 3; about 15 lines.
    const int lane = (int)threadIdx.x % WARP;
#pragma unroll
    for (int j = 0; j < F::NS; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
    // K^T's .col fragment wants pairs of consecutive d for one key: that is a row of Ks, read as it
    // is stored (no .trans). Lanes 0-7 and 8-15 point at keys 0-7 of the pair of n8 tiles, at the
    // slice's first and second chunk of d (b[0] and b[1] of the first tile), lanes 16-31 at keys 8-15.
    const int krow = (lane & 7) + ((lane >> 4) << 3), kchunk = (lane >> 3) & 1;
#pragma unroll
    for (int kk = 0; kk < F::KD; ++kk) {
#pragma unroll
        for (int j = 0; j < F::NS; j += 2) {
            uint32_t kf[4];
            ldmatrix_x4(kf, Ks + swizzle<F::CPR>(8 * j + krow, 2 * kk + kchunk));
            mma_m16n8k16<E>(s[j], qf[kk], kf);
            mma_m16n8k16<E>(s[j + 1], qf[kk], kf + 2);
        }
    }
    // TODO(lab2/16) end
}

// -inf for the scores a query must not see in the tile of keys k0 .. k0 + BC - 1: keys at or past T,
// and, when causal, keys past the query's own row. r is the row of this lane's s[.][0..1] (r + 8
// that of s[.][2..3]). The kernel calls it only for the tiles that need it.
template <typename F>
__device__ __forceinline__ void mask_scores(float (&s)[F::NS][4], int k0, int r, int T, int causal) {
    // TODO(lab2/16) begin: -INFINITY for each of this lane's scores whose key is at or past T or, when causal, past its query's row; see the chapter's attention ladder, rung 3; about 8 lines.
    const int t = (int)threadIdx.x % 4;
#pragma unroll
    for (int j = 0; j < F::NS; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int key = k0 + 8 * j + 2 * t + e;
            if (key >= T || (causal && key > r)) s[j][e] = -INFINITY;
            if (key >= T || (causal && key > r + 8)) s[j][2 + e] = -INFINITY;
        }
    }
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
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < F::NS; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * h], s[j][2 * h + 1]));
        // the row's other columns are in the 3 other lanes of the quad
        mx = fmaxf(mx, __shfl_xor_sync(FULL, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(FULL, mx, 2));
        // finite from the first tile on: every row sees key 0 there (c > 0, so the max commutes)
        const float m_new = fmaxf(m[h], mx * c);
        const float alpha = exp2f(m[h] - m_new);  // 0 on the first tile (m = -inf); 1 when the max did not grow
        l[h] *= alpha;
#pragma unroll
        for (int n = 0; n < F::NO; ++n) o[n][2 * h] *= alpha, o[n][2 * h + 1] *= alpha;  // the accumulators too
#pragma unroll
        for (int j = 0; j < F::NS; ++j) {
            s[j][2 * h] = exp2f(fmaf(s[j][2 * h], c, -m_new));  // 0 for a masked score
            s[j][2 * h + 1] = exp2f(fmaf(s[j][2 * h + 1], c, -m_new));
            l[h] += s[j][2 * h] + s[j][2 * h + 1];
        }
        m[h] = m_new;
    }
    // TODO(lab2/16) end
}

// o += P V for one tile: P (16 x BC) is the warp's S accumulators after online_softmax, and
// becomes the A operand of mma.sync without leaving the registers; V's fragments come from the
// stage Vs.
template <typename F, typename E>
__device__ __forceinline__ void pv(float (&o)[F::NO][4], const float (&p)[F::NS][4], const E* Vs) {
    // TODO(lab2/16) begin: P's accumulators repacked with pack2 as A fragments, V's fragments from the swizzled stage, o += P V with mma_m16n8k16<E>; see the chapter's attention ladder, rung 3; about 15 lines.
    const int lane = (int)threadIdx.x % WARP;
#pragma unroll
    for (int kk = 0; kk < F::BC / 16; ++kk) {  // keys 16 kk .. 16 kk + 15: S's n8 tiles 2 kk and 2 kk + 1
        // a[0]: row g, keys 2t, 2t+1 of the slice = tile 2 kk's [0], [1]; a[1]: row g + 8, its [2], [3];
        // a[2] and a[3]: the same of tile 2 kk + 1 (keys 8 + 2t, 9 + 2t)
        const uint32_t a[4] = {pack2<E>(p[2 * kk][0], p[2 * kk][1]), pack2<E>(p[2 * kk][2], p[2 * kk][3]),
                               pack2<E>(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                               pack2<E>(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
        for (int n = 0; n < F::NO; n += 2) {
            uint32_t vf[4];  // keys 0-7 and 8-15 of d chunk n (lanes 0-15), then of chunk n + 1 (lanes 16-31)
            ldmatrix_x4_trans(vf, Vs + swizzle<F::CPR>(16 * kk + lane % 16, n + lane / 16));
            mma_m16n8k16<E>(o[n], a, vf);
            mma_m16n8k16<E>(o[n + 1], a, vf + 2);
        }
    }
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
    extern __shared__ __align__(128) unsigned char smem_bytes[];
    E* const Ks = reinterpret_cast<E*>(smem_bytes);  // stage s: Ks + s * F::TILE
    E* const Vs = Ks + 2 * F::TILE;                   // stage s: Vs + s * F::TILE
    const QueryTile tile = query_tile_of<F::BR>(BH, T);
    const int wrow = tile.row0 + 16 * ((int)threadIdx.x / WARP);  // the warp's first query row
    const int r = wrow + (int)threadIdx.x % WARP / 4;             // this lane's rows: r and r + 8
    const size_t head = (size_t)tile.head * T * F::D;
    Q += head, K += head, V += head, O += head;

    uint32_t qf[F::KD][4];
    load_q_fragments<F>(qf, Q, r, T);
    float o[F::NO][4] = {};
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const float c = LOG2E / sqrtf((float)F::D);  // exp(x / sqrt(D)) = exp2(x c)

    const int keys = causal ? min(T, tile.row0 + F::BR) : T;  // the keys any row of the block sees
    const int tiles = (keys + F::BC - 1) / F::BC;
    load_kv_tile<F>(Ks, Vs, K, V, 0, T);
    cp_async_commit();
    for (int j = 0; j < tiles; ++j) {
        // Tile j's group is the only one this thread has in flight. After the wait its copies have
        // landed; after the barrier everyone's have, and every warp is done with tile j - 1, whose
        // stage the next copies overwrite.
        cp_async_wait<0>();
        __syncthreads();
        if (j + 1 < tiles) {
            const int next = (j + 1) % 2;
            load_kv_tile<F>(Ks + next * F::TILE, Vs + next * F::TILE, K, V, (j + 1) * F::BC, T);
            cp_async_commit();
        }
        const int k0 = j * F::BC;
        float s[F::NS][4];
        scores<F>(s, qf, Ks + (j % 2) * F::TILE);
        if (k0 + F::BC > T || (causal && k0 + F::BC - 1 > wrow)) mask_scores<F>(s, k0, r, T, causal);
        online_softmax<F>(s, m, l, o, c);
        pv<F>(o, s, Vs + (j % 2) * F::TILE);
    }

#pragma unroll
    for (int h = 0; h < 2; ++h) {  // each lane of the quad added its quarter of the row's columns
        l[h] += __shfl_xor_sync(FULL, l[h], 1);
        l[h] += __shfl_xor_sync(FULL, l[h], 2);
    }
    store_o<F>(O, o, 1.0f / l[0], 1.0f / l[1], r, T);  // l >= 1: the row's largest term is exp2(0)
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

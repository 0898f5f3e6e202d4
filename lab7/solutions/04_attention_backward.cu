// Lab 7 · Task 04 — Flash attention's backward pass: the scores recomputed from the saved log-sum-exp
//
// Implement: attention_backward_f16 and attention_backward_bf16: the gradients dQ, dK and dV of
//            O = softmax(Q Kᵀ / sqrt(D) + mask) V for every head, given dO, as FlashAttention-2's
//            backward pass does it on the tensor cores (sm_80 and later): never a T x T matrix in
//            memory. Three launches on `stream`: prep_kernel (Delta = rowsum(dO * O) per query,
//            and dQ32 zeroed), attention_backward_kernel (one block per head and tile of BC keys,
//            its dK and dV in registers, looping over the tiles of BR queries that can see those
//            keys: S and P recomputed from Q, K and the saved LSE, then dV += Pᵀ dO, dP = dO Vᵀ,
//            dS = P (dP - Delta), dK += dSᵀ Q, and dQ += dS K added into dQ32 with float32
//            atomics), and dq_convert_kernel (dQ = dQ32 rounded to the input type). You write the
//            block's main loop and its pieces (P from S and LSE, dS, the accumulations of dV and dK
//            on the tensor cores, the atomic dQ update) and the Delta kernel; the PTX wrappers
//            (course_mma.h, mma_m16n8k16 below), the tile copies, the products S = K Qᵀ and
//            dPᵀ = V dOᵀ, the dQ conversion and the host code are given.
// Contract:  Q, K, V, O, dO: DEVICE tensors (BH, T, D), contiguous, 16-byte aligned, half
//            (attention_backward_f16) or __nv_bfloat16 (attention_backward_bf16), read-only. O is
//            the forward pass's output and LSE a DEVICE float32 (BH, T): per query row, the natural
//            log of the sum over the keys it sees of exp(S), S = Q Kᵀ / sqrt(D) (masked), as a flash
//            forward pass saves it. Written: dQ, dK, dV (BH, T, D) of the input type; dQ32, DEVICE
//            float32 (BH, T, D), dQ before its rounding (the atomics' accumulator: zeroed by the
//            call itself on `stream`, whatever it held); Delta, DEVICE float32 (BH, T), rowsum(dO * O)
//            in float32. No output overlaps an input or another output. D = 64 or 128 (anything
//            else: cudaErrorInvalidValue, nothing launched); 1 <= T <= 65535, 1 <= BH <= 65535,
//            BH * T * D < 2^31; causal 0 or 1 (when 1, query i sees keys 0..i only, as in lab 2's
//            task 16). Per head, with scale = 1 / sqrt(D):
//              P = exp(scale Q Kᵀ + mask - LSE)      dV = Pᵀ dO          dP = dO Vᵀ
//              dS = P * (dP - Delta)                 dQ = scale dS K     dK = scale dSᵀ Q
//            Every product accumulates in float32; P and dS are rounded to the input type where
//            they are operands of the tensor cores (that rounding is the error the grader allows
//            for); dQ, dK, dV are rounded once, at the end. Everything on `stream`, no
//            synchronisation, no allocation; below compute capability 8.0 cudaErrorNotSupported.
//            dQ's float atomics make its last bits depend on the order the blocks finish in: dQ
//            and dQ32 are not bit-for-bit reproducible, dK and dV are.
// Test:      make test-lab7 TASK=04

#include "course.h"
#include "course_mma.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

[[maybe_unused]] constexpr int WARP = 32;
[[maybe_unused]] constexpr unsigned FULL = 0xffffffffu;  // every lane of a warp takes part in a shuffle
[[maybe_unused]] constexpr float LOG2E = 1.4426950408889634f;
[[maybe_unused]] constexpr int PREP_THREADS = 256;     // prep_kernel: D / 8 threads per row of O and dO
[[maybe_unused]] constexpr int CONVERT_THREADS = 256;  // dq_convert_kernel: 8 elements per thread

// ---------------------------------------------------------------------------------------------
// The main kernel's shape for head dimension D_. One block of WARPS warps per head and tile of
// BC = 16 WARPS keys; warp w owns keys 16 w .. 16 w + 15 of the tile, and its dK and dV rows stay
// in its registers from the first query tile to the last. Query tiles are BR rows.
// ---------------------------------------------------------------------------------------------
template <int D_, int WARPS_, int BR_>
struct Bwd {
    static constexpr int D = D_;                 // head dimension
    static constexpr int WARPS = WARPS_;         // warps per block, 16 keys each
    static constexpr int BC = 16 * WARPS;        // keys per block
    static constexpr int BR = BR_;               // queries per tile of the loop
    static constexpr int THREADS = WARPS * WARP;
    static constexpr int CPR = D / 8;            // 16-byte chunks per row of Q, K, V, dO
    static constexpr int CPR_S = BR / 8;         // 16-byte chunks per row of the dSᵀ tile (a key's BR queries)
    static constexpr int KD = D / 16;            // k slices over d (S = K Qᵀ, dPᵀ = V dOᵀ)
    static constexpr int NQ = BR / 8;            // n8 tiles of a warp's Sᵀ: 8 queries each
    static constexpr int KQ = BR / 16;           // k slices over the queries (dV += Pᵀ dO, dK += dSᵀ Q)
    static constexpr int ND = D / 8;             // n8 tiles of a warp's dK and dV rows: 8 of d each
    // the dQ step: warp w takes queries 16 (w % QG) .. + 15 of the tile and the n8 tiles
    // DQN (w / QG) .. + DQN - 1 of d
    static constexpr int QG = BR / 16;
    static constexpr int DQN = ND / (WARPS / QG);
    // K's and V's fragments kept in registers across the query tiles (32 registers at D = 64);
    // at D = 128 they would take 64, so they are read from shared memory each time instead
    static constexpr bool HOLD_KV = D <= 64;
    static constexpr int KV_TILE = BC * D;       // elements of the K or V tile
    static constexpr int Q_TILE = BR * D;        // elements of one stage of Q or dO
    static constexpr int DS_TILE = BC * BR;      // elements of the dSᵀ tile
    static constexpr int SMEM_BYTES =
        (2 * KV_TILE + 2 * 2 * Q_TILE + DS_TILE) * 2 + 2 * 2 * BR * (int)sizeof(float);
    static_assert(D % 16 == 0 && BR % 16 == 0 && CPR >= 8, "whole mma slices; rows of at least 128 bytes");
    static_assert(CPR_S >= 2 && (CPR_S & (CPR_S - 1)) == 0, "the dSᵀ tile's rows: a power of two chunks");
    static_assert(WARPS % QG == 0 && ND % (WARPS / QG) == 0 && DQN % 2 == 0, "the dQ step's warps cover the tile");
    static_assert(2 * BR <= THREADS, "one thread per query stages LSE, another Delta");
};

// D = 64: 8 warps, 128 keys, tiles of 64 queries, 81 KB of shared memory. D = 128: dK and dV take
// 128 registers a thread, so tiles of 16 queries (84 KB): with 32, ptxas (CUDA 13, sm_90) spills
// about 27 registers.
using Bwd64 = Bwd<64, 8, 64>;
using Bwd128 = Bwd<128, 8, 16>;

// ---------------------------------------------------------------------------------------------
// Given: the mma for both types, the 16-bit conversions, and the copies of tiles into shared
// memory. The instructions exist from sm_80 on; for an older target they compile to nothing and
// the entry points refuse to launch.
// ---------------------------------------------------------------------------------------------

// d = a · b + d for one 16 x 8 tile, k = 16, elements of type E (half or __nv_bfloat16), float32
// accumulators. With g = lane / 4 and t = lane % 4: a[0] = A[g][2t, 2t+1], a[1] = A[g+8][2t, 2t+1],
// a[2] = A[g][2t+8, 2t+9], a[3] = A[g+8][2t+8, 2t+9]; b[0] = B[2t, 2t+1][g], b[1] = B[2t+8, 2t+9][g];
// d[0], d[1] = D[g][2t, 2t+1], d[2], d[3] = D[g+8][2t, 2t+1]. Lower column (row, for B) in the low
// 16 bits of a register. Warp-collective.
template <typename E>
__device__ __forceinline__ void mma_m16n8k16(float* d, const uint32_t* a, const uint32_t* b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (std::is_same_v<E, half>) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    } else {
        static_assert(std::is_same_v<E, __nv_bfloat16>, "half or __nv_bfloat16");
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
#endif
}

// Two floats as one register of two E's, each rounded to nearest: lo in the low 16 bits.
template <typename E>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
    if constexpr (std::is_same_v<E, half>) {
        const half2 v = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<const uint32_t*>(&v);
    } else {
        const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<const uint32_t*>(&v);
    }
}

// One register of two E's as two floats (exact).
template <typename E>
__device__ __forceinline__ float2 unpack2(uint32_t w) {
    if constexpr (std::is_same_v<E, half>) return __half22float2(*reinterpret_cast<const half2*>(&w));
    else return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
}

// Rows r0 .. r0 + ROWS - 1 of one head's (T, D) matrix X into the shared tile Xs, laid out by
// swizzle<CPR>, with cp.async (16 bytes a thread a pass, consecutive threads on consecutive chunks
// of a row: coalesced). A row at or past T becomes zeros (src_bytes 0, the source kept a valid
// address): a padded key or query then contributes exact zeros to every product.
template <typename F, int ROWS, typename E>
__device__ __forceinline__ void load_rows(E* Xs, const E* X, int r0, int T) {
    constexpr int PASS = F::THREADS / F::CPR;  // rows one pass of the block copies
    static_assert(PASS % 8 == 0 && ROWS % PASS == 0, "whole passes that keep the swizzle");
    const int row = (int)threadIdx.x / F::CPR, chunk = (int)threadIdx.x % F::CPR;
    const int dst = swizzle<F::CPR>(row, chunk);
    const size_t src = (size_t)(r0 + row) * F::D + chunk * 8;
#pragma unroll
    for (int n = 0; n < ROWS / PASS; ++n) {
        const bool inside = r0 + row + n * PASS < T;
        cp_async_16(Xs + dst + n * PASS * F::D, inside ? X + src + (size_t)n * PASS * F::D : X, inside ? 16 : 0);
    }
}

// The query tile's statistics into one stage: LSE in log2 units (so that P = exp2(S c - lse2),
// c = log2(e) / sqrt(D)) and Delta, 0 for a query at or past T (its P is masked to 0 anyway).
// Plain loads: LSE's rows need not sit on a 16-byte boundary (T is any size).
template <typename F>
__device__ __forceinline__ void load_stats(float* lse2, float* delta, const float* LSE, const float* Delta, int q0,
                                           int T) {
    const int tid = (int)threadIdx.x;
    if (tid < F::BR) {
        lse2[tid] = q0 + tid < T ? LSE[q0 + tid] * LOG2E : 0.0f;
    } else if (tid < 2 * F::BR) {
        const int q = tid - F::BR;
        delta[q] = q0 + q < T ? Delta[q0 + q] : 0.0f;
    }
}

// The A fragment of slice kk (d = 16 kk .. 16 kk + 15) of the warp's 16 rows row0 .. row0 + 15 of a
// key-major tile (K or V), read as stored: its rows are mma's m, d is k. Lanes 0-7 point at rows
// 0-7 of the slice's first chunk (a[0]), 8-15 at rows 8-15 (a[1]), 16-31 the same at its second
// chunk (a[2], a[3]).
template <typename F, typename E>
__device__ __forceinline__ void row_fragment(uint32_t (&a)[4], const E* Xs, int row0, int kk) {
    const int lane = (int)threadIdx.x % WARP;
    const int row = row0 + (lane & 7) + (((lane >> 3) & 1) << 3);
    ldmatrix_x4(a, Xs + swizzle<F::CPR>(row, 2 * kk + (lane >> 4)));
}

// All KD slices' fragments of the warp's rows, kept in registers across the query tiles (HOLD_KV).
template <typename F, typename E>
__device__ __forceinline__ void row_fragments(uint32_t (&f)[F::KD][4], const E* Xs, int row0) {
#pragma unroll
    for (int kk = 0; kk < F::KD; ++kk) row_fragment<F>(f[kk], Xs, row0, kk);
}

// acc = (the warp's 16 rows X) · Yᵀ over d, for the query tile Ys (BR rows of D): Sᵀ = K Qᵀ with
// X = K and Y = Q, dPᵀ = V dOᵀ with X = V and Y = dO. acc[j] is the 16 x 8 tile of queries
// 8 j .. 8 j + 7. X's fragments are xf where the traits hold them (HOLD_KV), else read from the
// tile Xs slice by slice (rows row0 ..); Yᵀ's .col fragment wants consecutive d of one query: a
// row of Ys as stored.
template <typename F, typename E>
__device__ __forceinline__ void rows_times_tile(float (&acc)[F::NQ][4], const uint32_t (&xf)[F::KD][4], const E* Xs,
                                                int row0, const E* Ys) {
    const int lane = (int)threadIdx.x % WARP;
#pragma unroll
    for (int j = 0; j < F::NQ; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    const int yrow = (lane & 7) + ((lane >> 4) << 3), ychunk = (lane >> 3) & 1;
#pragma unroll
    for (int kk = 0; kk < F::KD; ++kk) {
        uint32_t a[4];
        if constexpr (F::HOLD_KV) {
            a[0] = xf[kk][0], a[1] = xf[kk][1], a[2] = xf[kk][2], a[3] = xf[kk][3];
        } else {
            row_fragment<F>(a, Xs, row0, kk);
        }
#pragma unroll
        for (int j = 0; j < F::NQ; j += 2) {
            uint32_t yf[4];  // queries 8 j .. 8 j + 15, d chunks 2 kk and 2 kk + 1
            ldmatrix_x4(yf, Ys + swizzle<F::CPR>(8 * j + yrow, 2 * kk + ychunk));
            mma_m16n8k16<E>(acc[j], a, yf);
            mma_m16n8k16<E>(acc[j + 1], a, yf + 2);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The pieces of the main loop. In all of them a warp works on its 16 keys; lane (g, t) = (lane / 4,
// lane % 4) holds, of every 16 x 8 accumulator tile j of Sᵀ, dPᵀ or dSᵀ, key row g in elements
// [0], [1] (queries 8 j + 2 t, 8 j + 2 t + 1) and key row g + 8 in [2], [3].
// ---------------------------------------------------------------------------------------------

// Sᵀ (raw dot products K Qᵀ) -> Pᵀ in place: p = exp2(s c - lse2[query]), c = log2(e) / sqrt(D), and
// exactly 0 where the query may not see the key: a key or query at or past T, and when causal a
// key past the query. key0 is the warp's first key, q0 the tile's first query; `edge` says whether
// this tile has any such pair at all (most tiles have none: no compare then).
template <typename F>
__device__ __forceinline__ void probabilities(float (&s)[F::NQ][4], const float* lse2, float c, int key0, int q0,
                                              int T, int causal, bool edge) {
    // TODO(lab7/04) begin: per element of s: p = exp2f of s times c minus its query's lse2 (one fma inside), and 0 where the mask hides the pair (only when `edge`); see the chapter's section "P from the saved log-sum-exp"; about 15 lines; try BH=1,T=1, BH=2,T=17 causal and the large-magnitude case.
    const int t = (int)threadIdx.x % 4, g = (int)threadIdx.x % WARP / 4;
#pragma unroll
    for (int j = 0; j < F::NQ; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int col = 8 * j + 2 * t + e;  // the query q0 + col
            const float l2 = lse2[col];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int key = key0 + g + 8 * h;
                float p = exp2f(fmaf(s[j][2 * h + e], c, -l2));
                if (edge && (q0 + col >= T || key >= T || (causal && key > q0 + col))) p = 0.0f;
                s[j][2 * h + e] = p;
            }
        }
    }
    // TODO(lab7/04) end
}

// dPᵀ -> dSᵀ in place: ds = p (dp - Delta[query]). p = 0 where masked, so ds is 0 there too.
template <typename F>
__device__ __forceinline__ void dscores(float (&dp)[F::NQ][4], const float (&p)[F::NQ][4], const float* delta) {
    // TODO(lab7/04) begin: per element: ds = p times (dp minus its query's Delta), in float32; see the chapter's section "dS, and why Delta"; about 8 lines.
    const int t = (int)threadIdx.x % 4;
#pragma unroll
    for (int j = 0; j < F::NQ; ++j) {
        const float d0 = delta[8 * j + 2 * t], d1 = delta[8 * j + 2 * t + 1];
        dp[j][0] = p[j][0] * (dp[j][0] - d0);
        dp[j][1] = p[j][1] * (dp[j][1] - d1);
        dp[j][2] = p[j][2] * (dp[j][2] - d0);
        dp[j][3] = p[j][3] * (dp[j][3] - d1);
    }
    // TODO(lab7/04) end
}

// acc += Xᵀ Y for the warp's 16 keys: Xᵀ (16 keys x BR queries) is a warp's accumulator tile (Pᵀ
// for dV, dSᵀ for dK), rounded to E and reused in its registers as the A operand; Y (BR queries x
// D) is the stage Ys (dO for dV, Q for dK), whose fragments come with ldmatrix's .trans (Y's rows
// are the queries, k; mma's .col operand wants pairs of consecutive queries for one d).
template <typename F, typename E>
__device__ __forceinline__ void accumulate_t(float (&acc)[F::ND][4], const float (&x)[F::NQ][4], const E* Ys) {
    // TODO(lab7/04) begin: per slice of 16 queries: x's two n8 tiles packed with pack2 into an A fragment (the layout of lab 2's pv), then per pair of d chunks one ldmatrix_x4_trans of Ys and two mma_m16n8k16<E>; see the chapter's section "Four products per tile"; about 15 lines.
    const int lane = (int)threadIdx.x % WARP;
#pragma unroll
    for (int kk = 0; kk < F::KQ; ++kk) {  // queries 16 kk .. 16 kk + 15: x's n8 tiles 2 kk and 2 kk + 1
        const uint32_t a[4] = {pack2<E>(x[2 * kk][0], x[2 * kk][1]), pack2<E>(x[2 * kk][2], x[2 * kk][3]),
                               pack2<E>(x[2 * kk + 1][0], x[2 * kk + 1][1]),
                               pack2<E>(x[2 * kk + 1][2], x[2 * kk + 1][3])};
#pragma unroll
        for (int n = 0; n < F::ND; n += 2) {
            uint32_t yf[4];  // queries 0-7 and 8-15 of d chunk n (lanes 0-15), then of chunk n + 1
            ldmatrix_x4_trans(yf, Ys + swizzle<F::CPR>(16 * kk + lane % 16, n + lane / 16));
            mma_m16n8k16<E>(acc[n], a, yf);
            mma_m16n8k16<E>(acc[n + 1], a, yf + 2);
        }
    }
    // TODO(lab7/04) end
}

// The warp's dSᵀ accumulators, rounded to E, into the block's dSᵀ tile (BC keys x BR queries,
// swizzle<CPR_S>): n8 tile j of a key row is chunk j of that row, and lane (g, t) holds its
// elements 2 t and 2 t + 1, one 32-bit word.
template <typename F, typename E>
__device__ __forceinline__ void store_ds(E* dSs, const float (&ds)[F::NQ][4], int row0) {
    const int lane = (int)threadIdx.x % WARP;
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int j = 0; j < F::NQ; ++j) {
        *reinterpret_cast<uint32_t*>(dSs + swizzle<F::CPR_S>(row0 + g, j) + 2 * t) = pack2<E>(ds[j][0], ds[j][1]);
        *reinterpret_cast<uint32_t*>(dSs + swizzle<F::CPR_S>(row0 + g + 8, j) + 2 * t) = pack2<E>(ds[j][2], ds[j][3]);
    }
}

// dQ[q0 .. q0 + BR) += scale dS K for the block's BC keys, into dQ32 (float32 atomics: every key
// tile of the head adds into the same rows). dS comes from the block's dSᵀ tile, K from the block's
// K tile; warp w computes queries 16 (w % QG) .. + 15 and the n8 tiles of d DQN (w / QG) .. + DQN - 1.
// dQ32 points at the head's first row; rows at or past T get nothing.
template <typename F, typename E>
__device__ __forceinline__ void add_dq(float* dQ32, const E* dSs, const E* Ks, int q0, int T, float scale) {
    // TODO(lab7/04) begin: per slice of 16 keys, dS's A fragment by ldmatrix_x4_trans from the dSᵀ tile (its rows are keys, k) and K's B fragments by ldmatrix_x4_trans from Ks, mma into DQN accumulator tiles; then each pair of floats times scale added into dQ32 (atomicAdd; a float2 atomicAdd on sm_90), rows past T skipped; see the chapter's section "dQ: every key tile adds to it"; about 35 lines.
    const int warp = (int)threadIdx.x / WARP, lane = (int)threadIdx.x % WARP;
    const int g = lane / 4, t = lane % 4;
    const int qg = warp % F::QG, n0 = (warp / F::QG) * F::DQN;
    float acc[F::DQN][4];
#pragma unroll
    for (int n = 0; n < F::DQN; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    // dS (queries x keys) is the dSᵀ tile read transposed: lanes 0-7 point at keys 0-7 of the slice
    // in the chunk of queries 0-7 (a[0]), 8-15 at the chunk of queries 8-15 (a[1]), 16-31 the same
    // for keys 8-15 (a[2], a[3])
    const int srow = (lane & 7) + ((lane >> 4) << 3), schunk = 2 * qg + ((lane >> 3) & 1);
#pragma unroll
    for (int kk = 0; kk < F::BC / 16; ++kk) {
        uint32_t a[4];
        ldmatrix_x4_trans(a, dSs + swizzle<F::CPR_S>(16 * kk + srow, schunk));
#pragma unroll
        for (int n = 0; n < F::DQN; n += 2) {
            uint32_t kf[4];
            ldmatrix_x4_trans(kf, Ks + swizzle<F::CPR>(16 * kk + lane % 16, n0 + n + lane / 16));
            mma_m16n8k16<E>(acc[n], a, kf);
            mma_m16n8k16<E>(acc[n + 1], a, kf + 2);
        }
    }
    const int r = q0 + 16 * qg + g;
#pragma unroll
    for (int n = 0; n < F::DQN; ++n) {
        const int col = 8 * (n0 + n) + 2 * t;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            if (r + 8 * h >= T) continue;
            float* dst = dQ32 + (size_t)(r + 8 * h) * F::D + col;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            atomicAdd(reinterpret_cast<float2*>(dst), make_float2(acc[n][2 * h] * scale, acc[n][2 * h + 1] * scale));
#else
            atomicAdd(dst, acc[n][2 * h] * scale);
            atomicAdd(dst + 1, acc[n][2 * h + 1] * scale);
#endif
        }
    }
    // TODO(lab7/04) end
}

// The warp's dK or dV rows (keys key0 + g and key0 + g + 8, lane (g, t) holding columns 8 n + 2 t,
// + 1 of n8 tile n), times `mul`, rounded to E and stored as 32-bit words. X points at the head's
// first row; keys at or past T are not stored.
template <typename F, typename E>
__device__ __forceinline__ void store_rows(E* X, const float (&acc)[F::ND][4], float mul, int key0, int T) {
    const int lane = (int)threadIdx.x % WARP;
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int n = 0; n < F::ND; ++n) {
        const int col = 8 * n + 2 * t;
        if (key0 + g < T)
            *reinterpret_cast<uint32_t*>(X + (size_t)(key0 + g) * F::D + col) =
                pack2<E>(acc[n][0] * mul, acc[n][1] * mul);
        if (key0 + g + 8 < T)
            *reinterpret_cast<uint32_t*>(X + (size_t)(key0 + g + 8) * F::D + col) =
                pack2<E>(acc[n][2] * mul, acc[n][3] * mul);
    }
}

// ---------------------------------------------------------------------------------------------
// The kernels.
// ---------------------------------------------------------------------------------------------

// Delta[r] = sum over d of dO[r][d] * O[r][d] in float32, and dQ32's row r zeroed, for every row r
// of the BH * T rows. D / 8 consecutive threads share a row, each with 16 bytes of O and of dO.
template <typename E, int D>
__global__ void __launch_bounds__(PREP_THREADS)
    prep_kernel(const E* __restrict__ O, const E* __restrict__ dO, float* __restrict__ Delta, float* __restrict__ dQ32,
                int rows) {
    // TODO(lab7/04) begin: one row per D / 8 threads: 16-byte loads of O and dO (unpack2 per register), the 8 products summed in float32, the row's partial sums combined with __shfl_xor_sync among its threads (every lane takes part), Delta written once per row, and the row of dQ32 zeroed (float4 stores); offsets in size_t; see the chapter's section "dS, and why Delta"; about 25 lines; try T=1 and T=77.
    constexpr int CPR = D / 8;  // threads per row: 8 or 16, a power of two that divides a warp
    const int c = (int)threadIdx.x % CPR;
    const int row = (int)blockIdx.x * (PREP_THREADS / CPR) + (int)threadIdx.x / CPR;
    float sum = 0.0f;
    if (row < rows) {
        const size_t at = (size_t)row * D + 8 * c;
        const uint4 o = *reinterpret_cast<const uint4*>(O + at);
        const uint4 d = *reinterpret_cast<const uint4*>(dO + at);
        const uint32_t ow[4] = {o.x, o.y, o.z, o.w}, dw[4] = {d.x, d.y, d.z, d.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float2 a = unpack2<E>(ow[i]), b = unpack2<E>(dw[i]);
            sum = fmaf(a.x, b.x, sum);
            sum = fmaf(a.y, b.y, sum);
        }
        float4* z = reinterpret_cast<float4*>(dQ32 + at);
        z[0] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        z[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int m = CPR / 2; m > 0; m /= 2) sum += __shfl_xor_sync(FULL, sum, m);  // the row's CPR threads
    if (row < rows && c == 0) Delta[row] = sum;
    // TODO(lab7/04) end
}

// Q, K, V, dO (BH, T, D), LSE and Delta (BH, T) -> dK, dV (BH, T, D) and dQ32 += (BH, T, D). One
// block per head and tile of BC keys; F::SMEM_BYTES of dynamic shared memory: the K and V tiles,
// two stages of the Q and dO tiles, the dSᵀ tile, two stages of the tile's LSE (log2 units) and
// Delta.
template <typename E, typename F>
__global__ void __launch_bounds__(F::THREADS, 1)
    attention_backward_kernel(const E* __restrict__ Q, const E* __restrict__ K, const E* __restrict__ V,
                              const E* __restrict__ dO, const float* __restrict__ LSE,
                              const float* __restrict__ Delta, float* __restrict__ dQ32, E* __restrict__ dK,
                              E* __restrict__ dV, int BH, int T, int causal, float scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    // No mma.sync m16n8k16 or cp.async before sm_80: an empty kernel, which the entry points never launch.
#else
    extern __shared__ __align__(128) unsigned char smem_bytes[];
    E* const Ks = reinterpret_cast<E*>(smem_bytes);  // (BC, D)
    E* const Vs = Ks + F::KV_TILE;                    // (BC, D)
    E* const Qs = Vs + F::KV_TILE;                    // stage s: Qs + s * Q_TILE, (BR, D)
    E* const dOs = Qs + 2 * F::Q_TILE;                // stage s: dOs + s * Q_TILE, (BR, D)
    E* const dSs = dOs + 2 * F::Q_TILE;               // (BC, BR): dSᵀ, a row per key
    float* const lse2s = reinterpret_cast<float*>(dSs + F::DS_TILE);  // stage s: lse2s + s * BR
    float* const deltas = lse2s + 2 * F::BR;                          // stage s: deltas + s * BR
    // TODO(lab7/04) begin: the block's head and key tile (blockIdx.x % BH, blockIdx.x / BH: the first key tiles, which the causal mask gives the most queries, start first); K, V and the first query tile through cp.async; the query tiles from the first that can see a key of this tile (when causal, every earlier tile is wholly masked: skip them) to T, two stages; per tile: Sᵀ and Pᵀ, dPᵀ, dV, dSᵀ, dK, dSᵀ into shared memory and dQ; at the end dK (times scale) and dV stored; see the chapter's section "The loop over query tiles"; about 55 lines; try BH=1,T=1, BH=2,T=17 causal, BH=3,T=200 and run the sanitizer (racecheck).
    const int warp = (int)threadIdx.x / WARP;
    const int head = (int)(blockIdx.x % (unsigned)BH);
    const int k0 = (int)(blockIdx.x / (unsigned)BH) * F::BC;  // the block's first key
    const int key0 = k0 + 16 * warp;                          // the warp's first key
    const size_t off = (size_t)head * T * F::D;
    Q += off, K += off, V += off, dO += off, dQ32 += off, dK += off, dV += off;
    LSE += (size_t)head * T, Delta += (size_t)head * T;
    const float c = scale * LOG2E;  // exp(x scale) = exp2(x c)

    // With the mask, a query tile whose last query comes before k0 sees none of this block's keys:
    // the loop starts at the tile that holds query k0.
    const int q_first = causal ? k0 / F::BR * F::BR : 0;
    const int tiles = (T - q_first + F::BR - 1) / F::BR;  // >= 1: k0 < T

    load_rows<F, F::BC>(Ks, K, k0, T);
    load_rows<F, F::BC>(Vs, V, k0, T);
    load_rows<F, F::BR>(Qs, Q, q_first, T);
    load_rows<F, F::BR>(dOs, dO, q_first, T);
    cp_async_commit();
    load_stats<F>(lse2s, deltas, LSE, Delta, q_first, T);

    float dk[F::ND][4] = {}, dv[F::ND][4] = {};  // (16 keys, D) each: the warp's rows of dK / scale and dV
    uint32_t kf[F::KD][4], vf[F::KD][4];          // the warp's A fragments of K and V (HOLD_KV only)

    for (int it = 0; it < tiles; ++it) {
        const int q0 = q_first + it * F::BR, st = it % 2;
        // This tile's copies are the only group in flight. After the wait they have landed; after
        // the barrier everyone's have (and the statistics' plain stores are visible), and every warp
        // is done with the previous tile: its stage, and the dSᵀ tile its dQ step read.
        cp_async_wait<0>();
        __syncthreads();
        if (it + 1 < tiles) {
            const int nxt = st ^ 1;
            load_rows<F, F::BR>(Qs + nxt * F::Q_TILE, Q, q0 + F::BR, T);
            load_rows<F, F::BR>(dOs + nxt * F::Q_TILE, dO, q0 + F::BR, T);
            cp_async_commit();
            load_stats<F>(lse2s + nxt * F::BR, deltas + nxt * F::BR, LSE, Delta, q0 + F::BR, T);
        }
        const E* const Qt = Qs + st * F::Q_TILE;
        const E* const dOt = dOs + st * F::Q_TILE;
        if constexpr (F::HOLD_KV) {
            if (it == 0) row_fragments<F>(kf, Ks, 16 * warp), row_fragments<F>(vf, Vs, 16 * warp);
        }
        const bool edge = (causal && k0 + F::BC - 1 > q0) || q0 + F::BR > T || k0 + F::BC > T;

        float s[F::NQ][4];  // Sᵀ, then Pᵀ: (16 keys, BR queries)
        rows_times_tile<F>(s, kf, Ks, 16 * warp, Qt);
        probabilities<F>(s, lse2s + st * F::BR, c, key0, q0, T, causal, edge);
        float dp[F::NQ][4];  // dPᵀ, then dSᵀ
        rows_times_tile<F>(dp, vf, Vs, 16 * warp, dOt);
        accumulate_t<F>(dv, s, dOt);  // dV += Pᵀ dO
        dscores<F>(dp, s, deltas + st * F::BR);
        accumulate_t<F>(dk, dp, Qt);  // dK += dSᵀ Q (scaled once, at the end)
        store_ds<F>(dSs, dp, 16 * warp);
        __syncthreads();  // the whole dSᵀ tile is written before any warp reads it
        add_dq<F>(dQ32, dSs, Ks, q0, T, scale);
    }
    store_rows<F>(dK, dk, scale, key0, T);
    store_rows<F>(dV, dv, 1.0f, key0, T);
    // TODO(lab7/04) end
#endif
}

// dQ = dQ32 rounded to E, 8 elements (two float4s in, 16 bytes out) per thread; n8 = BH T D / 8.
template <typename E>
__global__ void __launch_bounds__(CONVERT_THREADS)
    dq_convert_kernel(const float* __restrict__ dQ32, E* __restrict__ dQ, size_t n8) {
    const size_t i = (size_t)blockIdx.x * CONVERT_THREADS + threadIdx.x;
    if (i >= n8) return;
    const float4 a = reinterpret_cast<const float4*>(dQ32)[2 * i];
    const float4 b = reinterpret_cast<const float4*>(dQ32)[2 * i + 1];
    reinterpret_cast<uint4*>(dQ)[i] =
        make_uint4(pack2<E>(a.x, a.y), pack2<E>(a.z, a.w), pack2<E>(b.x, b.y), pack2<E>(b.z, b.w));
}

// ---------------------------------------------------------------------------------------------
// The host side, given.
// ---------------------------------------------------------------------------------------------

template <typename E, typename F>
static cudaError_t launch_backward(const E* Q, const E* K, const E* V, const E* O, const E* dO, const float* LSE,
                                   E* dQ, E* dK, E* dV, float* dQ32, float* Delta, int BH, int T, int causal,
                                   cudaStream_t stream) {
    // cudaErrorNotSupported before sm_80, before any launch (course_mma.h)
    CUDA_CHECK((tensor_core_kernel_ready<attention_backward_kernel<E, F>>(F::SMEM_BYTES)));
    const int rows = BH * T;  // < 2^31 / D
    constexpr int prep_rows = PREP_THREADS / (F::D / 8);
    prep_kernel<E, F::D><<<(rows + prep_rows - 1) / prep_rows, PREP_THREADS, 0, stream>>>(O, dO, Delta, dQ32, rows);
    CUDA_CHECK(cudaGetLastError());
    const unsigned blocks = (unsigned)BH * (unsigned)((T + F::BC - 1) / F::BC);
    const float scale = 1.0f / sqrtf((float)F::D);
    attention_backward_kernel<E, F><<<blocks, F::THREADS, F::SMEM_BYTES, stream>>>(Q, K, V, dO, LSE, Delta, dQ32,
                                                                                    dK, dV, BH, T, causal, scale);
    CUDA_CHECK(cudaGetLastError());
    const size_t n8 = (size_t)rows * F::D / 8;
    dq_convert_kernel<E><<<(unsigned)((n8 + CONVERT_THREADS - 1) / CONVERT_THREADS), CONVERT_THREADS, 0, stream>>>(
        dQ32, dQ, n8);
    return cudaGetLastError();
}

// The dispatch on D: one instantiation per head dimension (the loops unroll over D).
template <typename E>
static cudaError_t attention_backward(const E* Q, const E* K, const E* V, const E* O, const E* dO, const float* LSE,
                                      E* dQ, E* dK, E* dV, float* dQ32, float* Delta, int BH, int T, int D, int causal,
                                      cudaStream_t stream) {
    if (BH < 1 || T < 1) return cudaErrorInvalidValue;
    if (D == 64)
        return launch_backward<E, Bwd64>(Q, K, V, O, dO, LSE, dQ, dK, dV, dQ32, Delta, BH, T, causal, stream);
    if (D == 128)
        return launch_backward<E, Bwd128>(Q, K, V, O, dO, LSE, dQ, dK, dV, dQ32, Delta, BH, T, causal, stream);
    return cudaErrorInvalidValue;
}

COURSE_API cudaError_t attention_backward_f16(const half* Q, const half* K, const half* V, const half* O,
                                              const half* dO, const float* LSE, half* dQ, half* dK, half* dV,
                                              float* dQ32, float* Delta, int BH, int T, int D, int causal,
                                              cudaStream_t stream) {
    return attention_backward(Q, K, V, O, dO, LSE, dQ, dK, dV, dQ32, Delta, BH, T, D, causal, stream);
}

COURSE_API cudaError_t attention_backward_bf16(const __nv_bfloat16* Q, const __nv_bfloat16* K,
                                               const __nv_bfloat16* V, const __nv_bfloat16* O,
                                               const __nv_bfloat16* dO, const float* LSE, __nv_bfloat16* dQ,
                                               __nv_bfloat16* dK, __nv_bfloat16* dV, float* dQ32, float* Delta,
                                               int BH, int T, int D, int causal, cudaStream_t stream) {
    return attention_backward(Q, K, V, O, dO, LSE, dQ, dK, dV, dQ32, Delta, BH, T, D, causal, stream);
}

// Lab 5 · Task 02 — the LLaMA kernels: embedding, RMSNorm, RoPE, the KV-cache update and attention
//
// Implement: the kernel bodies in the TODO regions: copy_rows_kernel (embedding and kv_update are
//            both row copies), rmsnorm_kernel, rope_kernel (also into a cache: rope_kv_update),
//            rotated() (one element of RoPE, for attention_rope's queries), and attention in two paths:
//            decode (n_tokens <= DECODE_MAX_TOKENS): flash-decoding in one launch, the filled
//            prefix split across blocks (attention_split_kernel: a partial max, sum and weighted
//            sum per split, the run's new keys and values taken from k_new and v_new and written
//            into the caches on the way for attention_append), the last block of each head to
//            finish merging them (merge_splits);
//            prefill: a fused flash-attention forward (attention_prefill_kernel: online softmax
//            over key tiles staged in shared memory). Both for any even head dim dh from 8 to 256:
//            each is compiled for a size DH, the exact dh (64, 128) or one that holds it (64, 128,
//            256); rows are dh long and the elements from dh to DH zeros (see "Head dims").
// Contract:  kiln_llm/kernels/llm_kernels.h, for float, __half and __nv_bfloat16 (the _f32, _f16
//            and _bf16 symbols). Arithmetic in float32, one rounding at the end (RMSNorm: HF's two).
//            pos and the tokens are DEVICE memory, read when the kernel runs (a CUDA graph replays
//            with new ones). Attention reads cache rows 0 .. pos + n_tokens - 1 only, GQA: query
//            head h reads kv head h / (heads / kv_heads). Launches only on `stream`, never
//            synchronizes or allocates, returns the launch's error.
// Test:      make test-lab5 TASK=02

#include "kiln_llm/kernels/llm_kernels.h"

#include <atomic>
#include <cstdint>

constexpr int THREADS = 256;
constexpr int64_t MAX_BLOCKS = 4096;  // grid-stride loops cover the rest (lab 4's pointwise.cu)

[[maybe_unused]] static unsigned int blocks_for(int64_t n) {
    const int64_t blocks = (n + THREADS - 1) / THREADS;
    return static_cast<unsigned int>(blocks < 1 ? 1 : (blocks < MAX_BLOCKS ? blocks : MAX_BLOCKS));
}

static bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// int64 min and max on both sides (CUDA's min and max overloads differ between host and device)
__host__ __device__ constexpr int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
__host__ __device__ constexpr int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

// ---- element types: float32 in registers, T in memory ---------------------------------------------

template <typename T>
__device__ __forceinline__ float to_f(T x);
template <>
__device__ __forceinline__ float to_f<float>(float x) {
    return x;
}
template <>
__device__ __forceinline__ float to_f<__half>(__half x) {
    return __half2float(x);
}
template <>
__device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 x) {
    return __bfloat162float(x);
}

template <typename T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ float from_f<float>(float x) {
    return x;
}
template <>
__device__ __forceinline__ __half from_f<__half>(float x) {
    return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

// One 16-byte vector of T: 4 floats or 8 halves; loaded and stored as a uint4 (one instruction).
template <typename T>
constexpr int VEC = 16 / static_cast<int>(sizeof(T));

// The bits of one element <-> float32, so that a 16-byte vector stays in registers (a reinterpret_cast
// of a local uint4 would put it on the stack).
template <typename T>
__device__ __forceinline__ float bits_to_f(uint32_t b);
template <>
__device__ __forceinline__ float bits_to_f<float>(uint32_t b) {
    return __uint_as_float(b);
}
template <>
__device__ __forceinline__ float bits_to_f<__half>(uint32_t b) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(b)));
}
template <>
__device__ __forceinline__ float bits_to_f<__nv_bfloat16>(uint32_t b) {
    return __bfloat162float(__ushort_as_bfloat16(static_cast<unsigned short>(b)));
}

template <typename T>
__device__ __forceinline__ uint32_t f_to_bits(float x);
template <>
__device__ __forceinline__ uint32_t f_to_bits<float>(float x) {
    return __float_as_uint(x);
}
template <>
__device__ __forceinline__ uint32_t f_to_bits<__half>(float x) {
    return __half_as_ushort(__float2half_rn(x));
}
template <>
__device__ __forceinline__ uint32_t f_to_bits<__nv_bfloat16>(float x) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

// The VEC<T> elements of a 16-byte vector's bits, as float32.
template <typename T>
__device__ __forceinline__ void unpack_vec(const uint4 raw, float (&f)[VEC<T>]) {
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
    constexpr int PER_WORD = VEC<T> / 4;  // 1 float or 2 halves in each 32-bit word
    constexpr int BITS = 32 / PER_WORD;
#pragma unroll
    for (int i = 0; i < VEC<T>; ++i) {
        const uint32_t w = words[i / PER_WORD] >> (BITS * (i % PER_WORD));
        f[i] = bits_to_f<T>(PER_WORD == 1 ? w : (w & 0xffffu));
    }
}

template <typename T>
__device__ __forceinline__ void load_vec(const T* p, float (&f)[VEC<T>]) {
    unpack_vec<T>(*reinterpret_cast<const uint4*>(p), f);
}

template <typename T>
__device__ __forceinline__ void store_vec(T* p, const float (&f)[VEC<T>]) {
    constexpr int PER_WORD = VEC<T> / 4;
    constexpr int BITS = 32 / PER_WORD;
    uint32_t words[4] = {0, 0, 0, 0};
#pragma unroll
    for (int i = 0; i < VEC<T>; ++i) words[i / PER_WORD] |= f_to_bits<T>(f[i]) << (BITS * (i % PER_WORD));
    *reinterpret_cast<uint4*>(p) = make_uint4(words[0], words[1], words[2], words[3]);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int off = 16; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

// exp2(m_old - m_new), the factor that moves a running sum from max m_old to max m_new; 0 for a
// sum that has seen nothing yet (m_old = -inf), where the formula would give exp2(-inf - -inf) = NaN.
__device__ __forceinline__ float rescale(float m_old, float m_new) {
    return m_old == -INFINITY ? 0.0f : exp2f(m_old - m_new);
}

// ---- embedding and kv_update: row copies ----------------------------------------------------------
// Both move whole rows without arithmetic, so they copy bits in units of U: uint4 (16 bytes) when the
// rows and pointers allow it, else one element (uint16_t or uint32_t).

template <int BYTES>
struct Bits;
template <>
struct Bits<2> {
    using type = uint16_t;
};
template <>
struct Bits<4> {
    using type = uint32_t;
};

// dst (n_rows, row_units)[row_of(r)] = src (n_rows, row_units)[r], where
//   mode 0 (embedding): src row tokens[r] of a table of `limit` rows -> dst row r; a token outside
//                       [0, limit) writes zeros;
//   mode 1 (kv_update): src row r -> dst row pos[0] + r of a cache of `limit` rows, skipped when
//                       outside [0, limit).
template <typename U>
__global__ void copy_rows_kernel(int mode, U* __restrict__ dst, const U* __restrict__ src,
                                 const int64_t* __restrict__ index, int64_t n_rows, int64_t limit, int64_t row_units) {
    wait_for_previous();
    start_next();
    // TODO(lab5/02) begin: a grid-stride loop over n_rows * row_units units; per unit, the row r and the unit inside it, then the row to read (embedding: tokens[r], zeros when outside [0, limit)) or to write (kv_update: pos[0] + r, skipped when outside [0, limit)); see the chapter's section "Kernels that only move rows"; about 15 lines.
    const int64_t n = n_rows * row_units;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    const int64_t base = mode == 1 ? index[0] : 0;  // kv_update's position: one read per thread
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        const int64_t r = i / row_units, u = i - r * row_units;
        if (mode == 0) {
            const int64_t token = index[r];
            dst[i] = token >= 0 && token < limit ? src[token * row_units + u] : U{};
        } else {
            const int64_t row = base + r;
            if (row >= 0 && row < limit) dst[row * row_units + u] = src[i];
        }
    }
    // TODO(lab5/02) end
}

template <typename T>
static cudaError_t copy_rows(int mode, T* dst, const T* src, const int64_t* index, int64_t n_rows, int64_t limit,
                             int64_t row_elems, cudaStream_t stream) {
    if (n_rows < 0 || limit < 0 || row_elems < 0) return cudaErrorInvalidValue;
    if (n_rows == 0 || row_elems == 0) return cudaSuccess;
    const int64_t row_bytes = row_elems * static_cast<int64_t>(sizeof(T));
    if (row_bytes % 16 == 0 && aligned16(dst) && aligned16(src)) {
        const int64_t units = row_bytes / 16;
        launch_chained(copy_rows_kernel<uint4>, dim3(blocks_for(n_rows * units)), dim3(THREADS), stream, mode,
                       reinterpret_cast<uint4*>(dst), reinterpret_cast<const uint4*>(src), index, n_rows, limit, units);
    } else {
        using U = typename Bits<sizeof(T)>::type;
        launch_chained(copy_rows_kernel<U>, dim3(blocks_for(n_rows * row_elems)), dim3(THREADS), stream, mode,
                       reinterpret_cast<U*>(dst), reinterpret_cast<const U*>(src), index, n_rows, limit, row_elems);
    }
    return cudaGetLastError();
}

// ---- rmsnorm: one block per row --------------------------------------------------------------------

constexpr int NORM_THREADS = 256;

// The sum of v over the block (NORM_THREADS threads), in every thread: warps reduce by shuffles,
// then the first warp reduces the warps' sums.
__device__ float block_sum(float v) {
    __shared__ float partial[NORM_THREADS / 32];
    __shared__ float total;
    v = warp_sum(v);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < NORM_THREADS / 32 ? partial[lane] : 0.0f;
        v = warp_sum(v);
        if (lane == 0) total = v;
    }
    __syncthreads();
    return total;
}

// x (rows, d), w (d,) -> out (rows, d); block r normalizes row r. VECTOR: d % VEC<T> == 0 and every
// pointer 16-byte aligned, so each thread moves whole 16-byte vectors; otherwise one element at a time.
template <typename T, bool VECTOR>
__global__ void __launch_bounds__(NORM_THREADS)
    rmsnorm_kernel(T* __restrict__ out, const T* __restrict__ x, const T* __restrict__ w, int64_t d, float eps) {
    wait_for_previous();
    start_next();
    // TODO(lab5/02) begin: the sum of x^2 over row blockIdx.x in float32 (strided over the threads, 16-byte vectors when VECTOR, then block_sum), r = rsqrt(sum / d + eps), then out = round(round(x * r) * w) element by element (HF's order); the row may be any length, not a multiple of the block; see the chapter's section "RMSNorm"; about 35 lines.
    const T* row = x + static_cast<int64_t>(blockIdx.x) * d;
    T* dst = out + static_cast<int64_t>(blockIdx.x) * d;
    float sum = 0.0f;
    if constexpr (VECTOR) {
        const int64_t n = d / VEC<T>;
        for (int64_t i = threadIdx.x; i < n; i += NORM_THREADS) {
            float f[VEC<T>];
            load_vec(row + i * VEC<T>, f);
#pragma unroll
            for (int e = 0; e < VEC<T>; ++e) sum += f[e] * f[e];
        }
    } else {
        for (int64_t i = threadIdx.x; i < d; i += NORM_THREADS) {
            const float f = to_f(row[i]);
            sum += f * f;
        }
    }
    const float r = rsqrtf(block_sum(sum) / static_cast<float>(d) + eps);
    // the second pass reads the row again: at most a few KB, from L1/L2 after the first
    if constexpr (VECTOR) {
        const int64_t n = d / VEC<T>;
        for (int64_t i = threadIdx.x; i < n; i += NORM_THREADS) {
            float f[VEC<T>], g[VEC<T>];
            load_vec(row + i * VEC<T>, f);
            load_vec(w + i * VEC<T>, g);
#pragma unroll
            for (int e = 0; e < VEC<T>; ++e) f[e] = to_f(from_f<T>(f[e] * r)) * g[e];
            store_vec(dst + i * VEC<T>, f);
        }
    } else {
        for (int64_t i = threadIdx.x; i < d; i += NORM_THREADS) {
            dst[i] = from_f<T>(to_f(from_f<T>(to_f(row[i]) * r)) * to_f(w[i]));
        }
    }
    // TODO(lab5/02) end
}

template <typename T>
static cudaError_t rmsnorm(T* out, const T* x, const T* w, int64_t rows, int64_t d, float eps, cudaStream_t stream) {
    if (rows < 0 || d < 1 || rows > 0x7fffffff) return cudaErrorInvalidValue;
    if (rows == 0) return cudaSuccess;
    const unsigned int grid = static_cast<unsigned int>(rows);
    if (d % VEC<T> == 0 && aligned16(out) && aligned16(x) && aligned16(w)) {
        launch_chained(rmsnorm_kernel<T, true>, dim3(grid), dim3(NORM_THREADS), stream, out, x, w, d, eps);
    } else {
        launch_chained(rmsnorm_kernel<T, false>, dim3(grid), dim3(NORM_THREADS), stream, out, x, w, d, eps);
    }
    return cudaGetLastError();
}

// ---- rope: one thread per rotated pair --------------------------------------------------------------

// x (n_tokens, heads, dh) -> out; pair j of (token t, head h) turns by (pos + t) * inv_freq[j].
// cache_rows < 0: out has x's shape, token t in row t (kiln_rope). Else out is a cache of
// cache_rows rows of (heads, dh) and token t goes to row pos + t, skipped outside [0, cache_rows):
// the new keys rotated on their way into the cache, one kernel where rope and kv_update were two.
template <typename T>
__global__ void rope_kernel(T* out, const T* x, const int64_t* __restrict__ pos, const float* __restrict__ inv_freq,
                            int64_t n_tokens, int64_t heads, int64_t dh, int layout, int64_t cache_rows) {
    wait_for_previous();
    start_next();
    // TODO(lab5/02) begin: a grid-stride loop over the n_tokens * heads * dh/2 pairs: each turns its two elements (picked by the layout) by (pos[0] + t) * inv_freq[j] in float32, rounds both once and writes them to row t, or to cache row pos + t when cache_rows >= 0 (skipped outside [0, cache_rows)); see the chapter's section "Rotary embeddings" (of task 02); about 20 lines.
    const int64_t half = dh / 2;
    const int64_t n = n_tokens * heads * half;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    const int64_t p0 = pos[0];
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        const int64_t th = i / half, j = i - th * half;  // th = t * heads + h: the (token, head) row
        const int64_t t = th / heads;
        const int64_t a_at = th * dh + (layout == 0 ? j : 2 * j);
        const int64_t b_at = a_at + (layout == 0 ? half : 1);
        // HF: inv_freq (float32) times the position as a float32, one rounding, then cos and sin
        const float angle = static_cast<float>(p0 + t) * inv_freq[j];
        float s, c;
        sincosf(angle, &s, &c);
        const float a = to_f(x[a_at]), b = to_f(x[b_at]);
        int64_t shift = 0;  // where x's row t lands in out: row t, or cache row pos + t
        if (cache_rows >= 0) {
            if (p0 + t < 0 || p0 + t >= cache_rows) continue;
            shift = p0 * heads * dh;
        }
        out[a_at + shift] = from_f<T>(a * c - b * s);
        out[b_at + shift] = from_f<T>(a * s + b * c);
    }
    // TODO(lab5/02) end
}

template <typename T>
static cudaError_t rope(T* out, const T* x, const int64_t* pos, const float* inv_freq, int64_t n_tokens, int64_t heads,
                        int64_t dh, int layout, int64_t cache_rows, cudaStream_t stream) {
    if (n_tokens < 0 || heads < 0 || dh < 2 || dh % 2 != 0 || (layout != 0 && layout != 1)) return cudaErrorInvalidValue;
    const int64_t pairs = n_tokens * heads * (dh / 2);
    if (pairs == 0) return cudaSuccess;
    launch_chained(rope_kernel<T>, dim3(blocks_for(pairs)), dim3(THREADS), stream, out, x, pos, inv_freq, n_tokens, heads,
                   dh, layout, cache_rows);
    return cudaGetLastError();
}

// Element d of one head's row (dh elements of a token at `position`) after RoPE, rounded to T as
// rope_kernel's output is: attention_rope turns its queries as it loads them, so q never makes
// the round trip through memory that a rope kernel in between would cost.
template <typename T>
__device__ __forceinline__ float rotated(const T* row, int d, int dh, float position, const float* __restrict__ inv_freq,
                                         int layout) {
    // TODO(lab5/02) begin: the pair of d by the layout (half: j = d % (dh/2), elements j and j + dh/2; interleaved: j = d / 2, elements 2j and 2j + 1), its angle position * inv_freq[j], and the rotated value of d (the pair's first element: a cos - b sin, its second: a sin + b cos), rounded to T and back; about 12 lines.
    const int half = dh / 2;
    const int j = layout == 0 ? d % half : d / 2;
    const bool first = layout == 0 ? d < half : d % 2 == 0;
    const int a_at = layout == 0 ? j : 2 * j;
    const int b_at = a_at + (layout == 0 ? half : 1);
    float s, c;
    sincosf(position * inv_freq[j], &s, &c);
    const float a = to_f(row[a_at]), b = to_f(row[b_at]);
    return to_f(from_f<T>(first ? a * c - b * s : a * s + b * c));
    // TODO(lab5/02) end
}

// ---- attention ------------------------------------------------------------------------------------
// Scores live in the log2 domain: q is scaled by scale * log2(e) once, so that exp(scale * q.k - m)
// is exp2(q'.k - m') and every exponential is one exp2f.
//
// Head dims: any even dh from MIN_DH to MAX_DH. Each attention kernel is a template on DH, the most
// elements of a head's row it holds (its registers and shared memory are sized by it), and EXACT:
//   EXACT: the specialised kernels, for dh = DH = 64 or 128 with 16-byte aligned tensors: dh is the
//     constant DH in every index, and rows are read as 16-byte vectors;
//   else: the general path, one instantiation for each DH of 64, 128 and 256 that runs every dh up
//     to it: dh is known at run time, rows are dh elements apart and read as 32-bit words, and the
//     elements from dh to DH are zeros (they add nothing to a score or to a weighted sum of values)
//     that are never written out.
// The code is the same for both: dh where a row's length or stride belongs, DH where a size must be
// a constant, every read of an element at or past dh masked to zero; the host code picks the path.

constexpr float LOG2E = 1.4426950408889634f;
constexpr int MIN_DH = 8;
constexpr int MAX_DH = 256;

// The raw bits of V elements of T (16 or 32 bytes) in 32-bit words: a lane's share of one key or value
// row, kept so until it is scored (half the registers of floats for f16 and bf16).
template <typename T, int V>
struct Packet {
    static_assert(V * sizeof(T) % 16 == 0, "whole 16-byte vectors");
    uint32_t w[V * sizeof(T) / 4];
};

// Elements e0 .. e0 + V - 1 of a head's row, p pointing at element e0. EXACT (dh = DH, 16-byte aligned
// rows): V * sizeof(T) / 16 vector loads. The general path: 32-bit words, zeros at and past dh; dh is
// even, so no word holds elements on both sides of dh, and every row starts on a 4-byte boundary.
template <typename T, int V, bool EXACT>
__device__ __forceinline__ Packet<T, V> load_packet(const T* p, int e0, int dh) {
    Packet<T, V> out;
    if constexpr (EXACT) {
#pragma unroll
        for (int i = 0; i < V * static_cast<int>(sizeof(T)) / 16; ++i) {
            const uint4 u = reinterpret_cast<const uint4*>(p)[i];
            out.w[4 * i] = u.x;
            out.w[4 * i + 1] = u.y;
            out.w[4 * i + 2] = u.z;
            out.w[4 * i + 3] = u.w;
        }
    } else {
        constexpr int PER_WORD = 4 / static_cast<int>(sizeof(T));
#pragma unroll
        for (int i = 0; i < V / PER_WORD; ++i) {
            out.w[i] = 0u;
            if (e0 + PER_WORD * i < dh) out.w[i] = reinterpret_cast<const uint32_t*>(p)[i];
        }
    }
    return out;
}

// A packet's V elements as float32.
template <typename T, int V>
__device__ __forceinline__ void unpack(const Packet<T, V>& p, float (&f)[V]) {
    constexpr int PER_WORD = 4 / static_cast<int>(sizeof(T));  // 1 float or 2 halves in each word
    constexpr int BITS = 32 / PER_WORD;
#pragma unroll
    for (int i = 0; i < V; ++i) {
        const uint32_t w = p.w[i / PER_WORD] >> (BITS * (i % PER_WORD));
        f[i] = bits_to_f<T>(PER_WORD == 1 ? w : (w & 0xffffu));
    }
}

// decode: n_tokens <= DECODE_MAX_TOKENS. Block (split, h) reads keys [split * chunk, + chunk) of the
// filled prefix once for the n_tokens queries of head h, and leaves per (h, split, t) the running max
// m, the sum l of exp2(s - m) and the unnormalized sum of exp2(s - m) * v in a static scratch; the
// last of head h's blocks to finish merges the splits (a second kernel would cost a launch and a
// wait per layer). The scratch is sized once for the largest model the course runs (SCRATCH_ROWS
// partial rows of up to MAX_DH floats): the host code launches fewer splits when heads * splits *
// n_tokens would not fit, and run_chunk makes the chunks longer.
constexpr int DECODE_MAX_TOKENS = 4;
constexpr int DECODE_THREADS = 128;
constexpr int MIN_CHUNK = 32;              // keys per split at least (4 per group of lanes)
constexpr int KEYS = 4;                    // keys per group of lanes loaded at once
constexpr int64_t MAX_SPLITS = 256;        // per head: more would only add partials to merge
constexpr int64_t SCRATCH_ROWS = 1 << 15;  // 32 MiB of partial sums

// A lane's share of a row in the decode kernel: one 16-byte vector, or DH / 32 elements where DH /
// VEC<T> lanes would be more than a warp (f32 at DH 256: two vectors).
template <typename T, int DH>
constexpr int LANE_ELEMS = DH / VEC<T> <= 32 ? VEC<T> : DH / 32;

__device__ float g_partial_acc[SCRATCH_ROWS * MAX_DH];  // (heads, splits, n_tokens, DH): rows DH apart
__device__ float2 g_partial_ml[SCRATCH_ROWS];            // (heads, splits, n_tokens): (m, l)
// per head: how many of its splits have written their partials in this launch; the head's last
// block finds n - 1 here, merges, and puts it back to 0 for the next launch
__device__ unsigned int g_arrived[SCRATCH_ROWS];

// The keys each split takes in this run: the filled prefix (last keys) shared out over the grid's
// n_splits, min_chunk at least. The grid is fixed when a CUDA graph captures it, but the prefix
// grows every step: sizing the chunk from pos, on the device, keeps every split busy at a short
// prefix instead of leaving one block per head to read it all.
__device__ __forceinline__ int64_t run_chunk(int64_t last, int n_splits, int64_t min_chunk) {
    const int64_t even = (last + n_splits - 1) / n_splits;
    return even > min_chunk ? even : min_chunk;
}

// Merges (m2, l2, acc2) into (m, l, acc): both running sums moved to the larger max.
template <int N>
__device__ __forceinline__ void merge(float& m, float& l, float (&acc)[N], float m2, float l2, const float (&acc2)[N]) {
    const float mn = fmaxf(m, m2);
    const float a = rescale(m, mn), b = rescale(m2, mn);
    l = l * a + l2 * b;
#pragma unroll
    for (int i = 0; i < N; ++i) acc[i] = acc[i] * a + acc2[i] * b;
    m = mn;
}

// The partials of head h's splits that had keys (those of the first keys [0, last), `chunk` each)
// -> out (n_tokens, heads, dh), run by the whole of the head's last block. The partials were written
// by other blocks of this launch: __ldcg reads them from L2 (where their __threadfence() put them),
// never from this SM's L1, which is not kept coherent. Merging is latency, not bandwidth (22 splits
// of a few hundred bytes at the benchmark's prefix), so the loads are issued together: every (m, l)
// in one pass into shared memory, a warp per query for the factors, then the weighted sums of acc
// with eight loads in flight per thread.
template <typename T, int DH, bool EXACT>
__device__ void merge_splits(T* __restrict__ out, int64_t last, int64_t chunk, int n_tokens, int heads, int h,
                             int n_splits, int head_dim) {
    static_assert(DECODE_THREADS / 32 >= DECODE_MAX_TOKENS, "a warp per query");
    __shared__ float2 s_ml[MAX_SPLITS * DECODE_MAX_TOKENS];  // (split, t): m and l
    __shared__ float s_factor[MAX_SPLITS * DECODE_MAX_TOKENS];  // (split, t): exp2(m_split - m)
    __shared__ float s_inv_l[DECODE_MAX_TOKENS];
    [[maybe_unused]] const int dh = EXACT ? DH : head_dim;  // the exact path's: a constant in every index
    // TODO(lab5/02) begin: head h's splits that had keys: their (m, l) into shared memory in one pass, a warp per query for the largest m, each split's factor and 1 / (the factored sum of l), then every element below dh: the factored sum of acc, times that inverse, rounded once; see the chapter's section "Flash-decoding" ("The merge"); about 30 lines.
    const int active = static_cast<int>(max64(0, min64((last + chunk - 1) / chunk, n_splits)));
    const int64_t first = static_cast<int64_t>(h) * n_splits * n_tokens;  // (split 0, t = 0)'s row
    for (int i = threadIdx.x; i < active * n_tokens; i += DECODE_THREADS) s_ml[i] = __ldcg(&g_partial_ml[first + i]);
    __syncthreads();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (warp < n_tokens) {
        const int t = warp;
        float m = -INFINITY;
        for (int s = lane; s < active; s += 32) m = fmaxf(m, s_ml[s * n_tokens + t].x);
        m = warp_max(m);
        float l = 0.0f;
        for (int s = lane; s < active; s += 32) {
            const float2 ml = s_ml[s * n_tokens + t];
            const float f = rescale(ml.x, m);
            s_factor[s * n_tokens + t] = f;
            l += ml.y * f;
        }
        l = warp_sum(l);
        if (lane == 0) s_inv_l[t] = l > 0.0f ? 1.0f / l : 0.0f;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n_tokens * DH; i += DECODE_THREADS) {
        const int t = i / DH, e = i % DH;
        if (e >= dh) continue;  // the general path's padding
        float acc = 0.0f;
#pragma unroll 8
        for (int s = 0; s < active; ++s) {
            const int64_t row = first + static_cast<int64_t>(s) * n_tokens + t;
            acc += s_factor[s * n_tokens + t] * __ldcg(&g_partial_acc[row * DH + e]);
        }
        out[(static_cast<int64_t>(t) * heads + h) * dh + e] = from_f<T>(acc * s_inv_l[t]);
    }
    // TODO(lab5/02) end
}

// KEYS rows of keys and values of one group of lanes, j0, j0 + GROUPS, ...: the lane's V elements of
// each (k_lane and v_lane point at element e0 of the head's row 0, rows row_stride apart), as raw bits;
// zeros (0.0 in every type) for rows at or past `end`, and on the general path for elements at or
// past dh.
template <typename T, bool EXACT, int KEYS, int GROUPS, int V>
__device__ __forceinline__ void load_keys(Packet<T, V> (&kr)[KEYS], Packet<T, V> (&vr)[KEYS], const T* k_lane,
                                          const T* v_lane, int64_t row_stride, int64_t j0, int64_t end, int e0,
                                          int dh) {
#pragma unroll
    for (int b = 0; b < KEYS; ++b) {
        const int64_t j = j0 + b * GROUPS;
        kr[b] = vr[b] = Packet<T, V>{};
        if (j < end) {
            kr[b] = load_packet<T, V, EXACT>(k_lane + j * row_stride, e0, dh);
            vr[b] = load_packet<T, V, EXACT>(v_lane + j * row_stride, e0, dh);
        }
    }
}

// One key j (kf) and its value (vf) into the running (m, l, acc) of every query that sees it (ok:
// j is a key of this split at all). Every lane of the warp calls it: the group's score is a shuffle sum.
template <int NT, int V, int LANES>
__device__ __forceinline__ void score_key(const float (&qv)[NT][V], const float (&kf)[V], const float (&vf)[V], bool ok,
                                          int64_t j, int64_t p0, int n_tokens, float (&m)[NT], float (&l)[NT],
                                          float (&acc)[NT][V]) {
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        if (t >= n_tokens) break;
        float s = 0.0f;
#pragma unroll
        for (int e = 0; e < V; ++e) s += qv[t][e] * kf[e];
#pragma unroll
        for (int off = LANES / 2; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
        if (ok && j <= p0 + t) {  // causal: query t sits at position pos + t
            const float mn = fmaxf(m[t], s);
            const float a = rescale(m[t], mn), p = exp2f(s - mn);
            l[t] = l[t] * a + p;
#pragma unroll
            for (int e = 0; e < V; ++e) acc[t][e] = acc[t][e] * a + p * vf[e];
            m[t] = mn;
        }
    }
}

// q (n_tokens, heads, dh), k and v (cache_rows, kv_heads, dh) -> the partials of block (split, h),
// and from the head's last block to finish, out (n_tokens, heads, dh).
// A group of LANES consecutive threads works on one key at a time (each thread V elements of the
// row, one 16-byte vector but for f32 at DH 256: one coalesced row read per group); the block's
// GROUPS groups take every GROUPS-th key of the split, each with its own running (m, l, acc) per
// query, merged at the end. On the general path a lane whose elements start at or past dh holds
// zeros and scores nothing of its own.
// NT is the most queries the instantiation takes, n_tokens <= NT: 1 for a decode step proper, whose
// sums then need a quarter of the registers (more blocks per SM), DECODE_MAX_TOKENS for the rest.
// attention_append (k_new and v_new given): the keys and values of positions pos .. pos + n_tokens - 1
// are this run's k_new and v_new (n_tokens, kv_heads, dh), not cache rows: the split that owns such a
// row reads it from there (the key rotated by rotated() when inv_freq is given, as rope_kv_update
// would store it), and the block of the kv head's first query head writes both into the caches. No
// block of this launch reads those cache rows, so the writes race with nothing; the next run reads them.
template <typename T, int DH, int NT, bool EXACT>
__global__ void __launch_bounds__(DECODE_THREADS, NT == 1 ? 6 : 1)
    attention_split_kernel(T* __restrict__ out, const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                           const T* __restrict__ k_new, const T* __restrict__ v_new, const int64_t* __restrict__ pos,
                           const float* __restrict__ inv_freq, int layout, int n_tokens, int heads, int kv_heads,
                           int head_dim, int64_t cache_rows, int64_t min_chunk, int n_splits, float scale_log2) {
    constexpr int V = LANE_ELEMS<T, DH>;  // a lane's elements of a row
    constexpr int LANES = DH / V;         // f16/bf16: 8, 16, 32 (DH 64, 128, 256); f32: 16, 32, 32
    [[maybe_unused]] constexpr int GROUPS = DECODE_THREADS / LANES;
    [[maybe_unused]] constexpr int WARPS = DECODE_THREADS / 32;
    static_assert(LANES <= 32 && 32 % LANES == 0, "a group of lanes lies inside one warp");
    [[maybe_unused]] const int dh = EXACT ? DH : head_dim;  // the exact path's: a constant in every index
    // TODO(lab5/02) begin: wait and start (attention_append: after its first loads); this split's keys of [0, min(pos + n_tokens, cache_rows)), KEYS per group of lanes loaded before the first is scored; the online softmax, masked to keys <= pos + t; attention_append's new rows; merge the groups, write the partials, count the arrival, the last block merges; see the chapter's section "The split kernel, step by step"; about 90 lines.
    __shared__ float s_m[WARPS][NT], s_l[WARPS][NT];
    __shared__ float s_acc[WARPS][NT][DH];
    // attention_append reads pos and the cache rows below it before waiting for the kernel before (a
    // decode step's stacked q, k and v projection), which the header's contract says does not write
    // them: the first keys are on their way while that kernel's last blocks finish. The other forms
    // wait first.
    const bool early = k_new != nullptr;
    if (!early) {
        wait_for_previous();
        start_next();
    }
    const int split = blockIdx.x, h = blockIdx.y;
    const int kvh = h / (heads / kv_heads);
    const int64_t p0 = pos[0];
    const int64_t last = min64(p0 + n_tokens, cache_rows);  // keys [0, last): the filled prefix
    const int64_t chunk = run_chunk(last, n_splits, min_chunk);
    const int64_t begin = split * chunk;
    if (begin >= last) {  // the same for the whole block: an idle split of a short prefix
        // no keys at all (pos <= -n_tokens): no split writes partials, so split 0 writes the zeros
        if (last <= 0 && split == 0) {
            if (early) wait_for_previous();
            merge_splits<T, DH, EXACT>(out, 0, chunk, n_tokens, heads, h, n_splits, dh);
        }
        return;
    }
    const int64_t end = min64(begin + chunk, last);
    const int lane = threadIdx.x % LANES, group = threadIdx.x / LANES;
    const int warp = threadIdx.x / 32;
    const int e0 = lane * V;  // the lane's first element of a row
    const int64_t row_stride = static_cast<int64_t>(kv_heads) * dh;
    const T* k_lane = k + static_cast<int64_t>(kvh) * dh + e0;
    const T* v_lane = v + static_cast<int64_t>(kvh) * dh + e0;
    // attention_append: cache rows from p0 on are this run's, in k_new and v_new (rows j - p0)
    const int64_t cached_end = min64(end, early ? p0 : last), fresh_begin = max64(begin, cached_end);
    // KEYS keys per group per step, all loaded before the first is scored: a split is a few dozen
    // keys, and one round trip to memory for all of them beats one per key. The first step's
    // loads are issued here, the next step's at the end of each step.
    Packet<T, V> kr[KEYS], vr[KEYS];  // raw bits: half the registers of floats for f16 and bf16
    load_keys<T, EXACT, KEYS, GROUPS>(kr, vr, k_lane, v_lane, row_stride, begin + group, cached_end, e0, dh);
    if (early) {
        wait_for_previous();
        start_next();
    }

    float qv[NT][V];
    float m[NT], l[NT], acc[NT][V];
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        m[t] = -INFINITY;
        l[t] = 0.0f;
#pragma unroll
        for (int e = 0; e < V; ++e) qv[t][e] = acc[t][e] = 0.0f;
        if (t < n_tokens) {
            const T* q_row = q + (static_cast<int64_t>(t) * heads + h) * dh;
            if (inv_freq == nullptr) {
                unpack<T>(load_packet<T, V, EXACT>(q_row + e0, e0, dh), qv[t]);
            } else {  // attention_rope: q as RoPE leaves it, at position pos + t
#pragma unroll
                for (int e = 0; e < V; ++e) {
                    if (e0 + e < dh) {
                        qv[t][e] = rotated(q_row, e0 + e, dh, static_cast<float>(p0 + t), inv_freq, layout);
                    }
                }
            }
#pragma unroll
            for (int e = 0; e < V; ++e) qv[t][e] *= scale_log2;
        }
    }
    // attention_append: the rows from pos on (n_tokens at most, usually one) are this run's k_new and
    // v_new. The block turns the keys it owns once, into shared memory (the scoring loop below then
    // holds no RoPE), and the kv head's first query head stores them, and the values, in the caches.
    const bool writer = h % (heads / kv_heads) == 0;
    __shared__ float s_knew[DECODE_MAX_TOKENS][DH];
    if (fresh_begin < end) {  // the same for the whole block
        for (int i = threadIdx.x; i < (end - fresh_begin) * DH; i += DECODE_THREADS) {
            const int r = i / DH, d = i % DH;
            if (d >= dh) {  // the general path's padding: zeros, as load_packet gives past dh
                s_knew[r][d] = 0.0f;
                continue;
            }
            const int64_t j = fresh_begin + r, at = (j - p0) * row_stride + static_cast<int64_t>(kvh) * dh + d;
            const T* row = k_new + at - d;
            const float kv = inv_freq == nullptr ? to_f(row[d])
                                                 : rotated(row, d, dh, static_cast<float>(j), inv_freq, layout);
            s_knew[r][d] = kv;  // rounded to T already, as rope_kv_update stores it
            if (writer) {
                const int64_t to = j * row_stride + static_cast<int64_t>(kvh) * dh + d;
                const_cast<T*>(k)[to] = from_f<T>(kv);
                const_cast<T*>(v)[to] = v_new[at];
            }
        }
        __syncthreads();
    }
    for (int64_t base = begin; base < cached_end; base += GROUPS * KEYS) {  // uniform: every warp, every step
#pragma unroll
        for (int b = 0; b < KEYS; ++b) {
            const int64_t j = base + b * GROUPS + group;
            float kf[V], vf[V];
            unpack<T>(kr[b], kf);
            unpack<T>(vr[b], vf);
            score_key<NT, V, LANES>(qv, kf, vf, j < cached_end, j, p0, n_tokens, m, l, acc);
        }
        load_keys<T, EXACT, KEYS, GROUPS>(kr, vr, k_lane, v_lane, row_stride, base + GROUPS * KEYS + group,
                                          cached_end, e0, dh);
    }
    for (int64_t base = fresh_begin; base < end; base += GROUPS) {  // uniform, as above
        const int64_t j = base + group;
        float kf[V], vf[V];
#pragma unroll
        for (int e = 0; e < V; ++e) kf[e] = vf[e] = 0.0f;
        if (j < end) {
            const int64_t at = (j - p0) * row_stride + static_cast<int64_t>(kvh) * dh + e0;
            unpack<T>(load_packet<T, V, EXACT>(v_new + at, e0, dh), vf);
#pragma unroll
            for (int e = 0; e < V; ++e) kf[e] = s_knew[j - fresh_begin][e0 + e];
        }
        score_key<NT, V, LANES>(qv, kf, vf, j < end, j, p0, n_tokens, m, l, acc);
    }
    // merge the groups of a warp: lane i of a group meets lane i of the others (same elements)
#pragma unroll
    for (int off = LANES; off < 32; off *= 2) {
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            float acc2[V];
            const float m2 = __shfl_xor_sync(0xffffffffu, m[t], off);
            const float l2 = __shfl_xor_sync(0xffffffffu, l[t], off);
#pragma unroll
            for (int e = 0; e < V; ++e) acc2[e] = __shfl_xor_sync(0xffffffffu, acc[t][e], off);
            merge(m[t], l[t], acc[t], m2, l2, acc2);
        }
    }
    // then the warps, through shared memory: the first group of each warp holds its warp's sums
    if (threadIdx.x % 32 < LANES) {
#pragma unroll
        for (int t = 0; t < NT; ++t) {  // unrolled: registers indexed by constants only
            if (t >= n_tokens) break;
#pragma unroll
            for (int e = 0; e < V; ++e) s_acc[warp][t][e0 + e] = acc[t][e];
            if (lane == 0) {
                s_m[warp][t] = m[t];
                s_l[warp][t] = l[t];
            }
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n_tokens * DH; i += DECODE_THREADS) {
        const int t = i / DH, e = i % DH;
        float mt = -INFINITY;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) mt = fmaxf(mt, s_m[w][t]);
        float lt = 0.0f, at = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) {
            const float f = rescale(s_m[w][t], mt);
            lt += s_l[w][t] * f;
            at += s_acc[w][t][e] * f;
        }
        const int64_t row = (static_cast<int64_t>(h) * n_splits + split) * n_tokens + t;
        g_partial_acc[row * DH + e] = at;
        if (e == 0) g_partial_ml[row] = make_float2(mt, lt);
    }
    // The last of the head's working blocks to get here merges: each block makes its partials
    // visible to the whole GPU before it counts itself, so the one that counts last sees them all.
    __shared__ bool s_last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned int working = static_cast<unsigned int>((last + chunk - 1) / chunk);  // splits with keys
        s_last = atomicAdd(&g_arrived[h], 1u) == working - 1;
        if (s_last) g_arrived[h] = 0;  // every working block has counted: ready for the next launch
    }
    __syncthreads();
    if (s_last) merge_splits<T, DH, EXACT>(out, last, chunk, n_tokens, heads, h, n_splits, dh);
    // TODO(lab5/02) end
}

// prefill: block (query tile, h) holds BQ queries of head h; the block walks the keys they see in
// tiles of BK, staged (as float32) in shared memory, and each warp keeps the online softmax of its
// ROWS queries. A lane owns one key of the tile for the scores and DH / 32 elements of the output.
constexpr int PREFILL_WARPS = 4;
constexpr int ROWS = 4;                     // queries per warp
constexpr int BQ = PREFILL_WARPS * ROWS;   // queries per block
constexpr int BK = 32;                      // keys per tile: one per lane
static_assert(BK == 32, "a key tile has one key per lane of a warp");

// The prefill kernel's shared memory, every row DH floats (zeros past dh on the general path).
template <int DH>
struct PrefillTiles {
    float (&q)[BQ][DH];                   // the block's queries, rotated and scaled
    float (&k)[BK][DH + 1];               // a tile of keys; +1: lane j reads row j, the rows fall in different banks
    float (&v)[BK][DH];                   // their values
    float (&p)[PREFILL_WARPS][ROWS][BK];  // each warp's weights of the tile's keys
};

template <int DH>
constexpr int PREFILL_SMEM =
    static_cast<int>(sizeof(float)) * (BQ * DH + BK * (DH + 1) + BK * DH + PREFILL_WARPS * ROWS * BK);

// Past 48 KB a block's shared memory must be dynamic, and its kernel opt in from the host: DH 256 (82 KB).
template <int DH>
constexpr int PREFILL_DYNAMIC_SMEM = PREFILL_SMEM<DH> > 48 * 1024 ? PREFILL_SMEM<DH> : 0;

template <int DH>
__device__ __forceinline__ PrefillTiles<DH> prefill_tiles() {
    if constexpr (PREFILL_DYNAMIC_SMEM<DH> == 0) {
        __shared__ __align__(16) float q[BQ][DH];
        __shared__ float k[BK][DH + 1];
        __shared__ __align__(16) float v[BK][DH];
        __shared__ __align__(16) float p[PREFILL_WARPS][ROWS][BK];
        return {q, k, v, p};
    } else {  // the arrays one after the other, each on a 16-byte boundary (BQ, BK and DH: multiples of 4)
        extern __shared__ __align__(16) float prefill_smem[];
        float* at = prefill_smem;
        auto& q = *reinterpret_cast<float(*)[BQ][DH]>(at);
        auto& k = *reinterpret_cast<float(*)[BK][DH + 1]>(at += BQ * DH);
        auto& v = *reinterpret_cast<float(*)[BK][DH]>(at += BK * (DH + 1));
        auto& p = *reinterpret_cast<float(*)[PREFILL_WARPS][ROWS][BK]>(at += BK * DH);
        return {q, k, v, p};
    }
}

template <typename T, int DH, bool EXACT>
__global__ void __launch_bounds__(PREFILL_WARPS * 32)
    attention_prefill_kernel(T* __restrict__ out, const T* __restrict__ q, const T* __restrict__ k,
                             const T* __restrict__ v, const int64_t* __restrict__ pos,
                             const float* __restrict__ inv_freq, int layout, int64_t n_tokens, int heads, int kv_heads,
                             int head_dim, int64_t cache_rows, float scale_log2) {
    wait_for_previous();
    start_next();
    const PrefillTiles<DH> tiles = prefill_tiles<DH>();
    auto& s_q = tiles.q;
    auto& s_k = tiles.k;
    auto& s_v = tiles.v;
    auto& s_p = tiles.p;
    [[maybe_unused]] const int dh = EXACT ? DH : head_dim;  // the exact path's: a constant in every index
    // TODO(lab5/02) begin: stage the block's queries (turned when inv_freq is given, scaled by scale_log2); walk the key tiles up to the last key the block's last query may see, never past it: stage K and V, score, mask key > pos + t, the online softmax per query, acc += p * V; write acc / l rounded once, the elements below dh only; see the chapter's section "Flash attention"; about 75 lines.
    constexpr int PER_LANE = DH / 32;
    const int h = blockIdx.y, kvh = h / (heads / kv_heads);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t q0 = static_cast<int64_t>(blockIdx.x) * BQ;
    const int64_t p0 = pos[0];
    for (int i = threadIdx.x; i < BQ * DH; i += blockDim.x) {
        const int r = i / DH, d = i % DH;
        const int64_t t = q0 + r;
        float qd = 0.0f;
        if (t < n_tokens && d < dh) {
            const T* q_row = q + (t * heads + h) * dh;
            qd = inv_freq == nullptr ? to_f(q_row[d]) : rotated(q_row, d, dh, static_cast<float>(p0 + t), inv_freq, layout);
        }
        s_q[r][d] = qd * scale_log2;
    }
    // the keys this block may read: up to the last query's own position
    const int64_t kmax = max64(0, min64(p0 + min64(q0 + BQ, n_tokens), cache_rows));
    float m[ROWS], l[ROWS], acc[ROWS][PER_LANE];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
#pragma unroll
        for (int i = 0; i < PER_LANE; ++i) acc[r][i] = 0.0f;
    }
    const int64_t row_stride = static_cast<int64_t>(kv_heads) * dh;
    for (int64_t k0 = 0; k0 < kmax; k0 += BK) {
        __syncthreads();  // the last tile is consumed (and, the first time, s_q is written)
        for (int i = threadIdx.x; i < BK * DH; i += blockDim.x) {
            const int r = i / DH, d = i % DH;
            const int64_t j = k0 + r;
            const bool in = j < kmax && d < dh;
            s_k[r][d] = in ? to_f(k[j * row_stride + kvh * dh + d]) : 0.0f;
            s_v[r][d] = in ? to_f(v[j * row_stride + kvh * dh + d]) : 0.0f;
        }
        __syncthreads();
        float s[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) s[r] = 0.0f;
#pragma unroll 4
        for (int d = 0; d < DH; d += 4) {
            const float k0v = s_k[lane][d], k1v = s_k[lane][d + 1], k2v = s_k[lane][d + 2], k3v = s_k[lane][d + 3];
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                const float4 qq = *reinterpret_cast<const float4*>(&s_q[warp * ROWS + r][d]);  // a broadcast
                s[r] += qq.x * k0v + qq.y * k1v + qq.z * k2v + qq.w * k3v;
            }
        }
        const int64_t j = k0 + lane;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const int64_t t = q0 + warp * ROWS + r;
            const bool ok = t < n_tokens && j <= p0 + t && j < kmax;
            const float sv = ok ? s[r] : -INFINITY;
            const float mn = fmaxf(m[r], warp_max(sv));
            const float p = ok ? exp2f(sv - mn) : 0.0f;
            const float a = rescale(m[r], mn);
            l[r] = l[r] * a + warp_sum(p);
#pragma unroll
            for (int i = 0; i < PER_LANE; ++i) acc[r][i] *= a;
            m[r] = mn;
            s_p[warp][r][lane] = p;
        }
        __syncwarp();
#pragma unroll 2
        for (int jj = 0; jj < BK; jj += 4) {
            float4 pr[ROWS];
#pragma unroll
            for (int r = 0; r < ROWS; ++r) pr[r] = *reinterpret_cast<const float4*>(&s_p[warp][r][jj]);
#pragma unroll
            for (int i = 0; i < PER_LANE; ++i) {
                const int d = lane + 32 * i;
                const float v0 = s_v[jj][d], v1 = s_v[jj + 1][d], v2 = s_v[jj + 2][d], v3 = s_v[jj + 3][d];
#pragma unroll
                for (int r = 0; r < ROWS; ++r) acc[r][i] += pr[r].x * v0 + pr[r].y * v1 + pr[r].z * v2 + pr[r].w * v3;
            }
        }
        __syncwarp();  // s_p is rewritten by the next tile
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const int64_t t = q0 + warp * ROWS + r;
        if (t >= n_tokens) continue;
        const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
#pragma unroll
        for (int i = 0; i < PER_LANE; ++i) {
            if (lane + 32 * i < dh) out[(t * heads + h) * dh + lane + 32 * i] = from_f<T>(acc[r][i] * inv);
        }
    }
    // TODO(lab5/02) end
}

// What attention_rope adds: RoPE's frequencies and layout for the queries (inv_freq null: none).
struct QueryRope {
    const float* inv_freq;
    int layout;
};

// What attention_append adds: this run's keys and values, written into the caches by the kernel
// (null: plain attention, the caches already hold them).
struct NewRows {
    const void* k;
    const void* v;
};

// One path of attention: the specialised kernels (EXACT, dh = DH) or the general path's instantiation
// for dh <= DH.
template <typename T, int DH, bool EXACT>
static cudaError_t attention_dh(T* out, const T* q, const T* k, const T* v, const int64_t* pos, QueryRope rope,
                                NewRows fresh, int64_t n_tokens, int64_t heads, int64_t kv_heads, int64_t dh,
                                int64_t cache_rows, float scale, cudaStream_t stream) {
    const float scale_log2 = scale * LOG2E;
    const int64_t rows_per_split = heads * n_tokens;  // partial rows one split of every head fills
    if (n_tokens <= DECODE_MAX_TOKENS && rows_per_split <= SCRATCH_ROWS) {
        // as many splits as a full cache needs at MIN_CHUNK keys each, as many as fit the scratch;
        // the launch is fixed for the graph's lifetime, and each run shares its prefix out over
        // them (run_chunk), the splits past it returning at once
        int64_t splits = (cache_rows + MIN_CHUNK - 1) / MIN_CHUNK;
        splits = min64(splits, min64(MAX_SPLITS, SCRATCH_ROWS / rows_per_split));
        splits = max64(splits, 1);
        const int64_t chunk = MIN_CHUNK;
        if (heads > 65535) return cudaErrorInvalidValue;
        const dim3 grid(static_cast<unsigned int>(splits), static_cast<unsigned int>(heads));
        // one query (decode proper) keeps a quarter of the registers: more blocks fit an SM. The
        // general path is compiled once, for up to DECODE_MAX_TOKENS queries: it is not worth the
        // build time of a second form
        auto* split_kernel = attention_split_kernel<T, DH, DECODE_MAX_TOKENS, EXACT>;
        if constexpr (EXACT) {
            if (n_tokens == 1) split_kernel = attention_split_kernel<T, DH, 1, EXACT>;
        }
        launch_chained(split_kernel, grid, dim3(DECODE_THREADS), stream, out, q, k, v, static_cast<const T*>(fresh.k),
                       static_cast<const T*>(fresh.v), pos, rope.inv_freq, rope.layout,
                       static_cast<int>(n_tokens), static_cast<int>(heads), static_cast<int>(kv_heads),
                       static_cast<int>(dh), cache_rows, chunk, static_cast<int>(splits), scale_log2);
        return cudaGetLastError();
    }
    if (fresh.k != nullptr) return cudaErrorInvalidValue;  // the prefill kernel reads every key from the cache
    const int64_t tiles = (n_tokens + BQ - 1) / BQ;
    if (tiles > 0x7fffffff || heads > 65535) return cudaErrorInvalidValue;
    const dim3 grid(static_cast<unsigned int>(tiles), static_cast<unsigned int>(heads));
    auto* prefill_kernel = attention_prefill_kernel<T, DH, EXACT>;
    constexpr int smem = PREFILL_DYNAMIC_SMEM<DH>;
    if constexpr (smem > 0) {
        // an attribute of the kernel on a device, not a stream operation (a CUDA graph may be capturing
        // the stream): set on the first launch on each device, as the runtime may make it wait for
        // copies in flight
        static std::atomic<unsigned long long> opted_in{0};  // a bit per device
        int device = 0;
        cudaError_t e = cudaGetDevice(&device);
        if (e != cudaSuccess) return e;
        const unsigned long long bit = device < 64 ? 1ull << device : 0;  // past 64 devices: every launch
        if ((opted_in.load() & bit) == 0) {
            e = cudaFuncSetAttribute(prefill_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
            if (e != cudaSuccess) return e;
            opted_in.fetch_or(bit);
        }
    }
    prefill_kernel<<<grid, PREFILL_WARPS * 32, smem, stream>>>(out, q, k, v, pos, rope.inv_freq, rope.layout, n_tokens,
                                                               static_cast<int>(heads), static_cast<int>(kv_heads),
                                                               static_cast<int>(dh), cache_rows, scale_log2);
    return cudaGetLastError();
}

static bool aligned4(const void* p) { return reinterpret_cast<uintptr_t>(p) % 4 == 0; }

template <typename T>
static cudaError_t attention(T* out, const T* q, const T* k, const T* v, const int64_t* pos, QueryRope rope,
                             int64_t n_tokens, int64_t heads, int64_t kv_heads, int64_t dh, int64_t cache_rows,
                             float scale, cudaStream_t stream, NewRows fresh = NewRows{nullptr, nullptr}) {
    if (n_tokens < 1 || heads < 1 || kv_heads < 1 || heads % kv_heads != 0 || cache_rows < 1) {
        return cudaErrorInvalidValue;
    }
    if (dh < MIN_DH || dh > MAX_DH || dh % 2 != 0) return cudaErrorInvalidValue;
    if (rope.inv_freq != nullptr && rope.layout != 0 && rope.layout != 1) return cudaErrorInvalidValue;
    if ((fresh.k == nullptr) != (fresh.v == nullptr)) return cudaErrorInvalidValue;
    // the general path reads 32-bit words: with dh even, every row of an aligned tensor starts on 4 bytes
    if (!aligned4(q) || !aligned4(k) || !aligned4(v) || !aligned4(fresh.k) || !aligned4(fresh.v)) {
        return cudaErrorInvalidValue;
    }
    // the specialised kernels, for the head dims of the usual checkpoints (Llama 2 and 3: 128; Llama
    // 3.2 1B, TinyLlama: 64), read rows as 16-byte vectors (k_new element by element); the general
    // path, slower (32-bit loads, rows padded to DH), takes the rest, the tiny model's 32 too
    const bool vectors = aligned16(q) && aligned16(k) && aligned16(v) && aligned16(fresh.v);
    if (vectors && dh == 64) {
        return attention_dh<T, 64, true>(out, q, k, v, pos, rope, fresh, n_tokens, heads, kv_heads, dh, cache_rows,
                                         scale, stream);
    }
    if (vectors && dh == 128) {
        return attention_dh<T, 128, true>(out, q, k, v, pos, rope, fresh, n_tokens, heads, kv_heads, dh, cache_rows,
                                          scale, stream);
    }
    // the general path: the smallest instantiation that holds dh
    if (dh <= 64) {
        return attention_dh<T, 64, false>(out, q, k, v, pos, rope, fresh, n_tokens, heads, kv_heads, dh, cache_rows,
                                          scale, stream);
    }
    if (dh <= 128) {
        return attention_dh<T, 128, false>(out, q, k, v, pos, rope, fresh, n_tokens, heads, kv_heads, dh, cache_rows,
                                           scale, stream);
    }
    return attention_dh<T, 256, false>(out, q, k, v, pos, rope, fresh, n_tokens, heads, kv_heads, dh, cache_rows,
                                       scale, stream);
}

// ---- the C entry points: each template three times --------------------------------------------------

#define KILN_LLM_DEFINE(SUFFIX, T)                                                                                    \
    COURSE_API cudaError_t kiln_embedding_##SUFFIX(T* out, const T* table, const int64_t* tokens, int64_t n_tokens,   \
                                                   int64_t vocab, int64_t d, cudaStream_t stream) {                  \
        return copy_rows<T>(0, out, table, tokens, n_tokens, vocab, d, stream);                                      \
    }                                                                                                                \
    COURSE_API cudaError_t kiln_rmsnorm_##SUFFIX(T* out, const T* x, const T* w, int64_t rows, int64_t d, float eps, \
                                                 cudaStream_t stream) {                                              \
        return rmsnorm<T>(out, x, w, rows, d, eps, stream);                                                          \
    }                                                                                                                \
    COURSE_API cudaError_t kiln_rope_##SUFFIX(T* out, const T* x, const int64_t* pos, const float* inv_freq,          \
                                              int64_t n_tokens, int64_t heads, int64_t dh, int layout,              \
                                              cudaStream_t stream) {                                                 \
        return rope<T>(out, x, pos, inv_freq, n_tokens, heads, dh, layout, -1, stream);                              \
    }                                                                                                                \
    COURSE_API cudaError_t kiln_kv_update_##SUFFIX(T* cache, const T* value, const int64_t* pos, int64_t cache_rows, \
                                                   int64_t n_tokens, int64_t row_elems, cudaStream_t stream) {       \
        return copy_rows<T>(1, cache, value, pos, n_tokens, cache_rows, row_elems, stream);                          \
    }                                                                                                                \
    COURSE_API cudaError_t kiln_attention_##SUFFIX(T* out, const T* q, const T* k, const T* v, const int64_t* pos,    \
                                                   int64_t n_tokens, int64_t heads, int64_t kv_heads, int64_t dh,   \
                                                   int64_t cache_rows, float scale, cudaStream_t stream) {          \
        return attention<T>(out, q, k, v, pos, QueryRope{nullptr, 0}, n_tokens, heads, kv_heads, dh, cache_rows,    \
                            scale, stream);                                                                          \
    }                                                                                                                \
    COURSE_API cudaError_t kiln_rope_kv_update_##SUFFIX(T* cache, const T* value, const int64_t* pos,              \
                                                        const float* inv_freq, int64_t cache_rows, int64_t n_tokens, \
                                                        int64_t heads, int64_t dh, int layout, cudaStream_t stream) { \
        if (cache_rows < 0) return cudaErrorInvalidValue;                                                            \
        return rope<T>(cache, value, pos, inv_freq, n_tokens, heads, dh, layout, cache_rows, stream);               \
    }                                                                                                                \
    COURSE_API cudaError_t kiln_attention_rope_##SUFFIX(                                                            \
        T* out, const T* q, const T* k, const T* v, const int64_t* pos, const float* inv_freq, int layout,          \
        int64_t n_tokens, int64_t heads, int64_t kv_heads, int64_t dh, int64_t cache_rows, float scale,             \
        cudaStream_t stream) {                                                                                       \
        if (inv_freq == nullptr) return cudaErrorInvalidValue;                                                       \
        return attention<T>(out, q, k, v, pos, QueryRope{inv_freq, layout}, n_tokens, heads, kv_heads, dh,          \
                            cache_rows, scale, stream);                                                              \
    }                                                                                                                \
    COURSE_API cudaError_t kiln_attention_append_##SUFFIX(                                                          \
        T* out, const T* q, const T* k_new, const T* v_new, T* k, T* v, const int64_t* pos, const float* inv_freq,  \
        int layout, int64_t n_tokens, int64_t heads, int64_t kv_heads, int64_t dh, int64_t cache_rows, float scale, \
        cudaStream_t stream) {                                                                                       \
        if (inv_freq == nullptr || k_new == nullptr || v_new == nullptr) return cudaErrorInvalidValue;              \
        return attention<T>(out, q, k, v, pos, QueryRope{inv_freq, layout}, n_tokens, heads, kv_heads, dh,          \
                            cache_rows, scale, stream, NewRows{k_new, v_new});                                       \
    }

KILN_LLM_DEFINE(f32, float)
KILN_LLM_DEFINE(f16, __half)
KILN_LLM_DEFINE(bf16, __nv_bfloat16)

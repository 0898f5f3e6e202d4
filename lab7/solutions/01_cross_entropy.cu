// Lab 7 · Task 01 — Fused softmax + cross-entropy, forward and backward in one kernel
//
// Implement: cross_entropy_f32 and cross_entropy_bf16: for every row of logits, the cross-entropy
//            loss of its target and the gradient of that loss with respect to the row's logits,
//            in one kernel launch that reads the row in chunks (an online max and sum of exp) and
//            never materialises the probabilities: one block per row, a first pass folds the row
//            into its (max, sum of exp), a second pass writes the gradient.
// Contract:  logits: DEVICE (rows, V) row-major and contiguous, float32 (cross_entropy_f32) or
//            bfloat16 (cross_entropy_bf16), 4-byte (2-byte) aligned, finite. target: DEVICE int64
//            (rows,). dloss: DEVICE float32 (rows,), the gradient of the final loss with respect
//            to loss[r] (a mean over N counted rows passes 1/N for each). loss: DEVICE float32
//            (rows,). dlogits: DEVICE (rows, V) of the logits' dtype. 1 <= rows, 1 <= V,
//            rows * V may pass 2^31 (64-bit offsets). Sums and exponentials in float32 for both
//            dtypes; dlogits rounded once to its dtype, at the store.
//            For a row whose target t is in [0, V) and is not ignore_index:
//              loss[r] = log(sum_j exp(logits[r, j])) - logits[r, t]
//              dlogits[r, j] = dloss[r] * (softmax(logits[r])_j - (j == t ? 1 : 0))
//            for a row whose target == ignore_index (checked first: ignore_index may lie inside
//            [0, V)): loss[r] = 0 and dlogits[r, :] = 0 exactly; for a row whose target is any
//            other value outside [0, V): loss[r] = NaN and dlogits[r, :] = NaN (never a read
//            outside the row).
//            In place: dlogits may be the same buffer as logits (llm.c's trick: the logits are
//            dead once their gradient exists); otherwise the two do not overlap and logits,
//            target and dloss are not modified. No overlap between loss and any other buffer.
//            Everything runs on `stream`; no synchronisation, no allocation. Returns
//            cudaErrorInvalidValue for rows < 1 or V < 1, else the launch error.
// Test:      make test-lab7 TASK=01

#include <cfloat>
#include <cstddef>
#include <cstdint>

#include <cuda_bf16.h>

#include "course.h"

[[maybe_unused]] constexpr int WARP = 32;  // threads of a warp
[[maybe_unused]] constexpr unsigned FULL = 0xffffffffu;  // every lane takes part in a shuffle

// ---------------------------------------------------------------------------------------------
// Given: a float from either element type and back, and a pack of 16 bytes of elements (one
// 128-bit load or store: 4 floats or 8 bfloat16s), which needs a 16-byte-aligned address.
// ---------------------------------------------------------------------------------------------

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
    return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}

template <typename T>
struct alignas(16) Pack {
    static constexpr int N = 16 / sizeof(T);
    T v[N];
};

// How many elements of type T lie before the first 16-byte boundary at or after p (0 to N - 1):
// a row of logits starts wherever r * V elements put it, so each row has its own head.
template <typename T>
__device__ __forceinline__ int head_of(const void* p) {
    return (int)(((16u - (unsigned)(reinterpret_cast<uintptr_t>(p) & 15u)) & 15u) / sizeof(T));
}

// TODO(lab7/01) begin: the running (max, sum of exp) of a thread's values: fold one value and a whole Pack into it (rescale the sum when the max grows), merge two of them, and a block-wide merge that hands the row's pair to every thread (warp shuffles, then one value per warp through shared memory); see the chapter's section "Online softmax, once more"; about 50 lines; try V = 1 with 32 threads (31 of them hold no value).
// The pair of a set of values: m its max, s the sum of exp(value - m). The empty set is
// (-FLT_MAX, 0): a finite m keeps exp(m_a - m_b) finite, so merging two empty pairs gives an
// empty pair, never a NaN (exp(-inf - -inf) would be one).
struct MaxSum {
    float m;
    float s;
};

__device__ __forceinline__ MaxSum fold(MaxSum a, float x) {
    if (x > a.m) return {x, a.s * __expf(a.m - x) + 1.0f};
    return {a.m, a.s + __expf(x - a.m)};
}

template <typename T>
__device__ __forceinline__ MaxSum fold(MaxSum a, const Pack<T>& p) {
    float mx = to_float(p.v[0]);
#pragma unroll
    for (int k = 1; k < Pack<T>::N; ++k) mx = fmaxf(mx, to_float(p.v[k]));
    if (mx > a.m) {  // one rescale per pack, not per element
        a.s *= __expf(a.m - mx);
        a.m = mx;
    }
#pragma unroll
    for (int k = 0; k < Pack<T>::N; ++k) a.s += __expf(to_float(p.v[k]) - a.m);
    return a;
}

__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
    const float m = fmaxf(a.m, b.m);
    return {m, a.s * __expf(a.m - m) + b.s * __expf(b.m - m)};
}

__device__ __forceinline__ MaxSum warp_merge(MaxSum a) {
#pragma unroll
    for (int offset = WARP / 2; offset > 0; offset /= 2)
        a = merge(a, {__shfl_xor_sync(FULL, a.m, offset), __shfl_xor_sync(FULL, a.s, offset)});
    return a;
}

// Every thread of the block gets the block's pair. THREADS / WARP values go through `scratch`.
template <int THREADS>
__device__ __forceinline__ MaxSum block_merge(MaxSum a, MaxSum* scratch) {
    a = warp_merge(a);
    if constexpr (THREADS == WARP) {
        __syncwarp();  // orders the lanes' reads of the row before any lane's first write
        return a;
    } else {
        const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
        if (lane == 0) scratch[warp] = a;
        __syncthreads();
        a = lane < THREADS / WARP ? scratch[lane] : MaxSum{-FLT_MAX, 0.0f};
        return warp_merge(a);
    }
}
// TODO(lab7/01) end

// TODO(lab7/01) begin: the kernel, block blockIdx.x on row blockIdx.x: read the target (and its logit, before anything is written: dlogits may be logits), handle the ignored and the invalid rows, fold the row into one (max, sum) in a first pass (a scalar head up to the row's first 16-byte boundary, Packs, a scalar tail), merge it over the block, write loss[r] from thread 0, then a second pass writes dloss * (softmax - one-hot), by Packs where logits and dlogits sit alike on the 16-byte grid, else element by element; see the chapter's section "Task 01: one kernel, two passes over the row"; about 70 lines; try V = 1, 7 (all head and tail), 4099 and 50257 in both dtypes, and dlogits == logits.
// logits (rows, V) -> loss (rows,), dlogits (rows, V); block r owns row r. logits and dlogits
// may be one buffer: each element is read before it is written, by the thread that writes it,
// and the target's logit is read before the barrier that precedes every write.
template <typename T, int THREADS>
__global__ void __launch_bounds__(THREADS)
    cross_entropy_kernel(const T* logits, const int64_t* __restrict__ target, const float* __restrict__ dloss,
                         float* __restrict__ loss, T* dlogits, int V, int64_t ignore_index, bool aligned_alike) {
    __shared__ MaxSum scratch[THREADS / WARP];
    using P = Pack<T>;
    constexpr int N = P::N;
    const int tid = threadIdx.x;
    const size_t row = blockIdx.x;
    const T* x = logits + row * (size_t)V;
    T* g = dlogits + row * (size_t)V;
    const int64_t t = target[row];

    if (t == ignore_index || t < 0 || t >= V) {  // no logit is read: only written
        const float fill = t == ignore_index ? 0.0f : __int_as_float(0x7fc00000);  // 0 or NaN
        if (tid == 0) loss[row] = fill;
        const int head = min(V, head_of<T>(g));
        const int packs = (V - head) / N;
        P p;
#pragma unroll
        for (int k = 0; k < N; ++k) p.v[k] = from_float<T>(fill);
        for (int j = tid; j < head; j += THREADS) g[j] = from_float<T>(fill);
        for (int i = tid; i < packs; i += THREADS) *reinterpret_cast<P*>(g + head + (size_t)i * N) = p;
        for (int j = head + packs * N + tid; j < V; j += THREADS) g[j] = from_float<T>(fill);
        return;
    }
    const float x_t = to_float(x[t]);  // before the barrier below: every write comes after it

    // pass 1: (max, sum of exp) of the row, one read of it
    const int head = min(V, head_of<T>(x));
    const int packs = (V - head) / N;
    const int tail = head + packs * N;
    MaxSum a{-FLT_MAX, 0.0f};
    for (int j = tid; j < head; j += THREADS) a = fold(a, to_float(x[j]));
    for (int i = tid; i < packs; i += THREADS) a = fold(a, *reinterpret_cast<const P*>(x + head + (size_t)i * N));
    for (int j = tail + tid; j < V; j += THREADS) a = fold(a, to_float(x[j]));
    a = block_merge<THREADS>(a, scratch);

    // the loss: m - x_t is exact for nearby values (Sterbenz), so a loss near 0 keeps its digits
    if (tid == 0) loss[row] = (a.m - x_t) + logf(a.s);

    // pass 2: dlogits = dloss * (exp(x - m) / s - onehot), the row read a second time. Backward
    // over the packs: the first pass ended at the row's end, whose chunks are likeliest in L2 still
    const float scale = dloss[row];
    const float inv_s = 1.0f / a.s;
    if (aligned_alike) {
        for (int j = tid; j < head; j += THREADS)
            g[j] = from_float<T>(scale * (__expf(to_float(x[j]) - a.m) * inv_s - (j == t ? 1.0f : 0.0f)));
        for (int i = packs - 1 - tid; i >= 0; i -= THREADS) {
            const int j0 = head + i * N;
            P p = *reinterpret_cast<const P*>(x + j0);
#pragma unroll
            for (int k = 0; k < N; ++k) {
                const float prob = __expf(to_float(p.v[k]) - a.m) * inv_s;
                p.v[k] = from_float<T>(scale * (prob - (j0 + k == t ? 1.0f : 0.0f)));
            }
            *reinterpret_cast<P*>(g + j0) = p;
        }
        for (int j = tail + tid; j < V; j += THREADS)
            g[j] = from_float<T>(scale * (__expf(to_float(x[j]) - a.m) * inv_s - (j == t ? 1.0f : 0.0f)));
    } else {  // logits and dlogits on different 16-byte grids: element by element
        for (int j = tid; j < V; j += THREADS)
            g[j] = from_float<T>(scale * (__expf(to_float(x[j]) - a.m) * inv_s - (j == t ? 1.0f : 0.0f)));
    }
}
// TODO(lab7/01) end

// One block per row; its size grows with V: one warp for short rows (no shared memory, no
// barrier), 1024 threads for a vocabulary (50257 floats: 13 packs per thread and pass). Two such
// blocks fit an SM: 264 rows in flight on an H100, 53 MB of float32 rows against its 50 MB of L2.
template <typename T>
static cudaError_t cross_entropy(const T* logits, const int64_t* target, const float* dloss, float* loss,
                                 T* dlogits, int rows, int V, int64_t ignore_index, cudaStream_t stream) {
    // TODO(lab7/01) begin: refuse rows < 1 or V < 1, pick the block size for V, decide whether logits and dlogits sit alike on the 16-byte grid, launch one block per row on `stream` and return the launch error (CUDA_CHECK); about 15 lines.
    if (rows < 1 || V < 1) return cudaErrorInvalidValue;
    const bool aligned_alike = ((reinterpret_cast<uintptr_t>(logits) ^ reinterpret_cast<uintptr_t>(dlogits)) & 15u) == 0;
    const dim3 grid((unsigned)rows);
    if (V <= 2048) {
        cross_entropy_kernel<T, 32><<<grid, 32, 0, stream>>>(logits, target, dloss, loss, dlogits, V, ignore_index,
                                                             aligned_alike);
    } else if (V <= 16384) {
        cross_entropy_kernel<T, 256><<<grid, 256, 0, stream>>>(logits, target, dloss, loss, dlogits, V, ignore_index,
                                                               aligned_alike);
    } else {
        cross_entropy_kernel<T, 1024><<<grid, 1024, 0, stream>>>(logits, target, dloss, loss, dlogits, V,
                                                                 ignore_index, aligned_alike);
    }
    CUDA_CHECK(cudaGetLastError());
    return cudaSuccess;
    //~ return cudaErrorNotYetImplemented;
    // TODO(lab7/01) end
}

COURSE_API cudaError_t cross_entropy_f32(const float* logits, const int64_t* target, const float* dloss, float* loss,
                                         float* dlogits, int rows, int V, int64_t ignore_index, cudaStream_t stream) {
    return cross_entropy<float>(logits, target, dloss, loss, dlogits, rows, V, ignore_index, stream);
}

COURSE_API cudaError_t cross_entropy_bf16(const __nv_bfloat16* logits, const int64_t* target, const float* dloss,
                                          float* loss, __nv_bfloat16* dlogits, int rows, int V, int64_t ignore_index,
                                          cudaStream_t stream) {
    return cross_entropy<__nv_bfloat16>(logits, target, dloss, loss, dlogits, rows, V, ignore_index, stream);
}

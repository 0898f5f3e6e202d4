// Lab 7 · Task 05 — A fused multi-tensor AdamW: every parameter tensor of a model in one launch
//
// Implement: adamw_f32 and adamw_bf16_master: one step of AdamW (torch.optim.AdamW with
//            amsgrad=False, maximize=False) over a list of n tensors, in ONE kernel launch that
//            splits every tensor into chunks of CHUNK elements and spreads the chunks of all the
//            tensors over a fixed grid of blocks (a multi-tensor apply): a block maps each chunk
//            index to (tensor, offset) itself, through a table of each tensor's first chunk.
// Contract:  The tensors live in arenas: tensor i is the elements [offsets[i], offsets[i] + sizes[i])
//            of every arena, at the same offset in each. params, exp_avg, exp_avg_sq: DEVICE float32
//            arenas, updated in place. grads: DEVICE arena of float32 (adamw_f32) or bfloat16
//            (adamw_bf16_master), read only. adamw_bf16_master also writes weights: a DEVICE
//            bfloat16 arena, the model's bf16 copy, weights = bf16(params) (round to nearest even)
//            of the updated float32 master, for every element of every tensor. offsets, sizes:
//            DEVICE int64 (n,); sizes[i] >= 0 (an empty tensor is allowed and has no chunk); the
//            tensors do not overlap, and the elements of an arena that no tensor covers (the gaps
//            between tensors) are neither read nor written. No two arenas overlap. The tables are
//            on the device, as an optimizer builds them once and reuses them every step: the host
//            never reads them (that would synchronise, and a CUDA graph could not capture it).
//            1 <= n <= MAX_TENSORS, step >= 1 (the step this update makes: 1 for the first).
//            lr, beta1, beta2 in [0, 1), eps > 0, weight_decay >= 0. Per element, in float32
//            (t = step, bias corrections on the host in double):
//              p = p * (1 - lr * weight_decay)                  // decoupled decay, before the update
//              m = beta1 * m + (1 - beta1) * g
//              v = beta2 * v + (1 - beta2) * g * g
//              p = p - lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)    // eps outside
//            One kernel launch per call, on `stream`; no synchronisation, no allocation, 64-bit
//            offsets. Returns cudaErrorInvalidValue for n outside [1, MAX_TENSORS] or step < 1,
//            else the launch error.
// Test:      make test-lab7 TASK=05

#include <cmath>
#include <cstddef>
#include <cstdint>

#include <cuda_bf16.h>

#include "course.h"

[[maybe_unused]] constexpr int WARP = 32;  // threads of a warp
[[maybe_unused]] constexpr unsigned FULL = 0xffffffffu;  // every lane takes part in a shuffle
// a table of first chunks of this many tensors fits in 32 KB of shared memory
[[maybe_unused]] constexpr int MAX_TENSORS = 4096;
[[maybe_unused]] constexpr int THREADS = 256;  // threads of a block
[[maybe_unused]] constexpr int CHUNK = 4096;   // elements of a chunk: 16 per thread, 4 Packs of 4

// ---------------------------------------------------------------------------------------------
// Given: the step's constants, computed once on the host, and a pack of 4 elements (one 16-byte
// load of float32, one 8-byte load of bfloat16), which needs an address that is a multiple of
// its size.
// ---------------------------------------------------------------------------------------------

struct Hyper {
    float beta1, one_minus_beta1;  // m = beta1 * m + (1 - beta1) * g
    float beta2, one_minus_beta2;  // v = beta2 * v + (1 - beta2) * g * g
    float decay;                   // 1 - lr * weight_decay
    float step_size;               // lr / (1 - beta1^t)
    float inv_sqrt_bc2;            // 1 / sqrt(1 - beta2^t)
    float eps;
};

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
struct alignas(4 * sizeof(T)) Pack4 {
    T v[4];
};

// Whether p is a multiple of `bytes` (a power of two).
__device__ __forceinline__ bool on_grid(const void* p, unsigned bytes) {
    return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0;
}

// TODO(lab7/05) begin: the update of one element (the contract's four lines, in float32, with the Hyper's constants: decay before the update, eps outside the square root), and an exclusive prefix sum of one int64 per thread over the block (warp shuffles, then one total per warp through shared memory); see the chapter's section "One element of AdamW"; about 35 lines.
// One element of AdamW; the caller loads and stores.
__device__ __forceinline__ void adamw_element(float& p, float g, float& m, float& v, const Hyper& h) {
    m = fmaf(h.beta1, m, h.one_minus_beta1 * g);
    v = fmaf(h.beta2, v, h.one_minus_beta2 * g * g);
    const float denom = sqrtf(v) * h.inv_sqrt_bc2 + h.eps;  // sqrt(v / bc2) + eps
    p = p * h.decay - h.step_size * m / denom;              // decayed first, then the Adam step
}

// Each thread's `own` -> the sum of the owns of the threads before it; every thread calls it.
__device__ __forceinline__ long long block_exclusive_scan(long long own, long long* warp_totals) {
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    long long x = own;  // inclusive scan of the warp
#pragma unroll
    for (int d = 1; d < WARP; d *= 2) {
        const long long y = __shfl_up_sync(FULL, x, d);
        if (lane >= d) x += y;
    }
    if (lane == WARP - 1) warp_totals[warp] = x;
    __syncthreads();
    if (warp == 0) {  // the warps' totals, scanned by the first warp (THREADS / WARP <= 32 of them)
        long long t = lane < THREADS / WARP ? warp_totals[lane] : 0;
#pragma unroll
        for (int d = 1; d < WARP; d *= 2) {
            const long long y = __shfl_up_sync(FULL, t, d);
            if (lane >= d) t += y;
        }
        if (lane < THREADS / WARP) warp_totals[lane] = t;  // inclusive: warps 0..lane
    }
    __syncthreads();
    return (warp > 0 ? warp_totals[warp - 1] : 0) + x - own;
}
// TODO(lab7/05) end

// TODO(lab7/05) begin: the kernel: first every block builds the table of first chunks in shared memory (tensor i owns the chunks [first[i], first[i + 1]); an empty tensor owns none), then it walks the chunks blockIdx.x, blockIdx.x + gridDim.x, ... and finds each chunk's tensor by a binary search in the table; inside a chunk, Packs of 4 where every pointer of the tensor sits alike on the grid (a scalar head before the first 16-byte boundary of params, a scalar tail), element by element otherwise; see the chapter's section "Task 05: one launch for every tensor"; about 70 lines; try sizes 0, 1, 3, 5, 4097 at every offset modulo 8, and a list of 300 tensors.
// One step over every tensor. W is __nv_bfloat16 for adamw_bf16_master (weights written), and
// `weights` is nullptr for adamw_f32 (HAS_WEIGHTS false).
template <typename G, bool HAS_WEIGHTS>
__global__ void __launch_bounds__(THREADS)
    adamw_kernel(float* __restrict__ params, const G* __restrict__ grads, float* __restrict__ exp_avg,
                 float* __restrict__ exp_avg_sq, __nv_bfloat16* __restrict__ weights,
                 const int64_t* __restrict__ offsets, const int64_t* __restrict__ sizes, int n, Hyper h) {
    extern __shared__ long long first[];  // (n + 1,): tensor i owns chunks [first[i], first[i + 1])
    __shared__ long long warp_totals[THREADS / WARP];
    const int tid = threadIdx.x;

    // the table: thread tid counts the chunks of tensors [lo, hi), the block scans the counts
    const int per = (n + THREADS - 1) / THREADS;
    const int lo = min(n, tid * per), hi = min(n, lo + per);
    long long own = 0;
    for (int i = lo; i < hi; ++i) own += (sizes[i] + CHUNK - 1) / CHUNK;
    long long at = block_exclusive_scan(own, warp_totals);
    for (int i = lo; i < hi; ++i) {
        first[i] = at;
        at += (sizes[i] + CHUNK - 1) / CHUNK;
    }
    if (tid == THREADS - 1) first[n] = at;  // the last thread's running sum ends at the total
    __syncthreads();
    const long long chunks = first[n];

    for (long long c = blockIdx.x; c < chunks; c += gridDim.x) {
        // the tensor t with first[t] <= c < first[t + 1]: empty tensors share their first chunk
        // with the next tensor, and the search passes over them
        int a = 0, b = n;  // first[a] <= c < first[b]
        while (b - a > 1) {
            const int mid = (a + b) / 2;
            if (first[mid] <= c) a = mid;
            else b = mid;
        }
        const int t = a;
        const int64_t off = offsets[t];
        const int64_t begin = (c - first[t]) * (int64_t)CHUNK;
        const int64_t end = min(sizes[t], begin + CHUNK);
        float* p = params + off;
        const G* g = grads + off;
        float* m = exp_avg + off;
        float* v = exp_avg_sq + off;
        __nv_bfloat16* w = HAS_WEIGHTS ? weights + off : nullptr;

        auto scalar = [&](int64_t e) {
            float pe = p[e], me = m[e], ve = v[e];
            adamw_element(pe, to_float(g[e]), me, ve, h);
            p[e] = pe;
            m[e] = me;
            v[e] = ve;
            if constexpr (HAS_WEIGHTS) w[e] = __float2bfloat16_rn(pe);
        };

        // elements of p before its first 16-byte boundary; CHUNK is a multiple of 4, so every
        // chunk of the tensor has the same head
        const int head = (int)(((16u - (unsigned)(reinterpret_cast<uintptr_t>(p) & 15u)) & 15u) / 4u);
        bool alike = on_grid(m + head, 16) && on_grid(v + head, 16) && on_grid(g + head, 4 * sizeof(G));
        if constexpr (HAS_WEIGHTS) alike = alike && on_grid(w + head, 8);
        if (!alike) {  // the arenas sit differently on the grid: element by element
            for (int64_t e = begin + tid; e < end; e += THREADS) scalar(e);
            continue;
        }
        const int64_t body = min(end, begin + head);
        for (int64_t e = begin + tid; e < body; e += THREADS) scalar(e);
        const int packs = (int)((end - body) / 4);
#pragma unroll 4
        for (int k = tid; k < packs; k += THREADS) {
            const int64_t e = body + 4 * (int64_t)k;
            float4 pp = *reinterpret_cast<const float4*>(p + e);
            float4 mm = *reinterpret_cast<const float4*>(m + e);
            float4 vv = *reinterpret_cast<const float4*>(v + e);
            const Pack4<G> gg = *reinterpret_cast<const Pack4<G>*>(g + e);
            adamw_element(pp.x, to_float(gg.v[0]), mm.x, vv.x, h);
            adamw_element(pp.y, to_float(gg.v[1]), mm.y, vv.y, h);
            adamw_element(pp.z, to_float(gg.v[2]), mm.z, vv.z, h);
            adamw_element(pp.w, to_float(gg.v[3]), mm.w, vv.w, h);
            *reinterpret_cast<float4*>(p + e) = pp;
            *reinterpret_cast<float4*>(m + e) = mm;
            *reinterpret_cast<float4*>(v + e) = vv;
            if constexpr (HAS_WEIGHTS) {
                Pack4<__nv_bfloat16> ww;
                ww.v[0] = __float2bfloat16_rn(pp.x);
                ww.v[1] = __float2bfloat16_rn(pp.y);
                ww.v[2] = __float2bfloat16_rn(pp.z);
                ww.v[3] = __float2bfloat16_rn(pp.w);
                *reinterpret_cast<Pack4<__nv_bfloat16>*>(w + e) = ww;
            }
        }
        for (int64_t e = body + 4 * (int64_t)packs + tid; e < end; e += THREADS) scalar(e);
    }
}
// TODO(lab7/05) end

// The bias corrections in double on the host: 1 - beta2^t is a difference of nearby numbers, and
// a float32 powf(0.999f, 2) off by half a unit of 0.998 (3e-8) is off by 1.5e-5 of 1 - beta2^2.
// Then one launch: a fixed grid of as many blocks as fit the card at once, each walking the chunks.
template <typename G, bool HAS_WEIGHTS>
static cudaError_t adamw(float* params, const G* grads, float* exp_avg, float* exp_avg_sq, __nv_bfloat16* weights,
                         const int64_t* offsets, const int64_t* sizes, int n, float lr, float beta1, float beta2,
                         float eps, float weight_decay, int step, cudaStream_t stream) {
    // TODO(lab7/05) begin: refuse n outside [1, MAX_TENSORS] or step < 1, fill a Hyper (bias corrections in double), size a grid of one wave, as many blocks as fit the card at once (the host cannot count the chunks: the sizes are on the device), launch once on `stream` with (n + 1) int64 of dynamic shared memory and return the launch error (CUDA_CHECK); about 25 lines.
    if (n < 1 || n > MAX_TENSORS || step < 1) return cudaErrorInvalidValue;
    const double bc1 = 1.0 - std::pow((double)beta1, step);
    const double bc2 = 1.0 - std::pow((double)beta2, step);
    Hyper h;
    h.beta1 = beta1;
    h.one_minus_beta1 = 1.0f - beta1;  // exact for beta1 in [0.5, 1) (Sterbenz)
    h.beta2 = beta2;
    h.one_minus_beta2 = 1.0f - beta2;
    h.decay = (float)(1.0 - (double)lr * (double)weight_decay);
    h.step_size = (float)((double)lr / bc1);
    h.inv_sqrt_bc2 = (float)(1.0 / std::sqrt(bc2));
    h.eps = eps;

    // one wave: as many blocks as the card holds at once (a second, partial wave would start its
    // blocks' walks late and end the launch on them). Asked once, for the largest table, so that it
    // holds for every n and a call captured into a CUDA graph makes no query at all
    static int blocks = 0;
    if (blocks == 0) {
        int device = 0, sms = 0, per_sm = 0;
        CUDA_CHECK(cudaGetDevice(&device));
        CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, adamw_kernel<G, HAS_WEIGHTS>, THREADS,
                                                                 (MAX_TENSORS + 1) * sizeof(long long)));
        blocks = sms * (per_sm > 0 ? per_sm : 1);
    }
    const size_t shared = (size_t)(n + 1) * sizeof(long long);
    adamw_kernel<G, HAS_WEIGHTS><<<blocks, THREADS, shared, stream>>>(params, grads, exp_avg, exp_avg_sq, weights,
                                                                       offsets, sizes, n, h);
    CUDA_CHECK(cudaGetLastError());
    return cudaSuccess;
    //~ return cudaErrorNotYetImplemented;
    // TODO(lab7/05) end
}

COURSE_API cudaError_t adamw_f32(float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
                                 const int64_t* offsets, const int64_t* sizes, int n, float lr, float beta1,
                                 float beta2, float eps, float weight_decay, int step, cudaStream_t stream) {
    return adamw<float, false>(params, grads, exp_avg, exp_avg_sq, nullptr, offsets, sizes, n, lr, beta1, beta2, eps,
                               weight_decay, step, stream);
}

COURSE_API cudaError_t adamw_bf16_master(float* master, const __nv_bfloat16* grads, float* exp_avg,
                                         float* exp_avg_sq, __nv_bfloat16* weights, const int64_t* offsets,
                                         const int64_t* sizes, int n, float lr, float beta1, float beta2, float eps,
                                         float weight_decay, int step, cudaStream_t stream) {
    return adamw<__nv_bfloat16, true>(master, grads, exp_avg, exp_avg_sq, weights, offsets, sizes, n, lr, beta1,
                                      beta2, eps, weight_decay, step, stream);
}

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
// TODO(lab7/01) end

// TODO(lab7/01) begin: the kernel, block blockIdx.x on row blockIdx.x: read the target (and its logit, before anything is written: dlogits may be logits), handle the ignored and the invalid rows, fold the row into one (max, sum) in a first pass (a scalar head up to the row's first 16-byte boundary, Packs, a scalar tail), merge it over the block, write loss[r] from thread 0, then a second pass writes dloss * (softmax - one-hot), by Packs where logits and dlogits sit alike on the 16-byte grid, else element by element; see the chapter's section "Task 01: one kernel, two passes over the row"; about 70 lines; try V = 1, 7 (all head and tail), 4099 and 50257 in both dtypes, and dlogits == logits.
// TODO(lab7/01) end

// One block per row; its size grows with V: one warp for short rows (no shared memory, no
// barrier), 1024 threads for a vocabulary (50257 floats: 13 packs per thread and pass). Two such
// blocks fit an SM: 264 rows in flight on an H100, 53 MB of float32 rows against its 50 MB of L2.
template <typename T>
static cudaError_t cross_entropy(const T* logits, const int64_t* target, const float* dloss, float* loss,
                                 T* dlogits, int rows, int V, int64_t ignore_index, cudaStream_t stream) {
    // TODO(lab7/01) begin: refuse rows < 1 or V < 1, pick the block size for V, decide whether logits and dlogits sit alike on the 16-byte grid, launch one block per row on `stream` and return the launch error (CUDA_CHECK); about 15 lines.
    return cudaErrorNotYetImplemented;  //~
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

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
// TODO(lab7/05) end

// TODO(lab7/05) begin: the kernel: first every block builds the table of first chunks in shared memory (tensor i owns the chunks [first[i], first[i + 1]); an empty tensor owns none), then it walks the chunks blockIdx.x, blockIdx.x + gridDim.x, ... and finds each chunk's tensor by a binary search in the table; inside a chunk, Packs of 4 where every pointer of the tensor sits alike on the grid (a scalar head before the first 16-byte boundary of params, a scalar tail), element by element otherwise; see the chapter's section "Task 05: one launch for every tensor"; about 70 lines; try sizes 0, 1, 3, 5, 4097 at every offset modulo 8, and a list of 300 tensors.
// TODO(lab7/05) end

// The bias corrections in double on the host: 1 - beta2^t is a difference of nearby numbers, and
// a float32 powf(0.999f, 2) off by half a unit of 0.998 (3e-8) is off by 1.5e-5 of 1 - beta2^2.
// Then one launch: a fixed grid of as many blocks as fit the card at once, each walking the chunks.
template <typename G, bool HAS_WEIGHTS>
static cudaError_t adamw(float* params, const G* grads, float* exp_avg, float* exp_avg_sq, __nv_bfloat16* weights,
                         const int64_t* offsets, const int64_t* sizes, int n, float lr, float beta1, float beta2,
                         float eps, float weight_decay, int step, cudaStream_t stream) {
    // TODO(lab7/05) begin: refuse n outside [1, MAX_TENSORS] or step < 1, fill a Hyper (bias corrections in double), size a grid of one wave, as many blocks as fit the card at once (the host cannot count the chunks: the sizes are on the device), launch once on `stream` with (n + 1) int64 of dynamic shared memory and return the launch error (CUDA_CHECK); about 25 lines.
    return cudaErrorNotYetImplemented;  //~
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

// Lab 7 · Task 02 — Layer norm and RMSNorm backward: dx per row, dweight (and dbias) reduced over
//                   the rows in a fixed order
//
// Implement: layernorm_backward_{f32,bf16} and rmsnorm_backward_{f32,bf16}: the gradients of a
//            normalisation layer, given the forward pass's saved row statistics. Two launches: the
//            first gives each block a slice of rows, writes dx row by row and keeps, per column,
//            the slice's sums of dy * xhat (and of dy) in registers, then writes them to `scratch`
//            as one partial row per block; the second adds the partial rows, in a fixed order,
//            into dweight (and dbias). No atomics: the same inputs give the same bits every run.
// Contract:  dy, x: DEVICE (rows, C) row-major and contiguous, float32 (the _f32 entries) or
//            bfloat16 (the _bf16 entries), 4-byte (2-byte) aligned. weight: DEVICE (C,) of that
//            dtype. mean (layer norm only) and rstd: DEVICE float32 (rows,), as the forward pass
//            saved them (rstd = 1 / sqrt(var + eps); the kernel never recomputes them).
//            dx: DEVICE (rows, C) of the dtype. dweight, dbias (layer norm only): DEVICE float32
//            (C,), OVERWRITTEN (not accumulated into: whatever they held is ignored).
//            scratch: DEVICE float32, 16-byte aligned, `scratch_floats` floats, its content on
//            entry ignored and on return unspecified; the kernel needs at most
//            norm_scratch_floats(rows, C, rms) floats (given below: one partial row of C floats per
//            block, at most MAX_PARTIALS blocks, for dweight and for dbias) and a smaller
//            scratch_floats returns cudaErrorInvalidValue. 1 <= rows, 1 <= C <= MAX_C (16384, the
//            widest hidden size of today's models); rows * C may pass 2^31 (64-bit offsets).
//            With xhat = (x - mean) * rstd (RMSNorm: x * rstd) and g = dy * weight, per row:
//              dx      = rstd * (g - mean_C(g) - xhat * mean_C(g * xhat))   (RMSNorm: no mean_C(g))
//              dweight = sum over rows of dy * xhat;   dbias = sum over rows of dy
//            Arithmetic in float32 for both dtypes, dx rounded once at the store. Deterministic:
//            the same inputs give bit-identical outputs on every call. No buffer overlaps another;
//            the inputs are not modified. Everything on `stream`; no synchronisation, no
//            allocation. Returns cudaErrorInvalidValue for sizes outside the contract, else the
//            launch error.
// Test:      make test-lab7 TASK=02

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include <cuda_bf16.h>

#include "course.h"

[[maybe_unused]] constexpr int WARP = 32;  // threads of a warp
[[maybe_unused]] constexpr unsigned FULL = 0xffffffffu;  // every lane takes part in a shuffle
[[maybe_unused]] constexpr int MAX_C = 16384;  // LLaMA 3 405B's hidden size
[[maybe_unused]] constexpr int MAX_PARTIALS = 512;  // the most partial rows the scratch must hold, per reduced vector

// ---------------------------------------------------------------------------------------------
// Given: a float from either element type and back; Vec<T, W>, W consecutive elements read or
// written at once (W = 16 / sizeof(T): one 16-byte access, which needs a 16-byte-aligned address;
// W = 1: one element); and the scratch the contract promises.
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

template <typename T, int W>
struct alignas(sizeof(T) * W) Vec {
    T v[W];
};

// Floats of scratch a call may use: a partial row of C floats for each of at most MAX_PARTIALS
// slices of rows, for dweight, and as many again for dbias (layer norm).
[[maybe_unused]] static size_t norm_scratch_floats(int rows, int C, bool rms) {
    return (rms ? 1 : 2) * (size_t)C * (size_t)std::min(rows, MAX_PARTIALS);
}

// TODO(lab7/02) begin: sum a pair of floats over a team of threads (a warp, or the whole block) so that every thread of the team gets the same bits: butterfly shuffles in the warp, then one pair per warp through shared memory; the block is reused row after row, so think about when a warp may overwrite a slot another warp has not read yet; see the chapter's section "Task 02: norm backward"; about 25 lines.
// TODO(lab7/02) end

// TODO(lab7/02) begin: the first kernel: block b owns a slice of rows and a team (a warp, or the whole block) handles one row at a time: pass 1 reads the row's dy, x and weight (Vecs of W elements, lane + k * TEAM for k < K) and forms sum(g) and sum(g * xhat) while adding dy * xhat and dy into per-thread column sums in registers; team_sum; pass 2 reads the row again and writes dx. At the end the teams' column sums are added in a fixed order and the block writes its partial rows to scratch; see the chapter's section "Task 02: norm backward"; about 90 lines; try C = 1, 7, 771 (scalar path) and 768, 4096 (16-byte path), rows 1 and 3, and 16384 rows.
// TODO(lab7/02) end

// TODO(lab7/02) begin: the second kernel: out[c] = the sum over the partial rows b of partials[b][c], in an order fixed by the code (not by the timing): a block of 32 columns x 32 threads down the partial rows, each thread one strided chain, then the 32 chains of a column added by a fixed shuffle tree; blockIdx.y picks dweight or dbias; about 25 lines.
// TODO(lab7/02) end

// TODO(lab7/02) begin: the launches for one (T, RMS, W): the first kernel on as many blocks as the GPU holds at once (at most MAX_PARTIALS, at most one per row, none without rows), with a warp per row up to C = 768 (8 rows of a 256-thread block in flight), a 256-thread block per row up to 4096 and 1024 threads up to MAX_C, K = (columns a thread owns) / W; then the second kernel on the partial rows; about 35 lines.
// TODO(lab7/02) end

template <typename T, bool RMS>
static cudaError_t norm_backward(const T* dy, const T* x, const T* weight, const float* mean, const float* rstd,
                                 T* dx, float* dweight, float* dbias, float* scratch, size_t scratch_floats, int rows,
                                 int C, cudaStream_t stream) {
    // TODO(lab7/02) begin: refuse sizes outside the contract (a scratch smaller than norm_scratch_floats too), then take the 16-byte path (W = 16 / sizeof(T)) where W divides C and dy, x, weight and dx all sit on the 16-byte grid, else W = 1; about 10 lines.
    return cudaErrorNotYetImplemented;  //~
    // TODO(lab7/02) end
}

COURSE_API cudaError_t layernorm_backward_f32(const float* dy, const float* x, const float* weight, const float* mean,
                                              const float* rstd, float* dx, float* dweight, float* dbias,
                                              float* scratch, size_t scratch_floats, int rows, int C,
                                              cudaStream_t stream) {
    return norm_backward<float, false>(dy, x, weight, mean, rstd, dx, dweight, dbias, scratch, scratch_floats, rows,
                                       C, stream);
}

COURSE_API cudaError_t layernorm_backward_bf16(const __nv_bfloat16* dy, const __nv_bfloat16* x,
                                               const __nv_bfloat16* weight, const float* mean, const float* rstd,
                                               __nv_bfloat16* dx, float* dweight, float* dbias, float* scratch,
                                               size_t scratch_floats, int rows, int C, cudaStream_t stream) {
    return norm_backward<__nv_bfloat16, false>(dy, x, weight, mean, rstd, dx, dweight, dbias, scratch, scratch_floats,
                                               rows, C, stream);
}

COURSE_API cudaError_t rmsnorm_backward_f32(const float* dy, const float* x, const float* weight, const float* rstd,
                                            float* dx, float* dweight, float* scratch, size_t scratch_floats, int rows,
                                            int C, cudaStream_t stream) {
    return norm_backward<float, true>(dy, x, weight, nullptr, rstd, dx, dweight, nullptr, scratch, scratch_floats,
                                      rows, C, stream);
}

COURSE_API cudaError_t rmsnorm_backward_bf16(const __nv_bfloat16* dy, const __nv_bfloat16* x,
                                             const __nv_bfloat16* weight, const float* rstd, __nv_bfloat16* dx,
                                             float* dweight, float* scratch, size_t scratch_floats, int rows, int C,
                                             cudaStream_t stream) {
    return norm_backward<__nv_bfloat16, true>(dy, x, weight, nullptr, rstd, dx, dweight, nullptr, scratch,
                                              scratch_floats, rows, C, stream);
}

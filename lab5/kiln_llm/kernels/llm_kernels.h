// llm_kernels.h — every CUDA entry point of lab 5's kernels, in one place (given: do not edit).
//
// kiln_llm/cuda.py calls these through ctypes. Each .cu file of kiln_llm/kernels/ includes this
// header, so the compiler checks every definition against its declaration here.
//
// The conventions are lab 4's (lab4/kiln/kernels/kiln_kernels.h), with three element types:
//   - every kernel exists three times, for float, __half and __nv_bfloat16, as the symbols with
//     the suffix _f32, _f16 and _bf16 (one C++ template, instantiated three times): `T` below;
//   - data is DEVICE memory, dense and row-major, 16-byte aligned (kiln's arena aligns every
//     tensor to 256 bytes); sizes are int64;
//   - values that change from run to run (the position `pos`, the token ids) are DEVICE memory,
//     read by the kernel when it runs: a captured CUDA graph replays with new positions;
//   - arithmetic is float32, rounded once to T at the end, unless said otherwise;
//   - `stream` is the last argument; the call launches only on it, never synchronizes, never
//     allocates, and returns the launch's error (cudaGetLastError()); a size it cannot handle is
//     cudaErrorInvalidValue, returned before anything is launched.
//
// Shapes, in the comments' notation: T tokens this run, S cache rows (max_seq), D model dim,
// H query heads, Hkv key/value heads, Dh head dim, V vocabulary.

#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "course.h"

// The prefill GEMM stages tiles with cp.async and multiplies bf16 on the tensor cores: sm_80 and
// later. Said here, once, instead of as an incomplete-type error from deep inside mma.h.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "lab 5's kernels need a GPU of compute capability 8.0 or newer (cp.async, bf16 tensor cores); lab5/README.md, 'What card lab 5 needs', lists the cards"
#endif

// ---- chained launches (programmatic dependent launch, sm_90 and later) ------------------------------
//
// A decode step of the 7B shape is 162 short kernels in a row (after fusion); between two of them
// the GPU would drain the first grid, then launch and ramp up the next. Launched by launch_chained(), a kernel may start
// while the one before it on the stream is still finishing: its blocks take the SMs that grid
// leaves free and wait there. In exchange every such kernel keeps one rule:
//   wait_for_previous() comes before the first read of anything the kernel before it on the stream
//   may write and before the first write to memory at all (that kernel may still be reading it); it
//   returns once that kernel has finished and its writes are visible. Kernels further back have
//   finished before this one starts (each calls start_next() only after its own wait), so reading
//   what they alone wrote, or what no kernel writes (the weights), may come before it: that is the
//   overlap.
// start_next() lets the next chained kernel be scheduled (it, too, waits before touching data);
// without it the next one starts only as this one's blocks exit. On cards before sm_90 both are
// no-ops and the launch is an ordinary one.
__device__ __forceinline__ void wait_for_previous() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void start_next() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// kernel<<<grid, block, 0, stream>>>(args...), allowed to overlap the stream's previous kernel; returns
// the launch's error. Only for kernels that call wait_for_previous() as described above.
template <typename... Params, typename... Args>
static cudaError_t launch_chained(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream,
                                  Args... args) {
    cudaLaunchAttribute chained[1];
    chained[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    chained[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = 0;
    config.stream = stream;
    config.attrs = chained;
    config.numAttrs = 1;
    return cudaLaunchKernelEx(&config, kernel, args...);
}

// ---- task 02 (llama.cu) ----------------------------------------------------------------------------
//
// kiln_embedding_<t>(out, table, tokens, n_tokens, vocab, d)
//   out (T, D) = table (V, D)[tokens[t]]; a token outside [0, V) gives a row of zeros (never a read
//   out of bounds). tokens: DEVICE, n_tokens int64.
// kiln_rmsnorm_<t>(out, x, w, rows, d, eps)
//   out (rows, d) = round(round(x * rsqrt(mean(x^2) + eps)) * w): Hugging Face's LlamaRMSNorm, the
//   sum in float32, the normalized x rounded to T, then multiplied by w (d,) and rounded again. Any d >= 1.
// kiln_rope_<t>(out, x, pos, inv_freq, n_tokens, heads, dh, layout)
//   out (T, heads, dh) = x rotated: token t sits at position p = pos[0] + t and pair j turns by the
//   angle p * inv_freq[j] (float32, cos and sin in float32); layout 0 ("half", Hugging Face) pairs
//   (j, j + dh/2), layout 1 ("interleaved", llama2.c) pairs (2j, 2j + 1); (a, b) -> (a cos - b sin,
//   a sin + b cos). pos: DEVICE, 1 int64; inv_freq: DEVICE, dh/2 float32. dh even; out may be x.
// kiln_kv_update_<t>(cache, value, pos, cache_rows, n_tokens, row_elems)
//   cache (S, row_elems)[pos + t] = value (T, row_elems)[t], row_elems = Hkv * Dh; rows that would
//   land outside [0, S) are skipped. pos: DEVICE, 1 int64.
// kiln_attention_<t>(out, q, k, v, pos, n_tokens, heads, kv_heads, dh, cache_rows, scale)
//   out (T, H, Dh): query t (absolute position pos + t) of head h attends keys 0 .. pos + t
//   (inclusive, and below cache_rows) of kv head h / (H / Hkv); softmax(scale * q.k) in float32,
//   the sum of p * v rounded once. q (T, H, Dh); k, v (S, Hkv, Dh): cache rows at and past pos + T
//   are never read. dh: any even number from 8 to 256, else cudaErrorInvalidValue. 64 and 128 (the
//   usual checkpoints') run kernels specialised for them, every other dh (the repo's tiny model has
//   32, llama2.c's stories15M 48, OpenLLaMA 3B 100) the general path, which needs its pointers only
//   4-byte aligned. H % Hkv == 0 (any ratio), any n_tokens >= 1. pos: DEVICE, 1 int64.
//   A decode call (n_tokens <= 4) keeps partial results in one static scratch array: calls on
//   streams that run at the same time must not overlap (kiln runs one stream at a time).
// kiln_rope_kv_update_<t>(cache, value, pos, inv_freq, cache_rows, n_tokens, heads, dh, layout)
//   kiln_rope of value (T, heads, dh) written into cache (S, heads, dh) at rows pos + t instead of
//   rows t: kiln_kv_update of the rotated keys, rows outside [0, S) skipped. cache_rows >= 0.
// kiln_attention_rope_<t>(out, q, k, v, pos, inv_freq, layout, n_tokens, heads, kv_heads, dh, cache_rows, scale)
//   kiln_attention of kiln_rope(q): each query is rotated (and rounded to T) as it is loaded.
// kiln_attention_append_<t>(out, q, k_new, v_new, k, v, pos, inv_freq, layout, n_tokens, heads, kv_heads, dh,
//                          cache_rows, scale)
//   kiln_rope_kv_update of k_new into the cache k, kiln_kv_update of v_new (T, Hkv, Dh) into v, then
//   kiln_attention_rope over them, in one launch: the split that owns a new row takes it from k_new
//   and v_new and stores it on the way. Decode only: n_tokens <= 4 and heads * n_tokens <= 32768 (the
//   partial sums' scratch), else cudaErrorInvalidValue.
//   It reads pos and the cache rows below it before waiting for the kernel launched just before it
//   (launch_chained): that kernel must not write them (in kiln's decode step it is the q, k and v
//   projection, and those rows were written by earlier runs).
//
// ---- task 03 (linear.cu) -----------------------------------------------------------------------------
//
// kiln_linear_<t>(epilogue, out, x, w, extra, m, n, k)
//   out (m, n) = x (m, k) @ w (n, k).T in float32, rounded once, with `epilogue`:
//     0: nothing (extra unused, may be null)
//     1: + extra (m, n), added in float32 before the rounding; extra never aliases out
//     2: silu(x @ w.T) * (x @ extra.T), extra a second weight (n, k), all in float32
//   k % 8 == 0 for f16 and bf16 (16-byte vector loads), else cudaErrorInvalidValue.
// kiln_rmsnorm_linear_<t>(epilogue, out, x, norm_w, eps, w, extra, m, n, k)
//   kiln_linear of rmsnorm(x, norm_w), for decode: m <= 8 (the GEMV), else cudaErrorInvalidValue.
//   Each row of x is multiplied by rsqrt(mean(x^2) + eps) and by norm_w (k,) in float32 and is not
//   rounded to T before the product (kiln_rmsnorm rounds twice, as Hugging Face does): the result is
//   within a rounding or two of T of kiln_rmsnorm then kiln_linear. eps >= 0, k >= 1.
// kiln_rmsnorm_linear_qkv_<t>(out, x, norm_w, eps, wq, wk, wv, m, nq, nk, nv, k)
//   kiln_rmsnorm_linear (epilogue 0) of wq (nq, k), wk (nk, k) and wv (nv, k) stacked into one weight,
//   in one launch: out (m, nq + nk + nv), row i = [x_i @ wq.T | x_i @ wk.T | x_i @ wv.T] of the
//   normalized row: a decode step's three projections of one row, as one GEMV that keeps DRAM
//   busier than three short ones. m <= 8, else (and as kiln_rmsnorm_linear) cudaErrorInvalidValue.

// The declarations of one element type: suffix (f32, f16, bf16) and the C type.
#define KILN_LLM_DECLARE(SUFFIX, T)                                                                              \
    COURSE_API cudaError_t kiln_embedding_##SUFFIX(T* out, const T* table, const int64_t* tokens, int64_t n_tokens, \
                                                   int64_t vocab, int64_t d, cudaStream_t stream);               \
    COURSE_API cudaError_t kiln_rmsnorm_##SUFFIX(T* out, const T* x, const T* w, int64_t rows, int64_t d, float eps, \
                                                 cudaStream_t stream);                                           \
    COURSE_API cudaError_t kiln_rope_##SUFFIX(T* out, const T* x, const int64_t* pos, const float* inv_freq,       \
                                              int64_t n_tokens, int64_t heads, int64_t dh, int layout,          \
                                              cudaStream_t stream);                                              \
    COURSE_API cudaError_t kiln_kv_update_##SUFFIX(T* cache, const T* value, const int64_t* pos, int64_t cache_rows, \
                                                   int64_t n_tokens, int64_t row_elems, cudaStream_t stream);    \
    COURSE_API cudaError_t kiln_attention_##SUFFIX(T* out, const T* q, const T* k, const T* v, const int64_t* pos, \
                                                   int64_t n_tokens, int64_t heads, int64_t kv_heads, int64_t dh, \
                                                   int64_t cache_rows, float scale, cudaStream_t stream);        \
    COURSE_API cudaError_t kiln_rope_kv_update_##SUFFIX(T* cache, const T* value, const int64_t* pos,          \
                                                        const float* inv_freq, int64_t cache_rows,               \
                                                        int64_t n_tokens, int64_t heads, int64_t dh, int layout, \
                                                        cudaStream_t stream);                                    \
    COURSE_API cudaError_t kiln_attention_rope_##SUFFIX(T* out, const T* q, const T* k, const T* v,             \
                                                        const int64_t* pos, const float* inv_freq, int layout,   \
                                                        int64_t n_tokens, int64_t heads, int64_t kv_heads,       \
                                                        int64_t dh, int64_t cache_rows, float scale,             \
                                                        cudaStream_t stream);                                    \
    COURSE_API cudaError_t kiln_attention_append_##SUFFIX(                                                      \
        T* out, const T* q, const T* k_new, const T* v_new, T* k, T* v, const int64_t* pos, const float* inv_freq, \
        int layout, int64_t n_tokens, int64_t heads, int64_t kv_heads, int64_t dh, int64_t cache_rows, float scale, \
        cudaStream_t stream);                                                                                    \
    COURSE_API cudaError_t kiln_linear_##SUFFIX(int epilogue, T* out, const T* x, const T* w, const T* extra,     \
                                                int64_t m, int64_t n, int64_t k, cudaStream_t stream);           \
    COURSE_API cudaError_t kiln_rmsnorm_linear_##SUFFIX(int epilogue, T* out, const T* x, const T* norm_w,      \
                                                        float eps, const T* w, const T* extra, int64_t m,       \
                                                        int64_t n, int64_t k, cudaStream_t stream);           \
    COURSE_API cudaError_t kiln_rmsnorm_linear_qkv_##SUFFIX(T* out, const T* x, const T* norm_w, float eps,      \
                                                            const T* wq, const T* wk, const T* wv, int64_t m,    \
                                                            int64_t nq, int64_t nk, int64_t nv, int64_t k,        \
                                                            cudaStream_t stream);

KILN_LLM_DECLARE(f32, float)
KILN_LLM_DECLARE(f16, __half)
KILN_LLM_DECLARE(bf16, __nv_bfloat16)

#undef KILN_LLM_DECLARE

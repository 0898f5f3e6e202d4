// Lab 7 · Task 03 — Matmul backward through cuBLASLt: the bias gradient and GELU's backward in its
//                    epilogues
//
// Implement: matmul_lt, one cuBLASLt matmul of bf16 matrices accumulated in float32 with an epilogue
//            (its descriptors, the heuristic's algorithm, the call on `stream`); then the backward
//            passes of two linear layers of nanoGPT's MLP, each in two such matmuls and nothing else:
//            linear_backward_bf16, a linear layer y = x Wᵀ + b (c_fc): dx = dy W, and dW = dyᵀ x with
//            db = Σ_rows dy from the BGRADB epilogue; gelu_linear_backward_bf16, a linear layer whose
//            input was a GELU's output, y = a Wᵀ + b with a = gelu(h) (c_proj): dW = dyᵀ a with db as
//            above, and dh = gelu'(h) ⊙ (dy W) with dbh = Σ_rows dh (the bias gradient of the layer
//            that made h) from the DGELU_BGRAD epilogue, h being the epilogue's auxiliary input; with
//            dbh null, dh alone, from the DGELU epilogue.
// Contract:  every matrix is DEVICE bfloat16, row-major and contiguous as torch stores it, at a
//            16-byte-aligned address. x and a, h, dx and dh: (N, K); W and dW: (M, K) (torch
//            Linear's weight: out_features M, in_features K); dy: (N, M); db: (M,); dbh: (K,) or null
//            (nothing summed: the caller computes that bias gradient elsewhere).
//            1 <= N; K and M multiples of 8, at least 8 (every row starts on the 16-byte grid, and
//            DGELU_BGRAD wants the leading dimension of h divisible by 8). Any other size or an
//            unaligned pointer: cudaErrorInvalidValue, before anything runs.
//              linear_backward_bf16:      dx = dy W, dW = dyᵀ x, db[j] = Σ_i dy[i, j]
//              gelu_linear_backward_bf16: dW = dyᵀ a, db[j] = Σ_i dy[i, j],
//                                         dh = gelu'(h) ⊙ (dy W), dbh[k] = Σ_i dh[i, k] (of the bf16 dh written)
//            gelu is cuBLASLt's: the tanh approximation, 0.5 h (1 + tanh(√(2/π) (h + 0.044715 h³))),
//            as torch's gelu(approximate="tanh") and GPT-2's; a is gelu(h) as the forward pass saved it.
//            Every product and sum accumulates in float32 (CUBLAS_COMPUTE_32F) and is rounded to bf16
//            once, at the store; the bias gradients are bf16, as cuBLASLt's epilogues write them (the
//            output's type). Every output is overwritten (never accumulated into); inputs are read-only;
//            no output overlaps any other buffer. The products are cuBLASLt's and the bias gradients
//            and GELU's backward its epilogues': this file launches no kernel of its own.
//            Everything runs on `stream`; no synchronisation. The first call creates the cuBLASLt
//            handle and a 32 MiB workspace (so it must not be the one inside a CUDA graph capture);
//            calls on different streams must not overlap (they share that workspace). Returns a CUDA
//            error; a failed cuBLASLt call reads as cudaErrorUnknown (its status's name on stderr) and
//            no algorithm for the problem as cudaErrorNotSupported.
// Test:      make test-lab7 TASK=03

#include <cstddef>
#include <cstdint>

#include <cublasLt.h>
#include <cuda_bf16.h>

#include "course.h"
#include "course_cublas.h"
#include "course_cublaslt.h"

using bf16 = __nv_bfloat16;

// cuBLASLt's scratch memory: NVIDIA suggests 32 MiB on Hopper; split-K algorithms and the bias
// gradients' partial sums live in it
constexpr size_t LT_WORKSPACE_BYTES = 32u << 20;

// ---------------------------------------------------------------------------------------------
// Given: the handle and its workspace, made once (the descriptors of one matmul, destroyed on every
// way out, and a pointer's alignment, for the heuristic, are course_cublaslt.h's).
// ---------------------------------------------------------------------------------------------

struct Lt {
    cublasLtHandle_t handle = nullptr;
    void* workspace = nullptr;  // workspace_bytes of device memory for cublasLtMatmul
    size_t workspace_bytes = LT_WORKSPACE_BYTES;
};

static Lt g_lt;

// A handle costs far more to create than a small matmul takes; it lives as long as the process.
// cublasLtMatmul takes its stream per call, so one handle serves every stream.
[[maybe_unused]] static cudaError_t lt_handle(Lt** out) {
    if (g_lt.handle == nullptr) {
        CUBLAS_CHECK(cublasLtCreate(&g_lt.handle));
        CUDA_CHECK(cudaMalloc(&g_lt.workspace, g_lt.workspace_bytes));
    }
    *out = &g_lt;
    return cudaSuccess;
}

// Whether p allows 16-byte vector loads: the entry points refuse a pointer that does not.
[[maybe_unused]] static bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// ---------------------------------------------------------------------------------------------
// One matmul. cuBLASLt is column-major: it reads a row-major (R, C) array as its transpose, a
// (C, R) matrix whose leading dimension is C. Every shape below is the column-major one.
// ---------------------------------------------------------------------------------------------

// D (m, n), leading dimension ldd, = op_a(A) (m, k) · op_b(B) (k, n), bf16 in and out, float32
// accumulation, on `stream`, followed by `epilogue`. A is stored (m, k) when op_a is N and (k, m)
// when it is T, leading dimension lda; B likewise (k, n) or (n, k), ldb. `bias` receives the bias
// gradient of a BGRAD epilogue (length m for DGELU_BGRAD and BGRADA, n for BGRADB), else nullptr;
// `aux` is DGELU_BGRAD's GELU input, laid out like D with leading dimension ldaux, else nullptr.
[[maybe_unused]] static cudaError_t matmul_lt(Lt* lt, cublasOperation_t op_a, cublasOperation_t op_b, int m, int n,
                                              int k, const bf16* A, int lda, const bf16* B, int ldb, bf16* D,
                                              int ldd, cublasLtEpilogue_t epilogue, bf16* bias, const bf16* aux,
                                              int ldaux, cudaStream_t stream) {
    LtDescriptors lt_d;
    // TODO(lab7/03) begin: the operation (float32 compute, float32 alpha and beta) with its two transposes and its epilogue, the bias-gradient pointer (and its type) and the GELU input with its leading dimension when given, the layouts of A, B and D as stored, a preference with the workspace and each pointer's alignment, one heuristic algorithm, then one cublasLtMatmul with beta = 0 on `stream`; see the chapter's section "The backward pass as two matmuls"; about 45 lines; every pointer an epilogue reads or writes must be set before the heuristic, which judges alignment from it.
    (void)lt_d;  //~
    return cudaErrorNotYetImplemented;  //~
    // TODO(lab7/03) end
}

// ---------------------------------------------------------------------------------------------
// The two backward passes: two matmuls each, and nothing else.
// ---------------------------------------------------------------------------------------------

COURSE_API cudaError_t linear_backward_bf16(const bf16* x, const bf16* W, const bf16* dy, bf16* dx, bf16* dW,
                                            bf16* db, int N, int K, int M, cudaStream_t stream) {
    // TODO(lab7/03) begin: refuse the sizes and pointers the contract excludes; then dx = dy W and dW = dyᵀ x, each one matmul_lt, db from the epilogue that sums the rows of dy: which of the two products has dy as an operand whose k dimension runs over the rows, and is that operand cuBLASLt's A or its B? See the chapter's section "The backward pass as two matmuls"; about 12 lines; try N = 1, and M != K, where a swapped transpose cannot hide.
    return cudaErrorNotYetImplemented;  //~
    // TODO(lab7/03) end
}

COURSE_API cudaError_t gelu_linear_backward_bf16(const bf16* a, const bf16* h, const bf16* W, const bf16* dy,
                                                 bf16* dh, bf16* dW, bf16* db, bf16* dbh, int N, int K, int M,
                                                 cudaStream_t stream) {
    // TODO(lab7/03) begin: the same refusals and the same two products, but the dgrad's epilogue turns dy W into dh = gelu'(h) ⊙ dy W and sums dh's rows into dbh: which epilogue, and which matrix is its auxiliary input, with what leading dimension? With dbh null, the epilogue without the sum. See the chapter's section "GELU's backward in the epilogue"; about 16 lines; try K != M, with h spanning GELU's bend (|h| < 3) and its tails.
    return cudaErrorNotYetImplemented;  //~
    // TODO(lab7/03) end
}

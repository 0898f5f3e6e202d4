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
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&lt_d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const int32_t trans_a = op_a, trans_b = op_b;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(lt_d.op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(lt_d.op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)));
    const uint32_t epi = epilogue;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(lt_d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    if (bias != nullptr) {
        // a bias gradient has the output's type; said explicitly, so that no default can change it
        const int32_t bias_type = CUDA_R_16BF;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(lt_d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(lt_d.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                    sizeof(bias_type)));
    }
    if (aux != nullptr) {
        const int64_t aux_ld = ldaux;  // divisible by 8, at least m: cuBLASLt's rule for the GELU input
        CUBLAS_CHECK(
            cublasLtMatmulDescSetAttribute(lt_d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
        CUBLAS_CHECK(
            cublasLtMatmulDescSetAttribute(lt_d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
    }

    // the arrays as stored, before op
    if (op_a == CUBLAS_OP_N) {
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lt_d.a, CUDA_R_16BF, m, k, lda));
    } else {
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lt_d.a, CUDA_R_16BF, k, m, lda));
    }
    if (op_b == CUBLAS_OP_N) {
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lt_d.b, CUDA_R_16BF, k, n, ldb));
    } else {
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lt_d.b, CUDA_R_16BF, n, k, ldb));
    }
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lt_d.d, CUDA_R_16BF, m, n, ldd));

    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&lt_d.pref));
    const uint64_t workspace = lt->workspace_bytes;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(lt_d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                      sizeof(workspace)));
    // the contract promises 16 bytes; torch's allocator gives 512, and the heuristic may use what it gets
    const uint32_t align_a = alignment_of(A), align_b = alignment_of(B), align_d = alignment_of(D);
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(lt_d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                                      sizeof(align_a)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(lt_d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                                      sizeof(align_b)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(lt_d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d,
                                                      sizeof(align_d)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(lt_d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d,
                                                      sizeof(align_d)));
    cublasLtMatmulHeuristicResult_t best = {};
    int found = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt->handle, lt_d.op, lt_d.a, lt_d.b, lt_d.d, lt_d.d, lt_d.pref, 1,
                                                &best, &found));
    if (found == 0) return cudaErrorNotSupported;

    // beta = 0: C (D itself) is not read, so whatever D held before does not matter
    const float alpha = 1.0f, beta = 0.0f;
    CUBLAS_CHECK(cublasLtMatmul(lt->handle, lt_d.op, &alpha, A, lt_d.a, B, lt_d.b, &beta, D, lt_d.d, D, lt_d.d,
                                &best.algo, lt->workspace, lt->workspace_bytes, stream));
    return cudaSuccess;
    //~ (void)lt_d;
    //~ return cudaErrorNotYetImplemented;
    // TODO(lab7/03) end
}

// ---------------------------------------------------------------------------------------------
// The two backward passes: two matmuls each, and nothing else.
// ---------------------------------------------------------------------------------------------

COURSE_API cudaError_t linear_backward_bf16(const bf16* x, const bf16* W, const bf16* dy, bf16* dx, bf16* dW,
                                            bf16* db, int N, int K, int M, cudaStream_t stream) {
    // TODO(lab7/03) begin: refuse the sizes and pointers the contract excludes; then dx = dy W and dW = dyᵀ x, each one matmul_lt, db from the epilogue that sums the rows of dy: which of the two products has dy as an operand whose k dimension runs over the rows, and is that operand cuBLASLt's A or its B? See the chapter's section "The backward pass as two matmuls"; about 12 lines; try N = 1, and M != K, where a swapped transpose cannot hide.
    if (N < 1 || K < 8 || M < 8 || K % 8 != 0 || M % 8 != 0) return cudaErrorInvalidValue;
    if (!aligned16(x) || !aligned16(W) || !aligned16(dy) || !aligned16(dx) || !aligned16(dW) || !aligned16(db))
        return cudaErrorInvalidValue;
    Lt* lt = nullptr;
    CUDA_CHECK(lt_handle(&lt));
    // dx (N, K) is dxᵀ (K, N) to cuBLASLt, and dxᵀ = Wᵀ (K, M) · dyᵀ (M, N): W's memory is Wᵀ, ld K;
    // dy's memory is dyᵀ, ld M
    CUDA_CHECK(matmul_lt(lt, CUBLAS_OP_N, CUBLAS_OP_N, K, N, M, W, K, dy, M, dx, K,
                         CUBLASLT_EPILOGUE_DEFAULT, nullptr, nullptr, 0, stream));
    // dW (M, K) is dWᵀ (K, M) = xᵀ (K, N) · dy (N, M): x's memory is xᵀ, ld K; dy is its memory dyᵀ
    // read transposed. k runs over the N rows, and B is dy: BGRADB sums op(B) over k, one value per
    // column of D, db (M,)
    CUDA_CHECK(matmul_lt(lt, CUBLAS_OP_N, CUBLAS_OP_T, K, M, N, x, K, dy, M, dW, K,
                         CUBLASLT_EPILOGUE_BGRADB, db, nullptr, 0, stream));
    return cudaSuccess;
    //~ return cudaErrorNotYetImplemented;
    // TODO(lab7/03) end
}

COURSE_API cudaError_t gelu_linear_backward_bf16(const bf16* a, const bf16* h, const bf16* W, const bf16* dy,
                                                 bf16* dh, bf16* dW, bf16* db, bf16* dbh, int N, int K, int M,
                                                 cudaStream_t stream) {
    // TODO(lab7/03) begin: the same refusals and the same two products, but the dgrad's epilogue turns dy W into dh = gelu'(h) ⊙ dy W and sums dh's rows into dbh: which epilogue, and which matrix is its auxiliary input, with what leading dimension? With dbh null, the epilogue without the sum. See the chapter's section "GELU's backward in the epilogue"; about 16 lines; try K != M, with h spanning GELU's bend (|h| < 3) and its tails.
    if (N < 1 || K < 8 || M < 8 || K % 8 != 0 || M % 8 != 0) return cudaErrorInvalidValue;
    if (!aligned16(a) || !aligned16(h) || !aligned16(W) || !aligned16(dy) || !aligned16(dh) || !aligned16(dW) ||
        !aligned16(db) || !aligned16(dbh))
        return cudaErrorInvalidValue;
    Lt* lt = nullptr;
    CUDA_CHECK(lt_handle(&lt));
    // dhᵀ (K, N) = gelu'(hᵀ) ⊙ (Wᵀ (K, M) · dyᵀ (M, N)): h is laid out as D is (hᵀ, ld K); the bias
    // gradient has one value per row of D (K of them), summed over D's N columns: the rows of dh.
    // Without dbh, DGELU alone: on an H200 cuBLASLt fuses it into the matmul's kernel (+0.04 ms at
    // 16384 x 3072 x 768), where DGELU_BGRAD adds a kernel of its own after it (+0.32 ms)
    const cublasLtEpilogue_t dgelu = dbh != nullptr ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU;
    CUDA_CHECK(matmul_lt(lt, CUBLAS_OP_N, CUBLAS_OP_N, K, N, M, W, K, dy, M, dh, K,
                         dgelu, dbh, h, K, stream));
    // dWᵀ (K, M) = aᵀ (K, N) · dy (N, M), db by BGRADB as in linear_backward_bf16
    CUDA_CHECK(matmul_lt(lt, CUBLAS_OP_N, CUBLAS_OP_T, K, M, N, a, K, dy, M, dW, K,
                         CUBLASLT_EPILOGUE_BGRADB, db, nullptr, 0, stream));
    return cudaSuccess;
    //~ return cudaErrorNotYetImplemented;
    // TODO(lab7/03) end
}

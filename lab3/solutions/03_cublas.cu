// Lab 3 · Task 03 — cuBLAS: a linear layer through cublasGemmEx, and linear + bias + ReLU in one
//                    cublasLtMatmul
//
// Implement: the handles (one cuBLAS and one cuBLASLt handle per process, created on the first
//            call, reused by every call after it, on the default stream); linear_gemmex, the
//            row-major product y = x · wᵀ written as the column-major product cuBLAS computes;
//            linear_relu_lt, the same product with the bias and the ReLU done by cuBLASLt's
//            RELU_BIAS epilogue, in one call.
// Contract:  x (B, in), w (out, in) (torch Linear's layout), b (out,) and y (B, out) are DEVICE
//            float32 arrays, row-major and contiguous, as torch stores them, each at any address
//            a float may have (a torch view may start at any element: 4-byte, not 256-byte,
//            alignment). x, w and b are read-only; y is written and overlaps none of them.
//            B, in, out >= 1.
//            linear_gemmex:  y = x · wᵀ + b, accumulated in float32; tf32 != 0 lets cuBLAS round
//                            x and w to TF32 (CUBLAS_COMPUTE_32F_FAST_TF32), tf32 == 0 forbids it.
//            linear_relu_lt: y = max(x · wᵀ + b, 0), in float32 (no TF32).
//            Both run on the legacy default stream (the stream torch and the grader use) and
//            return a CUDA error (a failed cuBLAS call reads as cudaErrorUnknown, its name on
//            stderr); neither synchronizes.
// Test:      make test-lab3 TASK=03

#include "course.h"
#include "course_cublas.h"
#include "course_cublaslt.h"

#include <cublasLt.h>
#include <cublas_v2.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>

constexpr int THREADS = 256;
constexpr int MAX_GRID_Y = 65535;  // the largest gridDim.y
// cuBLASLt's scratch memory: NVIDIA suggests 32 MiB on Hopper; some algorithms (split-K) need it
constexpr size_t LT_WORKSPACE_BYTES = 32u << 20;

// ---- the handles: made once, reused by every call ----------------------------------------------

// A handle owns a context, a workspace and tuning state: creating one costs far more than a small
// GEMM does, so it lives as long as the process (the library is loaded once and never unloaded).
struct Blas {
    cublasHandle_t handle = nullptr;
    cublasLtHandle_t lt = nullptr;
    void* workspace = nullptr;  // workspace_bytes of device memory for cublasLtMatmul
    size_t workspace_bytes = LT_WORKSPACE_BYTES;
};

static Blas g_blas;

static cudaError_t blas(Blas** out) {
    // TODO(lab3/03) begin: create the cuBLAS handle, the cuBLASLt handle and the workspace on the first call only, and put cuBLAS on the legacy default stream (0), the one torch and the grader wait on; see the chapter's section "Handles and streams"; about 8 lines; what would calling cublasCreate in every call cost at B = 1?
    if (g_blas.handle == nullptr) {
        CUBLAS_CHECK(cublasCreate(&g_blas.handle));
        // stream 0: the legacy default stream, ordered after the bias kernel launched on it
        CUBLAS_CHECK(cublasSetStream(g_blas.handle, 0));
        CUBLAS_CHECK(cublasLtCreate(&g_blas.lt));
        CUDA_CHECK(cudaMalloc(&g_blas.workspace, g_blas.workspace_bytes));
    }
    *out = &g_blas;
    return cudaSuccess;
    //~ *out = &g_blas;
    //~ return cudaErrorNotYetImplemented;
    // TODO(lab3/03) end
}

// ---- given: the bias, broadcast over the rows of y ---------------------------------------------

// b (out,) -> y (B, out), every row a copy of b: the GEMM then adds x · wᵀ to it (beta = 1), so
// the bias costs one write of y here and one read of it in the GEMM's epilogue, with no extra
// kernel reading y back after the GEMM. Rows past gridDim.y are covered by a loop.
__global__ void broadcast_bias_kernel(const float* __restrict__ b, float* __restrict__ y, int rows,
                                      int cols) {
    const int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= cols) return;
    const float v = b[col];
    for (int r = blockIdx.y; r < rows; r += gridDim.y) y[(size_t)r * cols + col] = v;
}

// ---- the task ----------------------------------------------------------------------------------

// x (B, in) @ wᵀ (in, out) + b -> y (B, out), all row-major, through one cublasGemmEx.
COURSE_API cudaError_t linear_gemmex(const float* x, const float* w, const float* b, float* y, int B,
                                     int in, int out, int tf32) {
    Blas* h = nullptr;
    CUDA_CHECK(blas(&h));
    const dim3 grid((out + THREADS - 1) / THREADS, B < MAX_GRID_Y ? B : MAX_GRID_Y);
    broadcast_bias_kernel<<<grid, THREADS>>>(b, y, B, out);
    CUDA_CHECK(cudaGetLastError());

    // TODO(lab3/03) begin: y += x · wᵀ with one cublasGemmEx, cuBLAS being column-major: which product of column-major matrices is y's memory, which operand is transposed, what are m, n, k and the three leading dimensions; TF32 only when tf32 != 0; see the chapter's section "The row-major trick"; about 8 lines; check your answer on B = 1 and on a square w, where a wrong transpose still fits.
    // Column-major eyes read a row-major (R, C) array as its transpose, a (C, R) matrix with
    // leading dimension C. So y's memory is yᵀ (out, B), and yᵀ = w · xᵀ:
    //   w's memory is wᵀ (in, out), ld = in: op(A) = T gives w (out, in)   -> m = out, k = in
    //   x's memory is xᵀ (in, B),   ld = in: op(B) = N keeps xᵀ (in, B)    -> n = B
    //   y's memory is yᵀ (out, B),  ld = out
    const float alpha = 1.0f;
    const float beta = 1.0f;  // add to the bias already in y
    const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    CUBLAS_CHECK(cublasGemmEx(h->handle, CUBLAS_OP_T, CUBLAS_OP_N, out, B, in, &alpha, w, CUDA_R_32F, in, x,
                              CUDA_R_32F, in, &beta, y, CUDA_R_32F, out, compute, CUBLAS_GEMM_DEFAULT));
    return cudaSuccess;
    //~ return cudaErrorNotYetImplemented;
    // TODO(lab3/03) end
}

// max(x (B, in) @ wᵀ (in, out) + b, 0) -> y (B, out), row-major, in one cublasLtMatmul.
COURSE_API cudaError_t linear_relu_lt(const float* x, const float* w, const float* b, float* y, int B,
                                      int in, int out) {
    Blas* h = nullptr;
    CUDA_CHECK(blas(&h));
    LtDescriptors lt;

    // TODO(lab3/03) begin: the same column-major product as linear_gemmex (float32, no TF32) as a cuBLASLt operation whose epilogue adds b and applies ReLU: the operation's transposes, epilogue and bias pointer, the three layouts, a heuristic's algorithm within the workspace, then one cublasLtMatmul; the heuristic assumes every pointer 256-byte aligned unless the preference says how aligned each really is (a torch view may start at any element), and the epilogue's bias pointer has no such preference (a bias that is not 16-byte aligned can go in as C, broadcast into y, with beta = 1); see the chapter's section "cuBLASLt and its epilogues"; about 35 lines; the bias runs along D's rows: which of yᵀ's dimensions is that? Try x at x + 1.
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&lt.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const int32_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(lt.op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(lt.op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)));
    // bias then ReLU on D = yᵀ (out, B): the bias has one value per row of D, out of them. The
    // epilogue's kernels may read the bias 16 bytes at a time, and no preference tells the heuristic
    // otherwise: a bias that is not 16-byte aligned goes in as C instead (broadcast into y, beta = 1,
    // as linear_gemmex does), and the epilogue applies only the ReLU.
    const bool bias_epilogue = reinterpret_cast<uintptr_t>(b) % 16 == 0;
    const uint32_t epilogue = bias_epilogue ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(lt.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    if (bias_epilogue) {
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(lt.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b, sizeof(b)));
    } else {
        const dim3 grid((out + THREADS - 1) / THREADS, B < MAX_GRID_Y ? B : MAX_GRID_Y);
        broadcast_bias_kernel<<<grid, THREADS>>>(b, y, B, out);
        CUDA_CHECK(cudaGetLastError());
    }

    // the layouts of the arrays as stored (before op): w is wᵀ (in, out), x is xᵀ (in, B), y is yᵀ (out, B)
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lt.a, CUDA_R_32F, in, out, in));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lt.b, CUDA_R_32F, in, B, in));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lt.d, CUDA_R_32F, out, B, out));

    // the best algorithm the heuristic knows for these shapes, pointers' alignment and workspace
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&lt.pref));
    const uint64_t workspace = h->workspace_bytes;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(lt.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                      sizeof(workspace)));
    // without these the heuristic assumes 256-byte-aligned pointers and may pick a kernel that
    // loads 16 bytes at a time from y + 1: the pointers' real alignment rules those out
    const uint32_t align_a = alignment_of(w), align_b = alignment_of(x), align_cd = alignment_of(y);
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(lt.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                                      sizeof(align_a)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(lt.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                                      sizeof(align_b)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(lt.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_cd,
                                                      sizeof(align_cd)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(lt.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_cd,
                                                      sizeof(align_cd)));
    cublasLtMatmulHeuristicResult_t best = {};
    int found = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(h->lt, lt.op, lt.a, lt.b, lt.d, lt.d, lt.pref, 1, &best, &found));
    if (found == 0) return cudaErrorNotSupported;

    // beta = 0: C (here y itself) is not read, so y's old contents do not matter; beta = 1 adds the
    // bias broadcast into y above
    const float alpha = 1.0f, beta = bias_epilogue ? 0.0f : 1.0f;
    CUBLAS_CHECK(cublasLtMatmul(h->lt, lt.op, &alpha, w, lt.a, x, lt.b, &beta, y, lt.d, y, lt.d, &best.algo,
                                h->workspace, h->workspace_bytes, 0));
    return cudaSuccess;
    //~ (void)h;
    //~ (void)lt;
    //~ return cudaErrorNotYetImplemented;
    // TODO(lab3/03) end
}

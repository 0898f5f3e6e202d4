// Lab 3 · Task 05 — CUTLASS: linear + bias + ReLU as one templated GEMM, in exact float32 (SIMT)
//                    and on the tensor cores (TF32)
//
// Implement: the CUTLASS 2.x GEMM types (cutlass::gemm::device::Gemm: the operands' element types
//            and layouts, the operator class, the architecture, the threadblock, warp and
//            instruction tiles, the stages and the LinearCombinationRelu epilogue); linear_relu,
//            which runs one of them on y = relu(x · wᵀ + b) with the bias read as a C matrix of
//            leading dimension 0; and the two entry points, the TF32 one picking a kernel by the
//            operands' alignment.
// Contract:  x (B, in), w (out, in) (torch Linear's layout), b (out,) and y (B, out) are DEVICE
//            float32 arrays, row-major and contiguous, as torch stores them. x, w and b are
//            read-only; y is written and overlaps none of them. B, in, out >= 1, and B·in,
//            B·out, out·in < 2^31.
//            linear_relu_cutlass_simt: y = max(x · wᵀ + b, 0) in exact float32 (fused multiply-adds
//                                      on the CUDA cores).
//            linear_relu_cutlass_tf32: the same on the tensor cores, x and w rounded to TF32 (10
//                                      mantissa bits), products accumulated in float32. Any in and
//                                      out: when in and out are multiples of 4 and every pointer is
//                                      16-byte aligned it runs a kernel that loads 4 floats at a
//                                      time, otherwise one that loads one.
//            Both run on the legacy default stream, do not synchronize, and return a CUDA error (a
//            CUTLASS status that is not kSuccess becomes the nearest cudaError_t, its name on
//            stderr).
// Test:      make test-lab3 TASK=05

#include "course.h"

#include "cutlass/cutlass.h"
#include "cutlass/epilogue/thread/linear_combination_relu.h"
#include "cutlass/gemm/device/gemm.h"

#include <cstdint>
#include <cstdio>

// The CUDA_CHECK of CUTLASS: a cutlass::Status is not a CUDA error, so it is mapped to the nearest
// one for the caller and its name goes to stderr with the failing call.
inline cudaError_t cuda_error_of(cutlass::Status status) {
    switch (status) {
        case cutlass::Status::kSuccess: return cudaSuccess;
        case cutlass::Status::kErrorMisalignedOperand: return cudaErrorMisalignedAddress;
        case cutlass::Status::kErrorInvalidDataType:
        case cutlass::Status::kErrorInvalidLayout:
        case cutlass::Status::kErrorInvalidProblem:
        case cutlass::Status::kErrorWorkspaceNull: return cudaErrorInvalidValue;
        case cutlass::Status::kErrorNotSupported: return cudaErrorNotSupported;
        case cutlass::Status::kErrorArchMismatch: return cudaErrorNoKernelImageForDevice;
        case cutlass::Status::kErrorInsufficientDriver: return cudaErrorInsufficientDriver;
        case cutlass::Status::kErrorMemoryAllocation: return cudaErrorMemoryAllocation;
        default: return cudaErrorUnknown;  // kErrorInternal: a failed launch, its CUDA error already consumed
    }
}

#define CUTLASS_CHECK(call)                                                                       \
    do {                                                                                          \
        cutlass::Status course_status_ = (call);                                                  \
        if (course_status_ != cutlass::Status::kSuccess) {                                        \
            fprintf(stderr, "%s:%d: CUTLASS error %s in `%s`\n", __FILE__, __LINE__,               \
                    cutlassGetStatusString(course_status_), #call);                               \
            return cuda_error_of(course_status_);                                                 \
        }                                                                                         \
    } while (0)

// ---- the GEMM types: one template, three kernels --------------------------------------------------

// The problem CUTLASS sees, in its own names: D (M, N) = relu(A (M, K) · B (K, N) + C), with
//   A = x (B, in), row-major, lda = in                           -> M = B, K = in
//   B = wᵀ (in, out): w's memory read column-major, ldb = in     -> N = out
//   C = b as an (M, N) row-major matrix with ldc = 0: every row starts at b, so C[i][j] = b[j]
//   D = y (B, out), row-major, ldd = out
using LayoutX = cutlass::layout::RowMajor;
using LayoutW = cutlass::layout::ColumnMajor;
using LayoutY = cutlass::layout::RowMajor;

// TODO(lab3/05) begin: three cutlass::gemm::device::Gemm types for float x (row-major), wᵀ (column-major), y (row-major), accumulating in float, each with a LinearCombinationRelu epilogue whose vector width matches the alignment: GemmSimt (OpClassSimt, Sm80, exact float32, one float per access), GemmTf32 (OpClassTensorOp, Sm80, instruction 16x8x8, four floats per access) and GemmTf32Narrow (the same tiles, one float per access); see the chapter's section "CUTLASS's hierarchy"; about 30 lines; example 14_ampere_tf32_tensorop_gemm and cutlass/gemm/device/default_gemm_configuration.h hold tiles that work.
// the three Gemm types go here  //~
// TODO(lab3/05) end

// ---- one GEMM with the bias and the ReLU in its epilogue -------------------------------------

// x (B, in) @ wᵀ (in, out) + b -> relu -> y (B, out), through the CUTLASS kernel Gemm.
template <typename Gemm>
static cudaError_t linear_relu(const float* x, const float* w, const float* b, float* y, int B, int in, int out) {
    // TODO(lab3/05) begin: the arguments (the problem size M, N, K; A, B, C and D as TensorRefs, each a pointer and its leading dimension, the bias as C with leading dimension 0; alpha and beta of the epilogue), then can_implement, then the kernel on the default stream, each status checked; see the chapter's section "The bias as a matrix of stride 0"; about 10 lines; which of M, N, K is in, and what is B's leading dimension when w is read as wᵀ?
    return cudaErrorNotYetImplemented;  //~
    // TODO(lab3/05) end
}

// ---- the entry points ----------------------------------------------------------------------

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

COURSE_API cudaError_t linear_relu_cutlass_simt(const float* x, const float* w, const float* b, float* y, int B,
                                                int in, int out) {
    // TODO(lab3/05) begin: y = relu(x · wᵀ + b) with the SIMT kernel; about 1 line
    return cudaErrorNotYetImplemented;  //~
    // TODO(lab3/05) end
}

COURSE_API cudaError_t linear_relu_cutlass_tf32(const float* x, const float* w, const float* b, float* y, int B,
                                                int in, int out) {
    // TODO(lab3/05) begin: the same with the TF32 kernel that loads 4 floats at a time when it can (in and out multiples of 4, every pointer 16-byte aligned), with the narrow one otherwise; see the chapter's section "Alignment"; about 4 lines; what does can_implement say to the wide kernel at 1000 -> 10?
    return cudaErrorNotYetImplemented;  //~
    // TODO(lab3/05) end
}

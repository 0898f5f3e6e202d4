// Lab 4 · Task 03 — kiln's pointwise kernels: relu, silu, and add/mul with broadcasting
//
// Implement: unary_kernel and binary_kernel as grid-stride loops with 64-bit indices, and the
//            launches in kiln_unary and kiln_binary.
// Contract:  float32 DEVICE data, dense and row-major; out overlaps no input; inputs are read-only.
//            kiln_unary:  out[i] = f(x[i]) for 0 <= i < n, n >= 1 (2^31 and more included);
//                         op 0: relu, max(x, 0); op 1: silu, x * sigmoid(x) = x / (1 + e^-x).
//            kiln_binary: out = a (op) b, op 0: add, op 1: mul, with numpy broadcasting.
//                         meta is a HOST array of 12 int64: out's shape padded to 4 dims with
//                         leading 1s, then a's strides and b's strides (in elements) along those
//                         4 dims, 0 where that operand broadcasts. Element (i0, i1, i2, i3) of out
//                         reads a[sum i_d * a_stride[d]] and b[sum i_d * b_stride[d]].
//            Both launch only on `stream`, never synchronize or allocate, and return the launch's
//            error; an unknown op is cudaErrorInvalidValue.
// Test:      make test-lab4 TASK=03

#include "kiln/kernels/kiln_kernels.h"

#include <cstdint>

constexpr int THREADS = 256;
// A grid-stride loop lets a capped grid cover any n: 4096 blocks of 256 threads fill every SM
// of today's GPUs several times over, and a bigger grid would only add blocks to schedule.
constexpr int64_t MAX_BLOCKS = 4096;

// Enough blocks for one element per thread, up to MAX_BLOCKS; the loops do the rest.
[[maybe_unused]] static unsigned int blocks_for(int64_t n) {
    const int64_t blocks = (n + THREADS - 1) / THREADS;
    return static_cast<unsigned int>(blocks < 1 ? 1 : (blocks < MAX_BLOCKS ? blocks : MAX_BLOCKS));
}

// kiln_binary's meta, copied from the host array into a struct passed BY VALUE: the kernel gets
// its own copy as a launch argument, so the host array may change or die once the launch is queued
// (and a CUDA graph keeps these values, as it keeps every argument).
struct BinaryMeta {
    int64_t shape[4];     // out's shape, padded with leading 1s
    int64_t a_stride[4];  // a's strides in elements, 0 along a broadcast dimension
    int64_t b_stride[4];  // b's strides in elements, 0 along a broadcast dimension
};

// ---- unary: relu, silu -----------------------------------------------------------------------------

// x (n,) -> out (n,)
__global__ void unary_kernel(int op, float* __restrict__ out, const float* __restrict__ x, int64_t n) {
    // TODO(lab4/03) begin: a grid-stride loop with 64-bit indices: thread (block, thread) handles i, i + the grid's thread count, ... below n, writing relu (op 0) or silu (op 1) of x[i]; see the chapter's section "Broadcasting by strides"; about 6 lines; try n = 1, n = 33 and n past 4096 x 256.
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float v = x[i];
        out[i] = op == 0 ? (v > 0.0f ? v : 0.0f) : v / (1.0f + expf(-v));
    }
    // TODO(lab4/03) end
}

COURSE_API cudaError_t kiln_unary(int op, float* out, const float* x, int64_t n, cudaStream_t stream) {
    if (op != 0 && op != 1) return cudaErrorInvalidValue;
    // TODO(lab4/03) begin: launch unary_kernel with blocks_for(n) blocks of THREADS threads on `stream` (the fourth launch parameter); see the chapter's section "Broadcasting by strides"; 1 line.
    unary_kernel<<<blocks_for(n), THREADS, 0, stream>>>(op, out, x, n);
    // TODO(lab4/03) end
    return cudaGetLastError();
}

// ---- binary: add, mul with broadcasting ------------------------------------------------------------

// a, b (broadcast to out's shape through their strides) -> out (shape[0], ..., shape[3])
__global__ void binary_kernel(int op, float* __restrict__ out, const float* __restrict__ a,
                              const float* __restrict__ b, BinaryMeta m) {
    // TODO(lab4/03) begin: a grid-stride loop over out's elements; unravel the flat index i into (i0, i1, i2, i3), last dimension fastest, and read a and b at the sums of index times stride (a stride of 0 reads the same element along that dimension); see the chapter's section "Broadcasting by strides"; about 15 lines; try a (4, 1) + b (3,) -> (4, 3).
    const int64_t n = m.shape[0] * m.shape[1] * m.shape[2] * m.shape[3];
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        int64_t rest = i, at_a = 0, at_b = 0;
        for (int d = 3; d >= 0; --d) {  // the last dimension varies fastest in a row-major tensor
            const int64_t id = rest % m.shape[d];
            rest /= m.shape[d];
            at_a += id * m.a_stride[d];
            at_b += id * m.b_stride[d];
        }
        const float u = a[at_a], v = b[at_b];
        out[i] = op == 0 ? u + v : u * v;
    }
    // TODO(lab4/03) end
}

COURSE_API cudaError_t kiln_binary(int op, float* out, const float* a, const float* b, const int64_t* meta,
                                   cudaStream_t stream) {
    if (op != 0 && op != 1) return cudaErrorInvalidValue;
    // TODO(lab4/03) begin: copy the 12 values of the host array meta into a BinaryMeta, count out's elements and launch binary_kernel on `stream` with the struct as an argument (by value: the host array is read now, never by the kernel); see the chapter's section "Broadcasting by strides"; about 8 lines.
    BinaryMeta m;
    for (int d = 0; d < 4; ++d) {
        m.shape[d] = meta[d];
        m.a_stride[d] = meta[4 + d];
        m.b_stride[d] = meta[8 + d];
    }
    const int64_t n = m.shape[0] * m.shape[1] * m.shape[2] * m.shape[3];
    binary_kernel<<<blocks_for(n), THREADS, 0, stream>>>(op, out, a, b, m);
    // TODO(lab4/03) end
    return cudaGetLastError();
}

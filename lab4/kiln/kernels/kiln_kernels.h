// kiln_kernels.h — every CUDA entry point of kiln's kernels, in one place (given: do not edit).
//
// The CUDA executor (kiln/cuda.py) calls these through ctypes; lab 5 adds its kernels' entry
// points below the line at the end. Each .cu file of kiln/kernels/ includes this header, so the
// compiler checks every definition against its declaration here.
//
// The conventions every entry point follows, because the executor captures a whole forward pass
// into one CUDA graph (tasks 06-07):
//   - data is float32, DEVICE memory, dense and row-major; shapes, strides and offsets are int64;
//   - shapes have rank <= 4 and are passed padded to 4 dimensions with leading 1s;
//   - `meta` arrays are HOST memory, read while the call queues its kernel and passed to the
//     kernel by value: a CUDA graph keeps those values, as it keeps every kernel argument;
//   - `stream` is the last argument; the call launches only on it, never synchronizes, never
//     allocates, and returns the launch's error (cudaGetLastError()).

#pragma once

#include <cstdint>

#include "course.h"

// ---- task 03: pointwise (pointwise.cu) ------------------------------------------------------------

// out[i] = f(x[i]) for i < n; op: 0 relu, 1 silu (x * sigmoid(x)).
COURSE_API cudaError_t kiln_unary(int op, float* out, const float* x, int64_t n, cudaStream_t stream);

// out = a (op) b with numpy broadcasting; op: 0 add, 1 mul.
// meta (HOST, 12 int64): out shape[4] | a strides[4] | b strides[4], in elements; a stride is 0
// along a dimension that operand broadcasts.
COURSE_API cudaError_t kiln_binary(int op, float* out, const float* a, const float* b, const int64_t* meta,
                                   cudaStream_t stream);

// ---- task 04: matmul (matmul.cu) ------------------------------------------------------------------

// c[i] (m, n) = a[i] (m, k) @ b[i] (k, n) for i < batch, every matrix row-major and contiguous;
// a[i] starts at a + i * a_batch_stride, b[i] at b + i * b_batch_stride (0: one matrix for all i),
// c[i] at c + i * m * n.
COURSE_API cudaError_t kiln_matmul(float* c, const float* a, const float* b, int64_t batch, int64_t m, int64_t n,
                                   int64_t k, int64_t a_batch_stride, int64_t b_batch_stride, cudaStream_t stream);

// ---- task 05: layout (layout.cu) ------------------------------------------------------------------

// out (contiguous, shape meta[0:4]) element (i0, i1, i2, i3) = in[meta[8] + sum_d i_d * meta[4 + d]].
// meta (HOST, 9 int64): out shape[4] | in strides[4] | in offset. permute and slice are both this.
COURSE_API cudaError_t kiln_strided_copy(float* out, const float* in, const int64_t* meta, cudaStream_t stream);

// target[o0 + j0, o1 + j1, o2 + j2, o3 + j3] = value[j0, j1, j2, j3] for every j inside value, where
// the offsets o are DEVICE memory (4 int64), read by the kernel when it runs. An element whose
// target position falls outside the target (an offset past the end, or below 0) is skipped:
// whatever the offsets, nothing outside target is written.
// meta (HOST, 8 int64): target shape[4] | value shape[4].
COURSE_API cudaError_t kiln_slice_update(float* target, const float* value, const int64_t* offsets,
                                         const int64_t* meta, cudaStream_t stream);

// ---- lab 5 adds its entry points below ------------------------------------------------------------

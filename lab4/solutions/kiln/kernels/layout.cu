// Lab 4 · Task 05 — kiln's layout kernels: one strided copy (permute, slice) and slice update
//
// Implement: strided_copy_kernel and slice_update_kernel as grid-stride loops with 64-bit indices,
//            and their launches.
// Contract:  float32 DEVICE data; out and target overlap no other argument; in and value are
//            read-only. Shapes are padded to 4 dims with leading 1s; every dimension >= 1.
//            kiln_strided_copy: meta is a HOST array of 9 int64: out's shape[4], in's strides[4]
//                (in elements, any value >= 0), in's offset. out is contiguous, and its element
//                (i0, i1, i2, i3) = in[offset + sum_d i_d * stride[d]]. permute is this with the
//                strides permuted; slice is this with the offset at the slice's first element.
//            kiln_slice_update: offsets is a DEVICE array of 4 int64 (o0..o3), read by the kernel
//                when it runs, never by the host; meta is a HOST array of 8 int64: target's
//                shape[4], then value's shape[4]. For every element j of value,
//                target[o0 + j0, ..., o3 + j3] = value[j0, ..., j3] when that position lies inside
//                target (0 <= o_d + j_d < target shape[d] for every d); otherwise that element is
//                skipped. Whatever the offsets (past the end, negative), nothing outside target is
//                written, and target keeps every element value does not land on.
//            Both launch only on `stream`, never synchronize or allocate, and return the launch's
//            error.
// Test:      make test-lab4 TASK=05

#include "kiln/kernels/kiln_kernels.h"

#include <cstdint>

constexpr int THREADS = 256;
constexpr int64_t MAX_BLOCKS = 4096;  // a capped grid; the grid-stride loops cover the rest

[[maybe_unused]] static unsigned int blocks_for(int64_t n) {
    const int64_t blocks = (n + THREADS - 1) / THREADS;
    return static_cast<unsigned int>(blocks < 1 ? 1 : (blocks < MAX_BLOCKS ? blocks : MAX_BLOCKS));
}

// The host metas travel to the kernels by value, as launch arguments.
struct CopyMeta {
    int64_t shape[4];   // out's shape
    int64_t stride[4];  // in's strides, in elements
    int64_t offset;     // in's first element
};

struct UpdateMeta {
    int64_t target[4];  // target's shape
    int64_t value[4];   // value's shape
};

// ---- strided copy: permute and slice ------------------------------------------------------------

// in (any strides, from offset) -> out (shape[0], ..., shape[3]), contiguous
__global__ void strided_copy_kernel(float* __restrict__ out, const float* __restrict__ in, CopyMeta m) {
    // TODO(lab4/05) begin: a grid-stride loop over out's elements: unravel the flat index i into (i0, i1, i2, i3), last dimension fastest, and copy in[offset + sum of index times stride] to out[i]; see the chapter's section "Permute and slice as one strided copy"; about 12 lines; try a (2, 3) transposed and a slice [1:3] of (5,).
    const int64_t n = m.shape[0] * m.shape[1] * m.shape[2] * m.shape[3];
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        int64_t rest = i, at = m.offset;
        for (int d = 3; d >= 0; --d) {
            at += (rest % m.shape[d]) * m.stride[d];
            rest /= m.shape[d];
        }
        out[i] = in[at];
    }
    // TODO(lab4/05) end
}

COURSE_API cudaError_t kiln_strided_copy(float* out, const float* in, const int64_t* meta, cudaStream_t stream) {
    // TODO(lab4/05) begin: copy the 9 values of the host array meta into a CopyMeta and launch strided_copy_kernel on `stream` with blocks_for(out's element count) blocks; see the chapter's section "Permute and slice as one strided copy"; about 8 lines.
    CopyMeta m;
    for (int d = 0; d < 4; ++d) {
        m.shape[d] = meta[d];
        m.stride[d] = meta[4 + d];
    }
    m.offset = meta[8];
    const int64_t n = m.shape[0] * m.shape[1] * m.shape[2] * m.shape[3];
    strided_copy_kernel<<<blocks_for(n), THREADS, 0, stream>>>(out, in, m);
    // TODO(lab4/05) end
    return cudaGetLastError();
}

// ---- slice update: offsets read on the device -------------------------------------------------------

// value (value[0], ..., value[3]) -> target at offsets (read from device memory now, at run time)
__global__ void slice_update_kernel(float* __restrict__ target, const float* __restrict__ value,
                                    const int64_t* __restrict__ offsets, UpdateMeta m) {
    // TODO(lab4/05) begin: read the 4 offsets from device memory, then a grid-stride loop over value's elements: unravel j, add the offsets, skip the element when any coordinate falls outside target (below 0 or at/past its size), else write it at its row-major position in target; see the chapter's section "Slice update: offsets read on the device"; about 20 lines; try offsets at the last position and past the end.
    int64_t o[4];
    for (int d = 0; d < 4; ++d) o[d] = offsets[d];  // the same 32 bytes for every thread: served by the cache
    const int64_t n = m.value[0] * m.value[1] * m.value[2] * m.value[3];
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        int64_t rest = i, at = 0, scale = 1;
        bool inside = true;
        for (int d = 3; d >= 0; --d) {
            const int64_t t = o[d] + rest % m.value[d];  // coordinate d in target
            rest /= m.value[d];
            inside = inside && t >= 0 && t < m.target[d];
            at += t * scale;
            scale *= m.target[d];
        }
        if (inside) target[at] = value[i];
    }
    // TODO(lab4/05) end
}

COURSE_API cudaError_t kiln_slice_update(float* target, const float* value, const int64_t* offsets,
                                         const int64_t* meta, cudaStream_t stream) {
    // TODO(lab4/05) begin: copy the host meta into an UpdateMeta and launch slice_update_kernel on `stream` over value's elements, passing the DEVICE pointer offsets as it is (reading it here would freeze the offsets of the first call into a CUDA graph); see the chapter's section "Slice update: offsets read on the device"; about 8 lines.
    UpdateMeta m;
    for (int d = 0; d < 4; ++d) {
        m.target[d] = meta[d];
        m.value[d] = meta[4 + d];
    }
    const int64_t n = m.value[0] * m.value[1] * m.value[2] * m.value[3];
    slice_update_kernel<<<blocks_for(n), THREADS, 0, stream>>>(target, value, offsets, m);
    // TODO(lab4/05) end
    return cudaGetLastError();
}

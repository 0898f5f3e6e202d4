// Lab 3 · Task 06 — your linear kernel as a PyTorch operator: lab3ext::linear, with a backward
//
// Implement: here, the tiled kernel for y = x·wᵀ + b and its launch, for float32 and float64;
//            in 06_extension.py, the op's fake (what torch.compile traces with) and its backward
//            (three products, two of them through this same op).
// Contract:  lab3ext::linear(Tensor x, Tensor w, Tensor b) -> Tensor, torch.nn.Linear's layout:
//            x (B, in), w (out, in), b (out,) -> y (B, out), a new contiguous tensor on x's device.
//            CUDA tensors, all float32 or all float64 (gradcheck runs in float64); B, in, out >= 0.
//            The given binding, 06_extension_op.cpp (schema, checks, contiguous copies,
//            allocation, dispatch on the dtype), calls linear_launch<T> with raw device pointers
//            of contiguous tensors, B >= 1, out >= 1, in >= 0 and torch's current stream:
//            linear_launch enqueues on `stream`, never writes x, w or b, returns the launch's
//            error and does not synchronize.
// Test:      make test-lab3 TASK=06
//
// Built by torch.utils.cpp_extension (ninja) with 06_extension_op.cpp into the library
// lab3_extension; that file's TORCH_LIBRARY block registers the op's schema with the dispatcher,
// TORCH_LIBRARY_IMPL its CUDA kernel, and 06_extension.py adds the fake and the autograd formula
// from Python. No torch header here: an edit of this file recompiles in about a second, where one
// including torch's headers takes tens of seconds.

#include <cstddef>
#include <cstdint>

#include "course.h"

constexpr int TILE = 16;  // TILE x TILE outputs per block, TILE-wide steps along k

// ---- the kernel: y = x·wᵀ + b --------------------------------------------------------------------

// TODO(lab3/06) begin: a tiled kernel, templated on T (float, double), for y (B, out) = x (B, in) · wᵀ + b with w in (out, in) layout: each block stages a TILE x TILE tile of x and one of w in shared memory per step along k, every load and store guarded; see the chapter's section "The kernel as a torch operator"; about 25 lines; your task 02 kernel with T for float.
// x (B, in) @ wᵀ (in, out) + b (out,) -> y (B, out)
//
// As in task 02: y[i][j] is the dot product of row i of x with row j of w, so both tiles are
// loaded along their rows (threadIdx.x walks k, every global load coalesced), and the w tile is
// read back across its rows through a +1 column that spreads those reads over the banks.
template <typename T>
__global__ void linear_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                              T* __restrict__ y, int B, int in, int out) {
    __shared__ T xs[TILE][TILE];      // xs[r][kk] = x[row0 + r][k0 + kk]
    __shared__ T ws[TILE][TILE + 1];  // ws[c][kk] = w[col0 + c][k0 + kk]
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row0 = blockIdx.y * TILE, col0 = blockIdx.x * TILE;
    const int i = row0 + ty, j = col0 + tx;  // the output this thread owns
    T acc = 0;
    for (int k0 = 0; k0 < in; k0 += TILE) {
        const int k = k0 + tx;
        // zeros past the edges add nothing to the dot products, so the inner loop needs no guard
        xs[ty][tx] = (i < B && k < in) ? x[(size_t)i * in + k] : T(0);
        ws[ty][tx] = (col0 + ty < out && k < in) ? w[(size_t)(col0 + ty) * in + k] : T(0);
        __syncthreads();
        for (int kk = 0; kk < TILE; ++kk) acc += xs[ty][kk] * ws[tx][kk];
        __syncthreads();  // the next step overwrites the tiles others may still be reading
    }
    if (i < B && j < out) y[(size_t)i * out + j] = acc + b[j];
}
// TODO(lab3/06) end

template <typename T>
cudaError_t linear_launch(const T* x, const T* w, const T* b, T* y, int B, int in, int out, cudaStream_t stream) {
    if (B > 65535 * TILE) return cudaErrorInvalidValue;  // gridDim.y reaches 65535 tiles of rows at most
    // TODO(lab3/06) begin: launch your kernel on `stream` with one TILE x TILE block per tile of y, enough to cover B rows and out columns; see the chapter's section "The kernel as a torch operator"; about 4 lines; the fourth launch parameter is the stream.
    const dim3 block(TILE, TILE);
    const dim3 grid((out + TILE - 1) / TILE, (B + TILE - 1) / TILE);
    linear_kernel<T><<<grid, block, 0, stream>>>(x, w, b, y, B, in, out);
    CUDA_CHECK(cudaGetLastError());
    return cudaSuccess;
    //~ return cudaErrorNotYetImplemented;
    // TODO(lab3/06) end
}

// The two instances the binding calls (it sees only the declaration).
template cudaError_t linear_launch<float>(const float*, const float*, const float*, float*, int, int, int,
                                          cudaStream_t);
template cudaError_t linear_launch<double>(const double*, const double*, const double*, double*, int, int, int,
                                           cudaStream_t);

// Lab 3 · Task 02 — the MLP on the GPU with your own kernels: linear, ReLU, argmax
//
// Implement: linear (y = x·wᵀ + b, a tiled shared-memory kernel), relu_inplace, argmax_rows, and
//            mlp_predict, which classifies n images with them, `batch` images at a time:
//            labels = argmax(relu(x·w1ᵀ + b1)·w2ᵀ + b2).
// Contract:  every pointer is DEVICE memory, row-major and contiguous; inputs are read-only and
//            no output overlaps an input. float32 except the labels (int64).
//            linear:       x (B, in), w (out, in) as torch.nn.Linear stores it, b (out,) ->
//                          y (B, out). 1 <= B <= 65535·16, in, out >= 1, B·in, B·out, out·in < 2^31.
//            relu_inplace: y (n,) -> max(y, 0) in place; n >= 1.
//            argmax_rows:  logits (B, classes) -> labels (B,), the index of each row's largest
//                          value, the lowest index among equal ones (as torch.argmax); values are
//                          finite; B, classes >= 1.
//            mlp_predict:  x (n, 784), w1 (1000, 784), b1 (1000,), w2 (10, 1000), b2 (10,) ->
//                          labels (n,); n >= 1, 1 <= batch <= 65535·16. The last batch holds the
//                          n - k·batch images that are left: nothing past x is read and nothing
//                          past labels is written.
//            All launch on the default stream, return the first error and do not synchronize
//            (mlp_predict may, when it has to grow its scratch buffer).
// Test:      make test-lab3 TASK=02

#include "course.h"

#include <cstddef>
#include <cstdint>

constexpr int TILE = 16;        // linear's tile: TILE x TILE outputs per block, TILE-wide k steps
constexpr int THREADS = 256;    // relu's block
constexpr int WARPS = 4;        // argmax's block: one warp per row
constexpr int IMAGE = 28 * 28;  // the network's input features
constexpr int HIDDEN = 1000;    // fc1's outputs
constexpr int CLASSES = 10;     // fc2's outputs

// ---- linear: y = x·wᵀ + b ------------------------------------------------------------------------

// TODO(lab3/02) begin: a tiled kernel for y (B, out) = x (B, in) · wᵀ + b with w in (out, in) layout: each block stages a TILE x TILE tile of x and one of w in shared memory per step along k, every load and store guarded for B, in, out that are not multiples of TILE; see the chapter's section "The forward pass as kernels"; about 30 lines; try 1x33->17 and 7x1000->10.
// x (B, in) @ wᵀ (in, out) + b (out,) -> y (B, out)
//
// y[i][j] is the dot product of row i of x with row j of w: both operands are read along their
// rows, so the tile of x and the tile of w are loaded the same way, threadIdx.x walking k, and
// every global load is coalesced. threadIdx.x also walks j for the store, so a warp writes
// neighbouring outputs. The w tile is read back across its rows (ws[tx][kk]): the +1 column
// puts those TILE reads in TILE different banks instead of two.
__global__ void linear_kernel(const float* __restrict__ x, const float* __restrict__ w,
                              const float* __restrict__ b, float* __restrict__ y, int B, int in,
                              int out) {
    __shared__ float xs[TILE][TILE];      // xs[r][kk] = x[row0 + r][k0 + kk]
    __shared__ float ws[TILE][TILE + 1];  // ws[c][kk] = w[col0 + c][k0 + kk]
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row0 = blockIdx.y * TILE, col0 = blockIdx.x * TILE;
    const int i = row0 + ty, j = col0 + tx;  // the output this thread owns
    float acc = 0.0f;
    for (int k0 = 0; k0 < in; k0 += TILE) {
        const int k = k0 + tx;
        // zeros past the edges add nothing to the dot products, so the inner loop needs no guard
        xs[ty][tx] = (i < B && k < in) ? x[(size_t)i * in + k] : 0.0f;
        ws[ty][tx] = (col0 + ty < out && k < in) ? w[(size_t)(col0 + ty) * in + k] : 0.0f;
        __syncthreads();
        for (int kk = 0; kk < TILE; ++kk) acc += xs[ty][kk] * ws[tx][kk];
        __syncthreads();  // the next step overwrites the tiles others may still be reading
    }
    if (i < B && j < out) y[(size_t)i * out + j] = acc + b[j];
}
// TODO(lab3/02) end

COURSE_API cudaError_t linear(const float* x, const float* w, const float* b, float* y, int B, int in,
                              int out) {
    // TODO(lab3/02) begin: launch your kernel with one TILE x TILE block per tile of y, enough to cover B rows and out columns; see the chapter's section "The forward pass as kernels"; about 4 lines; work out the grid for 1x784->1000 and 1000x1000->10.
    const dim3 block(TILE, TILE);
    const dim3 grid((out + TILE - 1) / TILE, (B + TILE - 1) / TILE);
    linear_kernel<<<grid, block>>>(x, w, b, y, B, in, out);
    return cudaGetLastError();
    //~ return cudaErrorNotYetImplemented;
    // TODO(lab3/02) end
}

// ---- ReLU and argmax ---------------------------------------------------------------------------------

// TODO(lab3/02) begin: a kernel that replaces every y[i] by max(y[i], 0), for any n; see the chapter's section "The forward pass as kernels"; about 6 lines; try n = 1 and n = 1000003.
// y (n,) -> y (n,) in place, grid-stride so that any n fits a bounded grid
__global__ void relu_kernel(float* __restrict__ y, size_t n) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        y[i] = fmaxf(y[i], 0.0f);
}
// TODO(lab3/02) end

COURSE_API cudaError_t relu_inplace(float* y, int n) {
    // TODO(lab3/02) begin: launch your ReLU kernel over all n elements; see the chapter's section "The forward pass as kernels"; about 3 lines.
    const int blocks = (n + THREADS - 1) / THREADS;
    relu_kernel<<<blocks < 4096 ? blocks : 4096, THREADS>>>(y, (size_t)n);
    return cudaGetLastError();
    //~ return cudaErrorNotYetImplemented;
    // TODO(lab3/02) end
}

// TODO(lab3/02) begin: a kernel that writes, for each row of logits, the index of its largest value, the lowest index among equal values (as torch.argmax does); see the chapter's section "The forward pass as kernels"; about 20 lines; try rows with ties, classes = 1 and classes = 1000.
// logits (B, classes) -> labels (B,). One warp per row: each lane keeps the best of the classes
// it strides over, then the warp halves its candidates five times. A candidate wins with a larger
// value, or an equal value at a lower index, so a tie goes to the lowest index whatever the order
// the lanes met it in.
__global__ void argmax_kernel(const float* __restrict__ logits, int64_t* __restrict__ labels, int B,
                              int classes) {
    const int lane = threadIdx.x % 32;
    const int row = blockIdx.x * WARPS + threadIdx.x / 32;
    if (row >= B) return;  // a whole warp leaves together: the shuffles below see all 32 lanes
    const float* r = logits + (size_t)row * classes;
    float best = -INFINITY;
    int at = classes;  // past every real index: loses every tie
    for (int c = lane; c < classes; c += 32)
        if (r[c] > best) best = r[c], at = c;  // c only grows: the first of equal values stays
    for (int offset = 16; offset > 0; offset /= 2) {
        const float v = __shfl_down_sync(0xffffffffu, best, offset);
        const int i = __shfl_down_sync(0xffffffffu, at, offset);
        if (v > best || (v == best && i < at)) best = v, at = i;
    }
    if (lane == 0) labels[row] = at;
}
// TODO(lab3/02) end

COURSE_API cudaError_t argmax_rows(const float* logits, int64_t* labels, int B, int classes) {
    // TODO(lab3/02) begin: launch your argmax kernel with enough threads for every row; see the chapter's section "The forward pass as kernels"; about 3 lines.
    argmax_kernel<<<(B + WARPS - 1) / WARPS, WARPS * 32>>>(logits, labels, B, classes);
    return cudaGetLastError();
    //~ return cudaErrorNotYetImplemented;
    // TODO(lab3/02) end
}

// ---- the network ---------------------------------------------------------------------------------

// x (n, 784) -> labels (n,), batch images at a time:
//   x[s:s+m] (m, 784) @ w1ᵀ (784, 1000) + b1 -> h (m, 1000)
//   relu(h)                                    -> h (m, 1000)
//   h (m, 1000) @ w2ᵀ (1000, 10) + b2          -> logits (m, 10)
//   argmax over the 10 classes                 -> labels[s:s+m] (m,)
// with m = batch, except for the last batch, which has only the images that are left.
//
// h and logits live in one scratch buffer that is allocated on the first call and kept, grown
// only when a larger batch comes: cudaMalloc costs tens of microseconds and cudaFree waits for the
// whole device, more than the network itself takes at batch 1. The buffer lives as long as the
// library (the driver frees it with the process); the price is that calls must not run
// concurrently from several host threads.
COURSE_API cudaError_t mlp_predict(const float* x, int n, int batch, const float* w1, const float* b1,
                                   const float* w2, const float* b2, int64_t* labels) {
    // TODO(lab3/02) begin: run the network over n images, batch at a time, through your three entry points and a scratch buffer for h and the logits; the last batch has only n - k·batch images: read nothing past x and write nothing past labels; see the chapter's section "The forward pass as kernels"; about 20 lines; try n = 1 with batch 64, and n = 1000 with batch 256.
    static float* scratch = nullptr;
    static int scratch_rows = 0;  // the batch the buffer holds
    if (batch > scratch_rows) {
        CUDA_CHECK(cudaFree(scratch));  // cudaFree(nullptr) does nothing
        scratch = nullptr;
        scratch_rows = 0;
        CUDA_CHECK(cudaMalloc(&scratch, (size_t)batch * (HIDDEN + CLASSES) * sizeof(float)));
        scratch_rows = batch;
    }
    float* h = scratch;                               // (batch, 1000)
    float* logits = scratch + (size_t)batch * HIDDEN;  // (batch, 10)
    for (int start = 0; start < n; start += batch) {
        const int rows = n - start < batch ? n - start : batch;  // the last batch may be short
        CUDA_CHECK(linear(x + (size_t)start * IMAGE, w1, b1, h, rows, IMAGE, HIDDEN));
        CUDA_CHECK(relu_inplace(h, rows * HIDDEN));
        CUDA_CHECK(linear(h, w2, b2, logits, rows, HIDDEN, CLASSES));
        CUDA_CHECK(argmax_rows(logits, labels + start, rows, CLASSES));
    }
    return cudaSuccess;
    //~ return cudaErrorNotYetImplemented;
    // TODO(lab3/02) end
}

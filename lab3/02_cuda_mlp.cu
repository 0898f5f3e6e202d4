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
// TODO(lab3/02) end

COURSE_API cudaError_t linear(const float* x, const float* w, const float* b, float* y, int B, int in,
                              int out) {
    // TODO(lab3/02) begin: launch your kernel with one TILE x TILE block per tile of y, enough to cover B rows and out columns; see the chapter's section "The forward pass as kernels"; about 4 lines; work out the grid for 1x784->1000 and 1000x1000->10.
    return cudaErrorNotYetImplemented;  //~
    // TODO(lab3/02) end
}

// ---- ReLU and argmax ---------------------------------------------------------------------------------

// TODO(lab3/02) begin: a kernel that replaces every y[i] by max(y[i], 0), for any n; see the chapter's section "The forward pass as kernels"; about 6 lines; try n = 1 and n = 1000003.
// TODO(lab3/02) end

COURSE_API cudaError_t relu_inplace(float* y, int n) {
    // TODO(lab3/02) begin: launch your ReLU kernel over all n elements; see the chapter's section "The forward pass as kernels"; about 3 lines.
    return cudaErrorNotYetImplemented;  //~
    // TODO(lab3/02) end
}

// TODO(lab3/02) begin: a kernel that writes, for each row of logits, the index of its largest value, the lowest index among equal values (as torch.argmax does); see the chapter's section "The forward pass as kernels"; about 20 lines; try rows with ties, classes = 1 and classes = 1000.
// TODO(lab3/02) end

COURSE_API cudaError_t argmax_rows(const float* logits, int64_t* labels, int B, int classes) {
    // TODO(lab3/02) begin: launch your argmax kernel with enough threads for every row; see the chapter's section "The forward pass as kernels"; about 3 lines.
    return cudaErrorNotYetImplemented;  //~
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
    return cudaErrorNotYetImplemented;  //~
    // TODO(lab3/02) end
}

// Lab 3 · Task 04 — your own direct convolution, the kernel that cuDNN's graph (04_cudnn.cpp) is
//                    compared with
//
// Implement: conv2d_bias_relu_direct, the convolution + bias + ReLU of a CNN layer as a kernel of
//            yours (one thread per output).
// Contract:  every pointer is DEVICE memory holding float32, row-major and contiguous as torch
//            stores it; inputs are read-only and no output overlaps an input.
//            x (N, C, H, W), w (K, C, R, S), b (K,) -> y (N, K, P, Q) = max(conv2d(x, w, padding=pad)
//            + b, 0), stride 1, dilation 1, cross-correlation as torch's conv2d, zeros outside x,
//            P = H + 2·pad - R + 1 >= 1, Q = W + 2·pad - S + 1 >= 1; N, C, H, W, K, R, S >= 1,
//            pad >= 0, every array < 2^31 elements. float32 throughout. Runs on the legacy default
//            stream, returns the launch's error, does not synchronize.
// Test:      make test-lab3 TASK=04

#include "course.h"

#include <cstddef>

constexpr int THREADS = 256;

// y[n][k][p][q] = max(b[k] + sum over c, r, s of x[n][c][p + r - pad][q + s - pad] · w[k][c][r][s], 0),
// the x terms outside the image being zero. Consecutive threads take consecutive q: a warp reads
// neighbouring x elements (coalesced) and the same w element (one broadcast load).
__global__ void conv2d_bias_relu_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                        const float* __restrict__ b, float* __restrict__ y, int N, int C, int H,
                                        int W, int K, int R, int S, int pad, int P, int Q) {
    const size_t total = (size_t)N * K * P * Q;
    // TODO(lab3/04) begin: one thread per output element (a grid-stride loop over the N·K·P·Q of them): recover n, k, p, q from the flat index (q fastest), sum x·w over c, r, s skipping the taps that fall in the padding, add b[k], apply the ReLU and store; see the chapter's section "Your own convolution"; about 20 lines; try the odd 3x3x9x7 case with R = 3, S = 5, where swapping R and S shows.
    (void)total;  //~
    // TODO(lab3/04) end
}

COURSE_API cudaError_t conv2d_bias_relu_direct(const float* x, const float* w, const float* b, float* y, int N, int C,
                                               int H, int W, int K, int R, int S, int pad) {
    const int P = H + 2 * pad - R + 1, Q = W + 2 * pad - S + 1;
    const size_t total = (size_t)N * K * P * Q;
    // enough blocks to fill the card several times over; the grid-stride loop covers the rest
    const unsigned blocks = (unsigned)(total / THREADS + 1 < 65536 * 16 ? total / THREADS + 1 : 65536 * 16);
    // TODO(lab3/04) begin: launch conv2d_bias_relu_kernel with `blocks` blocks of THREADS threads on the default stream, then check the launch; see the chapter's section "Your own convolution"; about 3 lines.
    (void)x, (void)w, (void)b, (void)y, (void)N, (void)C, (void)K, (void)blocks;  //~
    return cudaErrorNotYetImplemented;  //~
    // TODO(lab3/04) end
}

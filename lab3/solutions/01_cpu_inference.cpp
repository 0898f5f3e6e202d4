// Lab 3 · Task 01 — CPU inference: the MLP's forward pass as plain C++ loops
//
// Implement: linear_cpu (y = x·wᵀ + b, with w in torch's (out, in) layout) and relu_cpu (in
//            place). mlp_forward_cpu, given, chains them into the network's forward pass:
//            logits = relu(x·w1ᵀ + b1)·w2ᵀ + b2.
// Contract:  every pointer is HOST float32 memory, row-major and contiguous, with no overlap
//            between inputs and outputs. x (batch, in), w (out, in) as torch.nn.Linear stores
//            it (row j holds the in weights of output j), b (out,), y (batch, out). batch,
//            in, out >= 1. Plain C++ only: no torch/ATen call and no BLAS; the course's binding
//            (01_cpu_inference_binding.cpp) checks the tensors, allocates h and logits, and
//            registers the op lab3::mlp_forward_cpu(x, w1, b1, w2, b2) -> logits.
// Test:      make test-lab3 TASK=01

#include <cstdint>

// ---- the two layers ------------------------------------------------------------------------------

// x (batch, in) @ wᵀ (in, out) + b (out,) -> y (batch, out)
//
// y[i][j] is the dot product of row i of x with row j of w: both rows are contiguous, so the
// reduction over k belongs in the innermost loop (a loop over j inside k would stride w by `in`
// floats, 3 KB, one cache line per multiply). The weights go in the outer loop, the images in the
// middle one: a row of w (3 KB for fc1) is read once and reused from L1 for every image, instead of
// all of w (3 MB) being read again per image; the chapter measures what that buys on a CPU.
void linear_cpu(const float* x, const float* w, const float* b, float* y, int64_t batch, int64_t in, int64_t out) {
    // TODO(lab3/01) begin: y[i][j] = b[j] + the dot product of row i of x with row j of w, for every image i and output j; see the chapter's section "The forward pass as loops"; about 10 lines; keep the index you sum over innermost, and try batch 1 and 3.
    for (int64_t j = 0; j < out; ++j) {
        const float* wj = w + j * in;  // row j of w: the weights of output j, contiguous
        for (int64_t i = 0; i < batch; ++i) {
            const float* xi = x + i * in;  // row i of x: one image, contiguous
            float acc = b[j];
            for (int64_t k = 0; k < in; ++k) {
                acc += xi[k] * wj[k];
            }
            y[i * out + j] = acc;
        }
    }
    // TODO(lab3/01) end
}

// h (n,) -> max(h, 0) in place
void relu_cpu(float* h, int64_t n) {
    // TODO(lab3/01) begin: every negative element of h becomes 0, the others stay as they are; see the chapter's section "The forward pass as loops"; about 3 lines.
    for (int64_t i = 0; i < n; ++i) {
        h[i] = h[i] > 0.0f ? h[i] : 0.0f;
    }
    // TODO(lab3/01) end
}

// ---- given: the network ----------------------------------------------------------------------------

// x (batch, n_in) -> h (batch, n_hidden) -> logits (batch, n_out); h is scratch the caller owns
void mlp_forward_cpu(const float* x, const float* w1, const float* b1, const float* w2, const float* b2, float* h,
                     float* logits, int64_t batch, int64_t n_in, int64_t n_hidden, int64_t n_out) {
    linear_cpu(x, w1, b1, h, batch, n_in, n_hidden);  // x (B, 784) @ w1ᵀ (784, 1000) -> h (B, 1000)
    relu_cpu(h, batch * n_hidden);
    linear_cpu(h, w2, b2, logits, batch, n_hidden, n_out);  // h (B, 1000) @ w2ᵀ (1000, 10) -> logits (B, 10)
}

// 01_cpu_inference_binding.cpp — given, not graded: the course's half of lab 3 task 01.
//
// It declares the op lab3::mlp_forward_cpu(x, w1, b1, w2, b2) -> logits, checks the tensors
// (CPU, float32, the shapes of torch.nn.Linear's (out, in) layout), allocates the hidden
// activations and the logits, and calls your mlp_forward_cpu in 01_cpu_inference.cpp with raw
// pointers. Your file includes no torch header, so an edit to it recompiles in about a second.
#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <cstdint>

void mlp_forward_cpu(const float* x, const float* w1, const float* b1, const float* w2, const float* b2, float* h,
                     float* logits, int64_t batch, int64_t n_in, int64_t n_hidden, int64_t n_out);

namespace {

void check_f32_cpu(const at::Tensor& t, const char* name, int64_t dims) {
    TORCH_CHECK(t.device().is_cpu(), "mlp_forward_cpu: ", name, " must be a CPU tensor, got ", t.device());
    TORCH_CHECK(t.scalar_type() == at::kFloat, "mlp_forward_cpu: ", name, " must be float32, got ", t.scalar_type());
    TORCH_CHECK(t.dim() == dims, "mlp_forward_cpu: ", name, " must have ", dims, " dimensions, got shape ", t.sizes());
}

at::Tensor mlp_forward(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
                       const at::Tensor& b2) {
    check_f32_cpu(x, "x", 2);
    check_f32_cpu(w1, "w1", 2);
    check_f32_cpu(b1, "b1", 1);
    check_f32_cpu(w2, "w2", 2);
    check_f32_cpu(b2, "b2", 1);
    const int64_t batch = x.size(0), n_in = x.size(1), n_hidden = w1.size(0), n_out = w2.size(0);
    TORCH_CHECK(batch >= 1, "mlp_forward_cpu: x must hold at least one image, got shape ", x.sizes());
    // torch.nn.Linear layout: w (out, in); a weight given as (in, out) is caught here, not summed wrongly
    TORCH_CHECK(w1.size(1) == n_in, "mlp_forward_cpu: w1 must be (hidden, ", n_in, ") in torch's (out, in) layout, got ",
                w1.sizes());
    TORCH_CHECK(w2.size(1) == n_hidden, "mlp_forward_cpu: w2 must be (out, ", n_hidden,
                ") in torch's (out, in) layout, got ", w2.sizes());
    TORCH_CHECK(b1.size(0) == n_hidden, "mlp_forward_cpu: b1 must have ", n_hidden, " elements, got ", b1.sizes());
    TORCH_CHECK(b2.size(0) == n_out, "mlp_forward_cpu: b2 must have ", n_out, " elements, got ", b2.sizes());
    const at::Tensor xc = x.contiguous(), w1c = w1.contiguous(), b1c = b1.contiguous();
    const at::Tensor w2c = w2.contiguous(), b2c = b2.contiguous();
    // zeros, not empty: an output the loops never write reads as 0, the same on every run
    at::Tensor h = at::zeros({batch, n_hidden}, xc.options());
    at::Tensor logits = at::zeros({batch, n_out}, xc.options());
    mlp_forward_cpu(xc.const_data_ptr<float>(), w1c.const_data_ptr<float>(), b1c.const_data_ptr<float>(),
                    w2c.const_data_ptr<float>(), b2c.const_data_ptr<float>(), h.mutable_data_ptr<float>(),
                    logits.mutable_data_ptr<float>(), batch, n_in, n_hidden, n_out);
    return logits;
}

}  // namespace

TORCH_LIBRARY(lab3, m) { m.def("mlp_forward_cpu(Tensor x, Tensor w1, Tensor b1, Tensor w2, Tensor b2) -> Tensor"); }

TORCH_LIBRARY_IMPL(lab3, CPU, m) { m.impl("mlp_forward_cpu", &mlp_forward); }

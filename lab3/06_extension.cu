// Lab 3 · Task 06 — your linear kernel as a PyTorch operator: lab3ext::linear, with a backward
//
// Implement: here, the tiled kernel for y = x·wᵀ + b and its launch, for float32 and float64;
//            in 06_extension.py, the op's fake (what torch.compile traces with) and its backward
//            (three products, two of them through this same op).
// Contract:  lab3ext::linear(Tensor x, Tensor w, Tensor b) -> Tensor, torch.nn.Linear's layout:
//            x (B, in), w (out, in), b (out,) -> y (B, out), a new contiguous tensor on x's device.
//            CUDA tensors, all float32 or all float64 (gradcheck runs in float64); B, in, out >= 0,
//            B <= 65535·TILE; inputs need not be contiguous (the binding below makes them so) and
//            are never written. linear_launch enqueues on `stream`, returns the launch's error and
//            does not synchronize.
//            The binding below (schema, checks, allocation, dispatch on the dtype) is given.
// Test:      make test-lab3 TASK=06
//
// Built by torch.utils.cpp_extension (ninja) into the library lab3_extension; its TORCH_LIBRARY
// block registers the op's schema with the dispatcher, TORCH_LIBRARY_IMPL its CUDA kernel, and
// 06_extension.py adds the fake and the autograd formula from Python.

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstddef>
#include <cstdint>

#include "course.h"

constexpr int TILE = 16;  // TILE x TILE outputs per block, TILE-wide steps along k

// ---- the kernel: y = x·wᵀ + b --------------------------------------------------------------------

// TODO(lab3/06) begin: a tiled kernel, templated on T (float, double), for y (B, out) = x (B, in) · wᵀ + b with w in (out, in) layout: each block stages a TILE x TILE tile of x and one of w in shared memory per step along k, every load and store guarded; see the chapter's section "The kernel as a torch operator"; about 25 lines; your task 02 kernel with T for float.
// TODO(lab3/06) end

template <typename T>
cudaError_t linear_launch(const T* x, const T* w, const T* b, T* y, int B, int in, int out, cudaStream_t stream) {
    // TODO(lab3/06) begin: launch your kernel on `stream` with one TILE x TILE block per tile of y, enough to cover B rows and out columns; see the chapter's section "The kernel as a torch operator"; about 4 lines; the fourth launch parameter is the stream.
    return cudaErrorNotYetImplemented;  //~
    // TODO(lab3/06) end
}

// ---- the binding: given ---------------------------------------------------------------------------

namespace {

void check_operand(const at::Tensor& t, const at::Tensor& x, const char* name, int64_t dims) {
    TORCH_CHECK(t.is_cuda() && t.device() == x.device(), "lab3ext::linear: ", name,
                " must be on x's CUDA device, got ", t.device(), " and ", x.device());
    TORCH_CHECK(t.scalar_type() == x.scalar_type(), "lab3ext::linear: ", name, " must have x's dtype ",
                x.scalar_type(), ", got ", t.scalar_type());
    TORCH_CHECK(t.dim() == dims, "lab3ext::linear: ", name, " must have ", dims, " dimensions, got shape ",
                t.sizes());
}

template <typename T>
cudaError_t launch_on(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, at::Tensor& y,
                      cudaStream_t stream) {
    return linear_launch<T>(x.const_data_ptr<T>(), w.const_data_ptr<T>(), b.const_data_ptr<T>(),
                            y.mutable_data_ptr<T>(), static_cast<int>(x.size(0)), static_cast<int>(x.size(1)),
                            static_cast<int>(w.size(0)), stream);
}

// x (B, in), w (out, in), b (out,) -> y (B, out)
at::Tensor linear_cuda(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
    check_operand(x, x, "x", 2);
    check_operand(w, x, "w", 2);
    check_operand(b, x, "b", 1);
    const int64_t B = x.size(0), in = x.size(1), out = w.size(0);
    // torch.nn.Linear's layout: w (out, in); a weight given as (in, out) is refused here
    TORCH_CHECK(w.size(1) == in, "lab3ext::linear: w must be (out, ", in, ") in torch's (out, in) layout, got ",
                w.sizes());
    TORCH_CHECK(b.size(0) == out, "lab3ext::linear: b must have ", out, " elements, got ", b.sizes());
    TORCH_CHECK(B <= int64_t{65535} * TILE && in < (int64_t{1} << 31) && out < (int64_t{1} << 31),
                "lab3ext::linear: shape (", B, ", ", in, ") -> ", out, " is past the kernel's grid");
    const c10::cuda::CUDAGuard guard(x.device());
    // the kernel reads rows: transposed views (the backward passes wᵀ and xᵀ) are copied here
    const at::Tensor xc = x.contiguous(), wc = w.contiguous(), bc = b.contiguous();
    at::Tensor y = at::empty({B, out}, xc.options());
    if (y.numel() == 0) return y;  // a grid of zero blocks is an invalid launch
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
    cudaError_t err = cudaSuccess;
    switch (x.scalar_type()) {
        case at::kFloat: err = launch_on<float>(xc, wc, bc, y, stream); break;
        case at::kDouble: err = launch_on<double>(xc, wc, bc, y, stream); break;
        default: TORCH_CHECK(false, "lab3ext::linear: float32 or float64 tensors only, got ", x.scalar_type());
    }
    // "CUDA error" is what the grader reads as a crash of yours
    TORCH_CHECK(err == cudaSuccess, "CUDA error: ", cudaGetErrorName(err), " (", cudaGetErrorString(err),
                ") launching lab3ext::linear",
                err == cudaErrorNotYetImplemented ? ": the skeleton's stub `return` is still in place" : "");
    return y;
}

}  // namespace

// The schema: no `(a!)` annotation, so the op promises to write none of its inputs (opcheck holds
// it to that), and one new tensor out.
TORCH_LIBRARY(lab3ext, m) { m.def("linear(Tensor x, Tensor w, Tensor b) -> Tensor"); }

TORCH_LIBRARY_IMPL(lab3ext, CUDA, m) { m.impl("linear", &linear_cuda); }

// Lab 3 · Task 04 — cuDNN's graph API through the cuDNN frontend: a fused linear + bias + ReLU graph
//                    with explicit strides, and the CNN's convolution, each built once and cached
//                    (your own convolution, to compare with, is 04_cudnn.cu)
//
// Implement: the cuDNN handle (one per process, made on the first call); linear_relu_cudnn, one cuDNN
//            graph matmul -> add bias -> ReLU whose weight operand is wᵀ described by strides over
//            w's own (out, in) memory (no copy, no transpose kernel), built once per shape and
//            cached; conv2d_bias_relu_cudnn, the convolution + bias + ReLU of a CNN layer as a
//            conv_fprop graph, cached the same way.
// Contract:  every pointer is DEVICE memory holding float32, row-major and contiguous as torch
//            stores it; inputs are read-only and no output overlaps an input.
//            linear_relu_cudnn:       x (B, in), w (out, in) (torch Linear's layout), b (out,) ->
//                                     y (B, out) = max(x · wᵀ + b, 0); B, in, out >= 1.
//            conv2d_bias_relu_cudnn:  x (N, C, H, W), w (K, C, R, S), b (K,) ->
//                                     y (N, K, P, Q) = max(conv2d(x, w, padding=pad) + b, 0), stride 1,
//                                     dilation 1, cross-correlation as torch's conv2d, zeros outside
//                                     x, P = H + 2·pad - R + 1 >= 1, Q = W + 2·pad - S + 1 >= 1;
//                                     N, C, H, W, K, R, S >= 1, pad >= 0, every array < 2^31 elements.
//            Both may compute the products in TF32 (what a plan picks; torch lets cuDNN do the same
//            by default) and accumulate in float32. Everything runs on the legacy default stream
//            and returns a CUDA error (a failed cuDNN call reads as cudaErrorUnknown, its message
//            on stderr); nothing synchronizes except a call that builds a graph or grows the
//            workspace.
// Why a .cpp: cuDNN is called from host code alone, so this file has no kernel and is compiled by
//            the host compiler alone; in a .cu, nvcc's device front end would parse the frontend's
//            headers too (over a third of the file's compile time).
// Test:      make test-lab3 TASK=04

#include "course.h"

#include <cudnn.h>

#include <cstring>  // the frontend uses std::strlen without including it when its JSON support is off
// The frontend's JSON (de)serialization (nlohmann::json) is not used here and takes minutes to
// compile: leave it out.
#define CUDNN_FRONTEND_SKIP_JSON_LIB
#include <cudnn_frontend.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <map>
#include <memory>
#include <unordered_map>
#include <utility>
#include <tuple>

namespace fe = cudnn_frontend;

// The CUDA_CHECK of the cuDNN C API: names the call, returns cudaErrorUnknown from the enclosing
// function (cuDNN statuses are not CUDA errors), the status's name on stderr.
#define CUDNN_CHECK(call)                                                                          \
    do {                                                                                           \
        cudnnStatus_t course_status_ = (call);                                                     \
        if (course_status_ != CUDNN_STATUS_SUCCESS) {                                              \
            fprintf(stderr, "%s:%d: cuDNN error %s in `%s`\n", __FILE__, __LINE__,                  \
                    cudnnGetErrorString(course_status_), #call);                                   \
            return cudaErrorUnknown;                                                               \
        }                                                                                          \
    } while (0)

// The same for the frontend, whose calls return an error_t carrying a message rather than throwing.
#define FE_CHECK(call)                                                                             \
    do {                                                                                           \
        auto course_fe_ = (call);                                                                  \
        if (!course_fe_.is_good()) {                                                               \
            fprintf(stderr, "%s:%d: cuDNN frontend error in `%s`: %s\n", __FILE__, __LINE__, #call, \
                    course_fe_.get_message().c_str());                                             \
            return cudaErrorUnknown;                                                               \
        }                                                                                          \
    } while (0)

using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

// ---- the handle and the workspace: made once, reused by every call ------------------------------

// A cuDNN handle holds the library's context on one device; making one costs milliseconds, so it
// lives as long as the process. The workspace is the scratch memory the chosen plans ask for: one
// buffer, grown to the largest request, shared by every cached graph (they run one at a time on
// one stream).
struct Dnn {
    cudnnHandle_t handle = nullptr;
    void* workspace = nullptr;
    int64_t workspace_bytes = 0;
};

static Dnn g_dnn;

static cudaError_t dnn(Dnn** out) {
    // TODO(lab3/04) begin: create the cuDNN handle on the first call only and put it on the legacy default stream (0), the one the grader and torch wait on; see the chapter's section "Handles, graphs and plans"; about 5 lines; what does cudnnCreate cost at B = 1, per call?
    if (g_dnn.handle == nullptr) {
        CUDNN_CHECK(cudnnCreate(&g_dnn.handle));
        CUDNN_CHECK(cudnnSetStream(g_dnn.handle, 0));
    }
    *out = &g_dnn;
    return cudaSuccess;
    //~ *out = &g_dnn;
    //~ return cudaErrorNotYetImplemented;
    // TODO(lab3/04) end
}

// The workspace grows to `bytes` if it is smaller; cudaFree waits for the work that may still use
// the old buffer, so growing is safe (and rare: once per new largest plan).
static cudaError_t reserve_workspace(Dnn* d, int64_t bytes) {
    if (bytes <= d->workspace_bytes) return cudaSuccess;
    CUDA_CHECK(cudaFree(d->workspace));
    d->workspace = nullptr;
    d->workspace_bytes = 0;
    CUDA_CHECK(cudaMalloc(&d->workspace, (size_t)bytes));
    d->workspace_bytes = bytes;
    return cudaSuccess;
}

// ---- from a described graph to an executable plan ----------------------------------------------

// The five steps every graph goes through once: check it, lower it to cuDNN's backend descriptors,
// ask the heuristics for engine configurations, keep those this card and cuDNN support, and compile
// the plan (for runtime-fusion engines, this is where a kernel is generated: milliseconds).
static cudaError_t build_plan(fe::graph::Graph& graph, Dnn* d, int64_t* workspace_bytes) {
    // TODO(lab3/04) begin: validate the graph, build the operation graph on the handle, create execution plans from heuristics mode A (with FALLBACK after it, for graphs mode A has no engine for), keep the supported ones, build the plan, and read its workspace size; see the chapter's section "Handles, graphs and plans"; about 6 lines; every call returns an error_t: check each one with FE_CHECK.
    FE_CHECK(graph.validate());
    FE_CHECK(graph.build_operation_graph(d->handle));
    FE_CHECK(graph.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}));
    FE_CHECK(graph.check_support());
    FE_CHECK(graph.build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE));
    FE_CHECK(graph.get_workspace_size(*workspace_bytes));
    return cudaSuccess;
    //~ (void)graph;
    //~ (void)d;
    //~ (void)workspace_bytes;
    //~ return cudaErrorNotYetImplemented;
    // TODO(lab3/04) end
}

// ---- linear + bias + ReLU as one graph ---------------------------------------------------------

// One built graph and the tensors its variant pack names.
struct LinearGraph {
    fe::graph::Graph graph;
    TensorPtr x, w, b, y;
    int64_t workspace_bytes = 0;
};

// Building costs milliseconds and a call at B = 1 costs microseconds: one graph per shape, kept.
static std::map<std::tuple<int, int, int>, std::unique_ptr<LinearGraph>> g_linear;

// Describes y = relu(x · wᵀ + b) for one shape. cuDNN's matmul engines take rank-3 tensors
// [batch, M, K] x [batch, K, N] -> [batch, M, N]: the layer is batch 1, M = B, K = in, N = out.
static cudaError_t describe_linear(LinearGraph* lg, int B, int in, int out) {
    const int64_t b = B, k = in, n = out;
    fe::graph::Graph& g = lg->graph;
    // float32 in memory and between the nodes; the matmul accumulates in float32
    g.set_io_data_type(fe::DataType_t::FLOAT)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);

    // TODO(lab3/04) begin: the graph's four tensors and three nodes: x [1, B, in] row-major; wᵀ [1, in, out] described by the strides that read it from w's (out, in) memory, element (k, j) at j·in + k; b [1, 1, out], broadcast over the rows; matmul, pointwise ADD of b, pointwise RELU_FWD, and y [1, B, out] row-major marked as the graph's output; see the chapter's section "Tensors are dims and strides"; about 25 lines; which stride walks k, the reduction dimension, in w's memory?
    lg->x = g.tensor(fe::graph::Tensor_attributes()
                         .set_name("x")
                         .set_dim({1, b, k})
                         .set_stride({b * k, k, 1})
                         .set_data_type(fe::DataType_t::FLOAT));
    // wᵀ (in, out) is w (out, in) read down its columns: one step along k is one element, one step
    // along j is a whole row of w (in elements). The strides say so; no byte of w moves.
    lg->w = g.tensor(fe::graph::Tensor_attributes()
                         .set_name("w_transposed")
                         .set_dim({1, k, n})
                         .set_stride({k * n, 1, k})
                         .set_data_type(fe::DataType_t::FLOAT));
    // one bias per output column, the same for every row: dimension 1 along B broadcasts
    lg->b = g.tensor(fe::graph::Tensor_attributes()
                         .set_name("b")
                         .set_dim({1, 1, n})
                         .set_stride({n, n, 1})
                         .set_data_type(fe::DataType_t::FLOAT));

    // x [1, B, in] @ wᵀ [1, in, out] -> [1, B, out], a virtual tensor (never written to memory)
    auto product = g.matmul(lg->x, lg->w,
                            fe::graph::Matmul_attributes().set_name("x_wT").set_compute_data_type(
                                fe::DataType_t::FLOAT));
    auto biased = g.pointwise(product, lg->b,
                              fe::graph::Pointwise_attributes()
                                  .set_name("add_bias")
                                  .set_mode(fe::PointwiseMode_t::ADD)
                                  .set_compute_data_type(fe::DataType_t::FLOAT));
    lg->y = g.pointwise(biased, fe::graph::Pointwise_attributes()
                                    .set_name("relu")
                                    .set_mode(fe::PointwiseMode_t::RELU_FWD)
                                    .set_compute_data_type(fe::DataType_t::FLOAT));
    // the graph's only output: y [1, B, out], row-major, as torch reads it back
    lg->y->set_output(true).set_dim({1, b, n}).set_stride({b * n, n, 1}).set_data_type(fe::DataType_t::FLOAT);
    return cudaSuccess;
    //~ (void)g;
    //~ (void)b;
    //~ (void)k;
    //~ (void)n;
    //~ return cudaErrorNotYetImplemented;
    // TODO(lab3/04) end
}

// The cached graph for (B, in, out), described and built on its first use.
static cudaError_t linear_graph(Dnn* d, int B, int in, int out, LinearGraph** out_graph) {
    const auto key = std::make_tuple(B, in, out);
    // TODO(lab3/04) begin: look the shape up in g_linear; on a miss describe a new graph, build its plan, grow the workspace to its size, and keep it in the map (only once it is built: a failed build must not be cached); see the chapter's section "Plan caching"; about 12 lines; time a call at B = 1 with and without the cache.
    auto found = g_linear.find(key);
    if (found == g_linear.end()) {
        auto lg = std::make_unique<LinearGraph>();
        CUDA_CHECK(describe_linear(lg.get(), B, in, out));
        CUDA_CHECK(build_plan(lg->graph, d, &lg->workspace_bytes));
        CUDA_CHECK(reserve_workspace(d, lg->workspace_bytes));
        found = g_linear.emplace(key, std::move(lg)).first;
    }
    *out_graph = found->second.get();
    return cudaSuccess;
    //~ (void)d;
    //~ (void)key;
    //~ *out_graph = nullptr;
    //~ return cudaErrorNotYetImplemented;
    // TODO(lab3/04) end
}

// relu(x (B, in) @ wᵀ (in, out) + b) -> y (B, out), row-major, as one cuDNN graph.
static cudaError_t linear_relu(const float* x, const float* w, const float* b, float* y, int B, int in, int out) {
    Dnn* d = nullptr;
    CUDA_CHECK(dnn(&d));
    LinearGraph* lg = nullptr;
    CUDA_CHECK(linear_graph(d, B, in, out, &lg));
    // the variant pack: which device pointer each non-virtual tensor of the graph lives at
    std::unordered_map<TensorPtr, void*> pack = {
        {lg->x, const_cast<float*>(x)}, {lg->w, const_cast<float*>(w)}, {lg->b, const_cast<float*>(b)}, {lg->y, y}};
    FE_CHECK(lg->graph.execute(d->handle, pack, d->workspace));
    return cudaSuccess;
}

COURSE_API cudaError_t linear_relu_cudnn(const float* x, const float* w, const float* b, float* y, int B, int in,
                                         int out) {
    // a C entry point must not let a C++ exception (std::bad_alloc in the frontend) reach ctypes
    try {
        return linear_relu(x, w, b, y, B, in, out);
    } catch (const std::exception& e) {
        fprintf(stderr, "linear_relu_cudnn: %s\n", e.what());
        return cudaErrorUnknown;
    }
}

// ---- convolution + bias + ReLU as one graph ----------------------------------------------------

struct ConvGraph {
    fe::graph::Graph graph;
    TensorPtr x, w, b, y;
    int64_t workspace_bytes = 0;
};

using ConvKey = std::tuple<int, int, int, int, int, int, int, int>;  // N, C, H, W, K, R, S, pad
static std::map<ConvKey, std::unique_ptr<ConvGraph>> g_conv;

// Describes y = relu(conv2d(x, w, padding = pad) + b), NCHW, for one shape.
static cudaError_t describe_conv(ConvGraph* cg, int N, int C, int H, int W, int K, int R, int S, int pad) {
    const int64_t n = N, c = C, h = H, wd = W, k = K, r = R, s = S;
    const int64_t p = H + 2 * pad - R + 1, q = W + 2 * pad - S + 1;
    fe::graph::Graph& g = cg->graph;
    g.set_io_data_type(fe::DataType_t::FLOAT)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);

    // TODO(lab3/04) begin: x [N, C, H, W], w [K, C, R, S] and b [1, K, 1, 1] with torch's contiguous NCHW strides; conv_fprop with padding pad, stride 1 and dilation 1; pointwise ADD of b and RELU_FWD; y [N, K, P, Q] NCHW as the output; see the chapter's section "The convolution as a graph"; about 25 lines; the bias is one value per output channel: which dimensions of b are 1?
    cg->x = g.tensor(fe::graph::Tensor_attributes()
                         .set_name("x")
                         .set_dim({n, c, h, wd})
                         .set_stride({c * h * wd, h * wd, wd, 1})
                         .set_data_type(fe::DataType_t::FLOAT));
    cg->w = g.tensor(fe::graph::Tensor_attributes()
                         .set_name("w")
                         .set_dim({k, c, r, s})
                         .set_stride({c * r * s, r * s, s, 1})
                         .set_data_type(fe::DataType_t::FLOAT));
    cg->b = g.tensor(fe::graph::Tensor_attributes()
                         .set_name("b")
                         .set_dim({1, k, 1, 1})
                         .set_stride({k, 1, 1, 1})
                         .set_data_type(fe::DataType_t::FLOAT));
    auto conv = g.conv_fprop(cg->x, cg->w,
                             fe::graph::Conv_fprop_attributes()
                                 .set_name("conv")
                                 .set_padding({pad, pad})
                                 .set_stride({1, 1})
                                 .set_dilation({1, 1})
                                 .set_compute_data_type(fe::DataType_t::FLOAT));
    auto biased = g.pointwise(conv, cg->b,
                              fe::graph::Pointwise_attributes()
                                  .set_name("add_bias")
                                  .set_mode(fe::PointwiseMode_t::ADD)
                                  .set_compute_data_type(fe::DataType_t::FLOAT));
    cg->y = g.pointwise(biased, fe::graph::Pointwise_attributes()
                                    .set_name("relu")
                                    .set_mode(fe::PointwiseMode_t::RELU_FWD)
                                    .set_compute_data_type(fe::DataType_t::FLOAT));
    cg->y->set_output(true)
        .set_dim({n, k, p, q})
        .set_stride({k * p * q, p * q, q, 1})
        .set_data_type(fe::DataType_t::FLOAT);
    return cudaSuccess;
    //~ (void)g;
    //~ (void)n, (void)c, (void)h, (void)wd, (void)k, (void)r, (void)s, (void)p, (void)q;
    //~ return cudaErrorNotYetImplemented;
    // TODO(lab3/04) end
}

static cudaError_t conv_relu(const float* x, const float* w, const float* b, float* y, int N, int C, int H, int W,
                             int K, int R, int S, int pad) {
    Dnn* d = nullptr;
    CUDA_CHECK(dnn(&d));
    // the same cache as linear's, keyed by everything that shapes the graph
    const ConvKey key{N, C, H, W, K, R, S, pad};
    auto found = g_conv.find(key);
    if (found == g_conv.end()) {
        auto cg = std::make_unique<ConvGraph>();
        CUDA_CHECK(describe_conv(cg.get(), N, C, H, W, K, R, S, pad));
        CUDA_CHECK(build_plan(cg->graph, d, &cg->workspace_bytes));
        CUDA_CHECK(reserve_workspace(d, cg->workspace_bytes));
        found = g_conv.emplace(key, std::move(cg)).first;
    }
    ConvGraph* cg = found->second.get();
    std::unordered_map<TensorPtr, void*> pack = {
        {cg->x, const_cast<float*>(x)}, {cg->w, const_cast<float*>(w)}, {cg->b, const_cast<float*>(b)}, {cg->y, y}};
    FE_CHECK(cg->graph.execute(d->handle, pack, d->workspace));
    return cudaSuccess;
}

COURSE_API cudaError_t conv2d_bias_relu_cudnn(const float* x, const float* w, const float* b, float* y, int N, int C,
                                              int H, int W, int K, int R, int S, int pad) {
    try {
        return conv_relu(x, w, b, y, N, C, H, W, K, R, S, pad);
    } catch (const std::exception& e) {
        fprintf(stderr, "conv2d_bias_relu_cudnn: %s\n", e.what());
        return cudaErrorUnknown;
    }
}

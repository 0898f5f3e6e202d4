// Lab 2 · Task 05 — an explicit CUDA graph: a reduction tree of small kernels, launched at once
//
// Implement: reduce_graph, which sums n floats with the same tree of small kernels as
//            reduce_launches (given), but as a CUDA graph built with the graph API
//            (cudaGraphCreate, cudaGraphAddKernelNode with cudaKernelNodeParams, one edge from
//            every node to each node it waits for), instantiated once and launched with a single
//            cudaGraphLaunch per call. The graph is kept from call to call and rebuilt only when n
//            changes. The caller's pointers change from call to call; they reach the tree's
//            kernels through the graph's first node (bind_kernel), whose parameters you set in the
//            instantiated graph before each launch. reduce_launches, given, launches the same
//            kernels one by one on the default stream: it is the baseline the graph is timed
//            against.
// Contract:  in is a DEVICE float32 array of n elements (read-only), out a DEVICE float32 array of
//            at least one element: once the work queued on the default stream is done, out[0] is
//            the sum of in[0..n), added in float32 along the tree described below.
//            1 <= n <= 2^26; any other n returns cudaErrorInvalidValue. The tree: level 0 has one
//            node per CHUNK floats of in (the last one may hold fewer), each summing its chunk into
//            one partial sum; every next level has one node per FANIN partial sums of the level
//            below; the last level is a single node, the root, which writes out[0]. Every node is
//            one block of THREADS threads. Both entry points use the default (legacy) stream,
//            return the first error met and do not synchronize, except when they must allocate
//            or free their buffers (the first call; for reduce_graph, each change of n).
// Test:      make test-lab2 TASK=05

#include "course.h"
#include "course_scratch.h"

#include <cstddef>
#include <cstdint>
#include <vector>

constexpr int THREADS = 512;           // one block per node
constexpr int WARP = 32;
constexpr size_t CHUNK = 16384;        // input floats per level-0 node: 64 KiB, a few µs for one block
constexpr size_t FANIN = 16;           // partial sums per node above level 0
constexpr size_t MAX_N = size_t(1) << 26;
constexpr int MAX_LEVELS = 8;          // 2^26 floats make 4096, 256, 16 and 1 nodes: 4 levels

// ---------------------------------------------------------------------------------------------
// The kernels (given): one block sums a short array.
// ---------------------------------------------------------------------------------------------

// The sum of src[0..count), computed by the whole block and returned in thread 0. float4 loads
// where src is 16-byte aligned (every level-0 chunk of an aligned input), scalar ones otherwise.
__device__ float block_sum(const float* __restrict__ src, size_t count) {
    __shared__ float warp_sums[THREADS / WARP];
    const unsigned t = threadIdx.x, lane = t % WARP, warp = t / WARP;
    float v = 0.0f;
    if (((uintptr_t)src & 15) == 0) {
        const float4* q = reinterpret_cast<const float4*>(src);
        const size_t vecs = count / 4;
#pragma unroll 4
        for (size_t i = t; i < vecs; i += THREADS) {
            const float4 f = q[i];
            v += (f.x + f.y) + (f.z + f.w);
        }
        for (size_t i = 4 * vecs + t; i < count; i += THREADS) v += src[i];
    } else {
        for (size_t i = t; i < count; i += THREADS) v += src[i];
    }
#pragma unroll
    for (int offset = WARP / 2; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
    if (lane == 0) warp_sums[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < THREADS / WARP ? warp_sums[lane] : 0.0f;
#pragma unroll
        for (int offset = WARP / 2; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
    }
    return v;
}

// *dst = sum of src[0..count): one node of the tree as an ordinary launch (reduce_launches).
__global__ void __launch_bounds__(THREADS) sum_kernel(const float* __restrict__ src, size_t count,
                                                      float* __restrict__ dst) {
    const float s = block_sum(src, count);
    if (threadIdx.x == 0) *dst = s;
}

// Where the caller's arrays are for the graph's current launch. A kernel node keeps the argument
// values it was given, but in and out change from call to call: the graph's first node writes
// them here, and the tree's nodes read them from here.
struct Binding {
    const float* in;
    float* out;
};

// The graph's first node: one thread publishes this launch's pointers.
__global__ void bind_kernel(Binding* binding, const float* in, float* out) {
    binding->in = in;
    binding->out = out;
}

// One node of the graph: the sum of count values starting at src[first], where src == nullptr
// stands for the caller's in; the sum goes to *dst, where dst == nullptr stands for the caller's
// out[0] (the root).
__global__ void __launch_bounds__(THREADS) node_kernel(const Binding* binding, const float* src, size_t first,
                                                       size_t count, float* dst) {
    const float s = block_sum((src != nullptr ? src : binding->in) + first, count);
    if (threadIdx.x == 0) *(dst != nullptr ? dst : binding->out) = s;
}

// ---------------------------------------------------------------------------------------------
// The tree's shape (given), shared by both entry points.
// ---------------------------------------------------------------------------------------------

struct Tree {
    int levels;                  // level 0 sums the input; level levels - 1 is the root alone
    size_t nodes[MAX_LEVELS];    // nodes per level
    size_t offset[MAX_LEVELS];   // where a level's partial sums start in the partials buffer
    size_t total;                // nodes of all levels: the partials buffer's size in floats
};

static Tree tree_for(size_t n) {
    Tree t{};
    size_t below = n, width = CHUNK;  // what the next level sums, and how many values per node
    for (;;) {
        const size_t nodes = (below + width - 1) / width;
        t.offset[t.levels] = t.total;
        t.nodes[t.levels++] = nodes;
        t.total += nodes;
        if (nodes == 1) return t;
        below = nodes;
        width = FANIN;
    }
}

// Node j of level k sums node_count values starting at node_first of the level below: the
// input for level 0, level k - 1's partial sums (equally, its nodes j * FANIN onwards) above.
static size_t node_first(int k, size_t j) { return j * (k == 0 ? CHUNK : FANIN); }

static size_t node_count(const Tree& t, size_t n, int k, size_t j) {
    const size_t below = k == 0 ? n : t.nodes[k - 1], width = k == 0 ? CHUNK : FANIN;
    const size_t first = j * width;
    return below - first < width ? below - first : width;
}

// ---------------------------------------------------------------------------------------------
// Given: the baseline, one launch per node.
// ---------------------------------------------------------------------------------------------

// The tree level by level, node by node: t.total launches, each a single block of a few µs. The
// partial sums live in the scratch buffer of course_scratch.h, kept and grown.
COURSE_API cudaError_t reduce_launches(const float* in, float* out, int n) {
    if (n < 1 || (size_t)n > MAX_N) return cudaErrorInvalidValue;
    const Tree t = tree_for((size_t)n);
    float* partials = nullptr;
    CUDA_CHECK(scratch(t.total, &partials));
    for (int k = 0; k < t.levels; ++k) {
        const float* below = k == 0 ? in : partials + t.offset[k - 1];
        for (size_t j = 0; j < t.nodes[k]; ++j) {
            float* dst = k == t.levels - 1 ? out : partials + t.offset[k] + j;
            sum_kernel<<<1, THREADS>>>(below + node_first(k, j), node_count(t, (size_t)n, k, j), dst);
            CUDA_CHECK(cudaGetLastError());
        }
    }
    return cudaSuccess;
}

// ---------------------------------------------------------------------------------------------
// The task: the same tree as a graph, built once per n.
// ---------------------------------------------------------------------------------------------

// What reduce_graph keeps from call to call. n == 0: nothing is built.
struct Graph {
    size_t n = 0;                      // the n the graph sums
    cudaGraph_t graph = nullptr;       // the graph as built, node by node
    cudaGraphExec_t exec = nullptr;    // the graph instantiated: what cudaGraphLaunch runs
    cudaGraphNode_t bind = nullptr;    // the first node (bind_kernel), its handle in `graph`
    Binding* binding = nullptr;        // device: where bind_kernel leaves in and out
    float* partials = nullptr;         // device: the partial sums of every level (Tree::total)
};

// Frees what g holds and forgets it. A launch of the old graph may still be running and reading
// binding and partials, so the device is synchronized first (cudaGraphExecDestroy alone would
// wait for the launch to end, cudaFree is not guaranteed to). ([[maybe_unused]] here and on
// build: only code inside the TODO regions calls them.)
[[maybe_unused]] static cudaError_t release(Graph* g) {
    if (g->graph == nullptr && g->exec == nullptr && g->binding == nullptr && g->partials == nullptr) {
        *g = Graph{};
        return cudaSuccess;
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    const Graph old = *g;
    *g = Graph{};  // forgotten first: a failure below must leave nothing to free twice
    if (old.exec != nullptr) CUDA_CHECK(cudaGraphExecDestroy(old.exec));
    if (old.graph != nullptr) CUDA_CHECK(cudaGraphDestroy(old.graph));
    CUDA_CHECK(cudaFree(old.binding));
    CUDA_CHECK(cudaFree(old.partials));
    return cudaSuccess;
}

// Builds into g (empty on entry) the graph that sums n floats, and instantiates it.
[[maybe_unused]] static cudaError_t build(Graph* g, size_t n) {
    // TODO(lab2/05) begin: the buffers (binding, partials) and the graph: a bind_kernel node first (its in and out are set before each launch, so any value does here), then the tree of tree_for(n), level by level, one node_kernel node (1 block of THREADS threads) per tree node, where a level-0 node depends on the bind node and a node above on exactly the nodes of the level below whose partial sums it adds (node_first and node_count give them), and the root writes out; instantiate it and set g->n last; see the chapter's section "CUDA graphs by hand" (the tree as a graph); about 35 lines; try n = 1 (the bind node and the root alone), 16385 and 2^20 + 3.
    const Tree t = tree_for(n);
    CUDA_CHECK(cudaMalloc(&g->binding, sizeof(Binding)));
    CUDA_CHECK(cudaMalloc(&g->partials, t.total * sizeof(float)));
    CUDA_CHECK(cudaGraphCreate(&g->graph, 0));

    // The first node. A node copies its arguments' values when it is added: kernelParams points
    // to each argument, and these locals need only outlive the call.
    const float* no_in = nullptr;
    float* no_out = nullptr;
    void* bind_args[] = {&g->binding, &no_in, &no_out};
    cudaKernelNodeParams bind = {};
    bind.func = (void*)bind_kernel;
    bind.gridDim = dim3(1);
    bind.blockDim = dim3(1);
    bind.kernelParams = bind_args;
    CUDA_CHECK(cudaGraphAddKernelNode(&g->bind, g->graph, nullptr, 0, &bind));

    // below: the nodes of the level under the one being added (for level 0: the bind node)
    std::vector<cudaGraphNode_t> below(1, g->bind), level;
    for (int k = 0; k < t.levels; ++k) {
        level.assign(t.nodes[k], nullptr);
        const float* src = k == 0 ? nullptr : g->partials + t.offset[k - 1];
        for (size_t j = 0; j < t.nodes[k]; ++j) {
            size_t first = node_first(k, j), count = node_count(t, n, k, j);
            float* dst = k == t.levels - 1 ? nullptr : g->partials + t.offset[k] + j;
            void* args[] = {&g->binding, &src, &first, &count, &dst};
            cudaKernelNodeParams p = {};
            p.func = (void*)node_kernel;
            p.gridDim = dim3(1);
            p.blockDim = dim3(THREADS);
            p.kernelParams = args;
            // a level-0 node waits for the bind node; node j above for the `count` nodes below
            // from `first` on, exactly those whose partial sums it reads
            const cudaGraphNode_t* deps = k == 0 ? below.data() : below.data() + first;
            const size_t ndeps = k == 0 ? 1 : count;
            CUDA_CHECK(cudaGraphAddKernelNode(&level[j], g->graph, deps, ndeps, &p));
        }
        below.swap(level);
    }
    CUDA_CHECK(cudaGraphInstantiate(&g->exec, g->graph, 0));
    g->n = n;
    return cudaSuccess;
    //~ return cudaErrorNotYetImplemented;
    // TODO(lab2/05) end
}

COURSE_API cudaError_t reduce_graph(const float* in, float* out, int n) {
    if (n < 1 || (size_t)n > MAX_N) return cudaErrorInvalidValue;
    // TODO(lab2/05) begin: keep one Graph from call to call; when it was built for another n (or for none), release it and build the graph for this n (a failed build released again, so the next call starts clean); then point the instantiated graph's bind node at this call's in and out (cudaGraphExecKernelNodeSetParams: the nodes of the built graph keep their old values) and launch the graph on the default stream, without synchronizing; see the chapter's section "CUDA graphs by hand" (changing an instantiated graph); about 15 lines; try two calls with different n, and two with the same n but different arrays.
    static Graph g;
    if (g.n != (size_t)n) {
        CUDA_CHECK(release(&g));
        const cudaError_t err = build(&g, (size_t)n);
        if (err != cudaSuccess) {
            (void)release(&g);
            return err;
        }
    }
    // Changes only the instantiated graph, and only its future launches: one still queued keeps
    // the pointers it was launched with.
    void* args[] = {&g.binding, &in, &out};
    cudaKernelNodeParams bind = {};
    bind.func = (void*)bind_kernel;
    bind.gridDim = dim3(1);
    bind.blockDim = dim3(1);
    bind.kernelParams = args;
    CUDA_CHECK(cudaGraphExecKernelNodeSetParams(g.exec, g.bind, &bind));
    CUDA_CHECK(cudaGraphLaunch(g.exec, 0));
    return cudaSuccess;
    //~ return cudaErrorNotYetImplemented;
    // TODO(lab2/05) end
}

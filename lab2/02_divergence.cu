// Lab 2 · Task 02 — warp divergence: a piecewise function without branches
//
// Implement: piecewise_uniform_kernel, which computes y = f(x) elementwise for the piecewise
//            polynomial f defined below with ONE code path for every lane (no if, else, switch
//            or ?: in it, nor in anything you write next to it), and its launch in
//            piecewise_uniform. piecewise_branchy, given, computes the same f with an
//            if / else if chain, one polynomial per piece: it is the baseline your kernel is
//            timed against.
// Contract:  x and y are DEVICE float32 vectors of n elements; x is read-only, y is written and
//            overlaps nothing. 1 <= n, n a size_t (past 2^31 too). y[i] = f(x[i]) for x[i] in
//            [-2, 2] (outside it the outer pieces extrapolate their polynomials, which reach ±inf
//            once |x| passes about 4.3). Returns the launch error; does not synchronize.
// Test:      make test-lab2 TASK=02

#include "course.h"

#include <cstddef>

constexpr int THREADS = 256;

// ---- the function f ----------------------------------------------------------------------------
//
// Four pieces, split at x = -1, 0 and 1; a boundary belongs to the piece on its left:
//   piece 0: x <= -1     piece 1: -1 < x <= 0     piece 2: 0 < x <= 1     piece 3: 1 < x
// Piece p maps its interval onto t in [-1, 1] with t = a x + b and returns s P(t) + o, where P is
// one polynomial of degree 56 that every piece shares:
//   P(t) = sum_{j=0..56} c_j t^j,   c_j = (-1)^j / (j + 1)^2   (c_j rounded to float32)
// f jumps at each boundary (by 0.25 to 0.69), so the side a boundary value lands on matters.

constexpr int PIECES = 4;
constexpr int DEGREE = 56;  // 56 fmaf per evaluation of P: enough to make the branchy kernel compute-bound

struct Piece {
    float a, b;  // t = a x + b
    float s, o;  // f = s P(t) + o
};

// The lower boundary of piece k (1 <= k < PIECES): -1, 0, 1.
__host__ __device__ constexpr float bound(int k) { return (float)(k - 2); }

// The parameters of piece p, all exact in float32.
__host__ __device__ constexpr Piece piece(int p) {
    return p == 0   ? Piece{2.0f, 3.0f, 1.5f, -2.0f}     // [-2, -1] -> t in [-1, 1]
           : p == 1 ? Piece{2.0f, 1.0f, -1.0f, 1.25f}    // (-1, 0]  -> t in (-1, 1]
           : p == 2 ? Piece{-2.0f, 1.0f, 0.75f, 0.5f}    // (0, 1]   -> t in [-1, 1)
                    : Piece{-2.0f, 3.0f, -1.25f, 2.5f};  // (1, 2]   -> t in [-1, 1)
}
static_assert(PIECES == 4, "piece() and piecewise_branchy_kernel spell out four pieces");

// c_j, the coefficient of t^j in P
__host__ __device__ constexpr float coef(int j) {
    return (j % 2 ? -1.0f : 1.0f) / (float)((j + 1) * (j + 1));
}

// How many THREADS-thread blocks of `kernel` the whole GPU holds at once, as in task 01.
static cudaError_t resident_blocks(const void* kernel, int* blocks) {
    int device = 0, sms = 0, per_sm = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, THREADS, 0));
    *blocks = sms * (per_sm > 0 ? per_sm : 1);
    return cudaSuccess;
}

using ElementwiseKernel = void (*)(const float*, float*, size_t);

// Launches a grid-stride kernel on one wave of blocks (fewer when n is small): both kernels of
// this file get the same grid, so their times differ only by what each warp executes.
static cudaError_t launch_grid_stride(ElementwiseKernel kernel, const float* x, float* y, size_t n) {
    int blocks = 0;
    CUDA_CHECK(resident_blocks((const void*)kernel, &blocks));
    const size_t needed = (n + THREADS - 1) / THREADS;
    if (needed < (size_t)blocks) blocks = (int)needed;
    kernel<<<blocks, THREADS>>>(x, y, n);
    return cudaGetLastError();
}

// ---- given: the branchy baseline ---------------------------------------------------------------

// Piece p as its own polynomial in t: s P(t) + o, with s and o folded into the 57 coefficients at
// compile time. Each piece is thus 56 fmaf on constants of its own, the way piecewise
// approximations are usually written. (Branches that differ only in a few constants, such as
// s * P(t) + o with one shared P, nvcc merges by itself: see the chapter.)
template <int p>
__device__ __forceinline__ float piece_poly(float t) {
    constexpr Piece q = piece(p);
    float acc = q.s * coef(DEGREE);
#pragma unroll
    for (int j = DEGREE - 1; j >= 1; --j) acc = fmaf(acc, t, q.s * coef(j));
    return fmaf(acc, t, q.s * coef(0) + q.o);
}

// x (n,) -> y (n,). Each lane takes the branch of its own piece. A warp whose 32 lanes hold
// values of all four pieces runs all four branches one after the other, each with only the lanes
// of that piece active: 4 x 56 fmaf issued for every element instead of 56.
__global__ void piecewise_branchy_kernel(const float* __restrict__ x, float* __restrict__ y, size_t n) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float v = x[i];
        float f;
        if (v <= bound(1)) f = piece_poly<0>(fmaf(piece(0).a, v, piece(0).b));
        else if (v <= bound(2)) f = piece_poly<1>(fmaf(piece(1).a, v, piece(1).b));
        else if (v <= bound(3)) f = piece_poly<2>(fmaf(piece(2).a, v, piece(2).b));
        else f = piece_poly<3>(fmaf(piece(3).a, v, piece(3).b));
        y[i] = f;
    }
}

COURSE_API cudaError_t piecewise_branchy(const float* x, float* y, size_t n) {
    return launch_grid_stride(piecewise_branchy_kernel, x, y, n);
}

// ---- the task ----------------------------------------------------------------------------------

// TODO(lab2/02) begin: a grid-stride kernel that computes every y[i] = f(x[i]) with the same instructions in every lane whatever its piece (no if, else, switch or ?: in this region: the grader checks), evaluating P only once per element; a boundary value belongs to the piece on its left; see the chapter's section on divergence; about 20 lines; work out by hand which parameters x = -1, 0 and 1 must get, and try n = 1 and 33.
// TODO(lab2/02) end

COURSE_API cudaError_t piecewise_uniform(const float* x, float* y, size_t n) {
    // TODO(lab2/02) begin: launch your kernel on the same grid as piecewise_branchy (launch_grid_stride), so that only the kernels differ; about 1 line.
    return cudaErrorNotYetImplemented;  //~
    // TODO(lab2/02) end
}

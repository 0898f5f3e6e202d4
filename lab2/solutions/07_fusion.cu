// Lab 2 · Task 07 — fusion: bias + SiLU in one pass over memory
//
// Implement: bias_silu_kernel, which reads each x once, adds its column's bias, applies SiLU
//            and writes y once, and its launch in bias_silu. bias_silu_unfused, given, does the
//            same in two kernels (add_bias, then silu_inplace re-reading what add_bias wrote):
//            it is the baseline your fused kernel is timed against.
// Contract:  x and y are DEVICE float32 matrices of shape (rows, cols), row-major and
//            contiguous; bias is a DEVICE float32 vector of cols elements. x and bias are
//            read-only, y is written and overlaps neither. rows, cols >= 1 and
//            rows * cols < 2^31. y[r][c] = silu(x[r][c] + bias[c]), silu(v) = v / (1 + exp(-v)).
//            Returns the launch error; does not synchronize.
// Test:      make test-lab2 TASK=07

#include "course.h"

#include <cstddef>

constexpr int THREADS = 256;
constexpr int MAX_GRID_Y = 65535;  // the largest gridDim.y

// SiLU in float32, as every kernel of this file computes it
__device__ __forceinline__ float silu(float v) { return v / (1.0f + expf(-v)); }

// ---- given: the unfused baseline ---------------------------------------------------------------

// x (rows, cols), bias (cols,) -> t (rows, cols): one thread per column and row, the rows
// covered by a loop when there are more than gridDim.y of them.
__global__ void add_bias_kernel(const float* __restrict__ x, const float* __restrict__ bias,
                                float* __restrict__ t, int rows, int cols) {
    const int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= cols) return;
    for (int r = blockIdx.y; r < rows; r += gridDim.y) {
        const size_t i = (size_t)r * cols + col;
        t[i] = x[i] + bias[col];
    }
}

// t (n,) -> t (n,) in place: reads back the whole intermediate add_bias_kernel just wrote
__global__ void silu_inplace_kernel(float* __restrict__ t, size_t n) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        t[i] = silu(t[i]);
}

// Two launches, and y written, read and written again: 16 bytes of traffic per element.
COURSE_API cudaError_t bias_silu_unfused(const float* x, const float* bias, float* y, int rows,
                                         int cols) {
    const dim3 grid((cols + THREADS - 1) / THREADS, rows < MAX_GRID_Y ? rows : MAX_GRID_Y);
    add_bias_kernel<<<grid, THREADS>>>(x, bias, y, rows, cols);
    CUDA_CHECK(cudaGetLastError());
    const size_t n = (size_t)rows * cols;
    const size_t blocks = (n + THREADS - 1) / THREADS;
    silu_inplace_kernel<<<(unsigned int)(blocks < 65536 ? blocks : 65536), THREADS>>>(y, n);
    return cudaGetLastError();
}

// ---- the task ----------------------------------------------------------------------------------

// TODO(lab2/07) begin: one kernel that produces every y[r][c] from x[r][c] and bias[c] with one read of x and one write of y, the threads of a warp on neighbouring columns, and any rows (more than a grid dimension holds too) and any cols (not a multiple of 4 or 32); see the chapter's section on fusion; about 10 lines; try 1x1, 3x5 and 33x17.
// x (rows, cols), bias (cols,) -> y (rows, cols). Each thread owns one column: it loads that
// column's bias once into a register and walks down the rows, gridDim.y apart, so x and y
// are each touched exactly once and the warp's 32 columns are neighbours in memory.
__global__ void bias_silu_kernel(const float* __restrict__ x, const float* __restrict__ bias,
                                 float* __restrict__ y, int rows, int cols) {
    const int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= cols) return;
    const float b = bias[col];
    for (int r = blockIdx.y; r < rows; r += gridDim.y) {
        const size_t i = (size_t)r * cols + col;
        y[i] = silu(x[i] + b);
    }
}
// TODO(lab2/07) end

COURSE_API cudaError_t bias_silu(const float* x, const float* bias, float* y, int rows, int cols) {
    // TODO(lab2/07) begin: one launch of your kernel whose grid covers every column and every row, within the grid's limits; see the chapter's section on fusion; about 3 lines; work out the grid for 1x1 and 4096x4096, and for 100000 rows.
    const dim3 grid((cols + THREADS - 1) / THREADS, rows < MAX_GRID_Y ? rows : MAX_GRID_Y);
    bias_silu_kernel<<<grid, THREADS>>>(x, bias, y, rows, cols);
    return cudaGetLastError();
    //~ return cudaErrorNotYetImplemented;
    // TODO(lab2/07) end
}

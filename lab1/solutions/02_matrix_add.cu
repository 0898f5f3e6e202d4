// Lab 1 · Task 02 — Matrix add with a 2D grid
//
// Implement: matrix_add_kernel (one thread per element, 2D indices) and its 2D launch.
// Contract:  A, B, C are DEVICE float32 matrices of shape (rows, cols), row-major,
//            contiguous (element (r, c) at r * cols + c); A and B are read-only, C is
//            written; C does not overlap A or B. rows, cols >= 1; rows <= 65535 * 16
//            (the grid's y dimension is limited to 65535 blocks).
//            Returns the launch error; does not synchronize.
// Test:      make test-lab1 TASK=02

#include "course.h"

// A (rows, cols), B (rows, cols) -> C (rows, cols), all row-major
__global__ void matrix_add_kernel(const float* __restrict__ A, const float* __restrict__ B,
                                  float* __restrict__ C, int rows, int cols) {
    // TODO(lab1/02) begin: each thread adds the one element at its (row, column), with x running along a row so that a warp reads consecutive floats, and no thread outside the matrix touches memory; see §2.6, §2.7 and §2.5 (index types); about 6 lines; try 1x1, 1x33, 33x1 and 17x17.
    // x walks along a row, so the 32 threads of a warp touch 32 consecutive floats.
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    if (row < rows && col < cols) {
        size_t i = (size_t)row * cols + col;  // rows * cols may not fit in an int
        C[i] = A[i] + B[i];
    }
    // TODO(lab1/02) end
}

COURSE_API cudaError_t matrix_add(const float* A, const float* B, float* C, int rows, int cols) {
    // TODO(lab1/02) begin: 16x16-thread blocks, and a 2D grid with just enough of them to cover every column (x) and every row (y); see §2.6 and the limits in §2.4; about 4 lines; try shapes that are not multiples of 16 in either dimension.
    dim3 block(16, 16);
    dim3 grid((cols + block.x - 1) / block.x, (rows + block.y - 1) / block.y);
    matrix_add_kernel<<<grid, block>>>(A, B, C, rows, cols);
    // TODO(lab1/02) end
    return cudaGetLastError();
}

// Lab 2 · Task 11 — The transpose ladder: out = in^T in three kernels
//
// Implement: the kernels of the chapter's transpose ladder, each writing out[c][r] = in[r][c]:
//            transpose_naive_kernel (one thread per element: loads coalesced, stores strided),
//            transpose_tiled_kernel (a 32 x 32 tile staged through shared memory, so that loads
//            and stores are both coalesced) and transpose_padded_kernel (the same tile without
//            its shared-memory bank conflicts). The host code, the same for every rung, is given:
//            it launches one block per 32 x 32 tile of `in`, on a one-dimensional grid that
//            block_tile() turns back into the tile's position.
// Contract:  in is a DEVICE float32 matrix of shape (rows, cols), row-major and contiguous, and
//            read-only; out is a DEVICE float32 matrix of shape (cols, rows), row-major and
//            contiguous, overlapping nothing. rows, cols >= 1 and rows * cols < 2^31 (offsets
//            are computed in size_t all the same). out[c][r] = in[r][c], exactly. Each entry
//            point runs on the default stream, returns the launch error and does not synchronize.
// Test:      make test-lab2 TASK=11

#include "course.h"

#include <cstddef>

constexpr int TILE = 32;       // a block's tile is TILE x TILE elements: one warp spans a tile row
constexpr int BLOCK_ROWS = 8;  // the tiled rungs run TILE x BLOCK_ROWS threads: 4 elements each

// ---------------------------------------------------------------------------------------------
// Given: which tile a block owns.
// ---------------------------------------------------------------------------------------------

// The grid is one-dimensional and numbers the tiles of `in` row of tiles by row of tiles:
// gridDim.y stops at 65535, fewer than the 312500 rows of tiles of a 10^7 x 1 matrix, while
// gridDim.x reaches 2^31 - 1. One division per block, against 1024 elements moved.
struct Tile {
    int row0, col0;  // in[row0][col0] is the tile's top-left element
};

__device__ __forceinline__ Tile block_tile(int cols) {
    const unsigned across = (unsigned)(cols - 1) / TILE + 1;  // tiles per row of tiles
    return {(int)(blockIdx.x / across) * TILE, (int)(blockIdx.x % across) * TILE};
}

// ---------------------------------------------------------------------------------------------
// The kernels. in (rows, cols) -> out (cols, rows). A tile may hang over the bottom or the right
// edge of `in`: its elements past the edge are neither read nor written.
// ---------------------------------------------------------------------------------------------

// Rung 1 · naive. TILE x TILE threads per block, one element each.
__global__ void transpose_naive_kernel(const float* __restrict__ in, float* __restrict__ out, int rows, int cols) {
    // TODO(lab2/11) begin: out[c][r] = in[r][c] for this thread's one element of the block's tile, with threadIdx.x along in's columns (so a warp's 32 loads are neighbours in memory and its 32 stores are rows floats apart), and nothing touched past the matrix's edges; see the chapter's transpose ladder, rung 1; about 4 lines; try 1x33, 33x1 and 31x65.
    // TODO(lab2/11) end
}

// Rung 2 · shared-memory tile. TILE x BLOCK_ROWS threads per block: each thread moves
// TILE / BLOCK_ROWS = 4 elements, its rows BLOCK_ROWS apart.
__global__ void transpose_tiled_kernel(const float* __restrict__ in, float* __restrict__ out, int rows, int cols) {
    // TODO(lab2/11) begin: the block's tile of in loaded into a __shared__ float[TILE][TILE] with coalesced loads (lanes along in's columns), a barrier, then stored to out with coalesced stores (lanes along out's columns, which are in's rows, so each lane reads down a column of the tile); loads guarded by in's edges, stores by out's; see the chapter's transpose ladder, rung 2; about 15 lines; try 1x1, 31x65 and 65x31.
    // TODO(lab2/11) end
}

// Rung 3 · padded tile. The same block shape and the same work as rung 2.
__global__ void transpose_padded_kernel(const float* __restrict__ in, float* __restrict__ out, int rows, int cols) {
    // TODO(lab2/11) begin: rung 2 with the 32-way bank conflict of the column-wise tile reads removed, by giving each tile row one unused float of padding (or by an equivalent swizzle of the column index); see the chapter's transpose ladder, rung 3, and its bank arithmetic; about 15 lines; try 1x1, 31x65 and 65x31, and compare the bank conflicts of rungs 2 and 3 with make profile-lab2 TASK=11.
    // TODO(lab2/11) end
}

// ---------------------------------------------------------------------------------------------
// The host side, shared by every rung.
// ---------------------------------------------------------------------------------------------

using Kernel = void (*)(const float*, float*, int, int);

// One block per TILE x TILE tile of `in`, TILE x block_rows threads each. (n - 1) / TILE + 1
// rather than (n + TILE - 1) / TILE: cols may be 2^31 - 1, where n + TILE - 1 overflows an int.
// At most 2^26 blocks (a 1 x (2^31 - 1) matrix), below gridDim.x's limit.
static cudaError_t launch(Kernel kernel, int block_rows, const float* in, float* out, int rows, int cols) {
    const size_t tiles = (size_t)((cols - 1) / TILE + 1) * (size_t)((rows - 1) / TILE + 1);
    kernel<<<(unsigned)tiles, dim3(TILE, block_rows)>>>(in, out, rows, cols);
    return cudaGetLastError();
}

COURSE_API cudaError_t transpose_1(const float* in, float* out, int rows, int cols) {
    return launch(transpose_naive_kernel, TILE, in, out, rows, cols);
}

COURSE_API cudaError_t transpose_2(const float* in, float* out, int rows, int cols) {
    return launch(transpose_tiled_kernel, BLOCK_ROWS, in, out, rows, cols);
}

COURSE_API cudaError_t transpose_3(const float* in, float* out, int rows, int cols) {
    return launch(transpose_padded_kernel, BLOCK_ROWS, in, out, rows, cols);
}

// Lab 4 · Task 04 — kiln's matmul: a batched, shared-memory tiled SGEMM
//
// Implement: matmul_kernel (64 x 64 tiles of C per block, A and B staged through shared memory in
//            steps of 16 along K, a 4 x 4 block of C in registers per thread) and its launch.
// Contract:  float32 DEVICE data, every matrix row-major and contiguous; c overlaps neither input.
//            For 0 <= i < batch: c[i] (m, n) = a[i] (m, k) @ b[i] (k, n), where a[i] starts at
//            a + i * a_batch_stride, b[i] at b + i * b_batch_stride (in elements; 0 means one
//            matrix shared by the whole batch: broadcasting) and c[i] at c + i * m * n.
//            batch, m, n, k >= 1, any size (none needs to be a multiple of a tile; k up to 4096 is
//            tested); 64-bit offsets, so c may hold more than 2^31 elements. Each element is a sum
//            of k products in float32 (no TF32).
//            Launches only on `stream`, never synchronizes or allocates, returns the launch's error.
// Test:      make test-lab4 TASK=04

#include "kiln/kernels/kiln_kernels.h"

#include <cstdint>

constexpr int BM = 64;                          // rows of C per block tile
constexpr int BN = 64;                          // columns of C per block tile
constexpr int BK = 16;                          // the step along K: one stage of the shared tiles
constexpr int TM = 4;                           // rows of C per thread
constexpr int TN = 4;                           // columns of C per thread
constexpr int THREADS = (BM / TM) * (BN / TN);  // 256: a 16 x 16 grid of threads covers the tile
constexpr int64_t MAX_GRID_YZ = 65535;          // the hardware's limit on gridDim.y and gridDim.z

static_assert(BM * BK % THREADS == 0 && BK * BN % THREADS == 0, "every thread loads the same share of a tile");

// (batch, m, k) @ (batch, k, n) -> (batch, m, n); block (x, y, z) starts at column tile x, row tile
// y and matrix z, and strides over the rest, so any m, n and batch fit in a capped grid.
__global__ void __launch_bounds__(THREADS)
    matmul_kernel(float* __restrict__ c, const float* __restrict__ a, const float* __restrict__ b, int64_t batch,
                  int64_t m, int64_t n, int64_t k, int64_t a_batch_stride, int64_t b_batch_stride) {
    // A's tile is stored transposed (As[kk][row]), so that the TM rows a thread needs at step kk are
    // contiguous: one float4 read. The +4 pads a row of As so that the 16 consecutive k's one warp
    // stores spread over 8 banks, two to a bank (a 2-way conflict instead of 16-way), keeping 16-byte
    // alignment.
    __shared__ __align__(16) float As[BK][BM + 4];
    __shared__ __align__(16) float Bs[BK][BN];
    // TODO(lab4/04) begin: for every (matrix, row tile, column tile) this block owns, clear a TM x TN accumulator, then step along k by BK: load A's BM x BK and B's BK x BN tiles into shared memory (coalesced, zero past m, n and k: the last partial step too), wait, add the BK rank-1 updates from registers, wait again; finally store the TM x TN results that lie inside c; see the chapter's section "The tiled matmul"; about 50 lines; try 1x1x1, 33x17x65 and 65x129x31 (m x k x n).
    // TODO(lab4/04) end
}

COURSE_API cudaError_t kiln_matmul(float* c, const float* a, const float* b, int64_t batch, int64_t m, int64_t n,
                                   int64_t k, int64_t a_batch_stride, int64_t b_batch_stride, cudaStream_t stream) {
    // TODO(lab4/04) begin: one block of THREADS threads per BM x BN tile of C and per matrix of the batch (x: column tiles, y: row tiles, z: the batch), y and z capped at MAX_GRID_YZ (the kernel's loops cover the rest), launched on `stream`; see the chapter's section "The tiled matmul"; about 6 lines.
    // TODO(lab4/04) end
    return cudaGetLastError();
}

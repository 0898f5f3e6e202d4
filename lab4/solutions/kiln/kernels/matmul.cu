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
    const int tid = threadIdx.x;
    const int tx = tid % (BN / TN);  // this thread's columns: tx * TN ... tx * TN + TN - 1 of the tile
    const int ty = tid / (BN / TN);  // this thread's rows:    ty * TM ... ty * TM + TM - 1 of the tile
    for (int64_t z = blockIdx.z; z < batch; z += gridDim.z) {
        const float* A = a + z * a_batch_stride;  // (m, k)
        const float* B = b + z * b_batch_stride;  // (k, n)
        float* C = c + z * m * n;                 // (m, n)
        for (int64_t row0 = static_cast<int64_t>(blockIdx.y) * BM; row0 < m;
             row0 += static_cast<int64_t>(gridDim.y) * BM) {
            for (int64_t col0 = static_cast<int64_t>(blockIdx.x) * BN; col0 < n;
                 col0 += static_cast<int64_t>(gridDim.x) * BN) {
                float acc[TM][TN] = {};
                for (int64_t k0 = 0; k0 < k; k0 += BK) {
                    // A tile (BM, BK): consecutive threads take consecutive k of one row (coalesced)
#pragma unroll
                    for (int s = 0; s < BM * BK / THREADS; ++s) {
                        const int e = tid + s * THREADS;
                        const int r = e / BK, kk = e % BK;
                        const int64_t gr = row0 + r, gk = k0 + kk;
                        As[kk][r] = (gr < m && gk < k) ? A[gr * k + gk] : 0.0f;
                    }
                    // B tile (BK, BN): consecutive threads take consecutive columns of one row
#pragma unroll
                    for (int s = 0; s < BK * BN / THREADS; ++s) {
                        const int e = tid + s * THREADS;
                        const int kk = e / BN, cc = e % BN;
                        const int64_t gk = k0 + kk, gc = col0 + cc;
                        Bs[kk][cc] = (gk < k && gc < n) ? B[gk * n + gc] : 0.0f;
                    }
                    __syncthreads();  // both tiles complete before anyone reads them
#pragma unroll
                    for (int kk = 0; kk < BK; ++kk) {
                        const float4 av = *reinterpret_cast<const float4*>(&As[kk][ty * TM]);
                        const float4 bv = *reinterpret_cast<const float4*>(&Bs[kk][tx * TN]);
                        const float ar[TM] = {av.x, av.y, av.z, av.w};
                        const float br[TN] = {bv.x, bv.y, bv.z, bv.w};
#pragma unroll
                        for (int i = 0; i < TM; ++i) {
#pragma unroll
                            for (int j = 0; j < TN; ++j) acc[i][j] += ar[i] * br[j];
                        }
                    }
                    __syncthreads();  // everyone is done with the tiles before the next step refills them
                }
#pragma unroll
                for (int i = 0; i < TM; ++i) {
                    const int64_t gr = row0 + ty * TM + i;
#pragma unroll
                    for (int j = 0; j < TN; ++j) {
                        const int64_t gc = col0 + tx * TN + j;
                        if (gr < m && gc < n) C[gr * n + gc] = acc[i][j];
                    }
                }
            }
        }
    }
    // TODO(lab4/04) end
}

COURSE_API cudaError_t kiln_matmul(float* c, const float* a, const float* b, int64_t batch, int64_t m, int64_t n,
                                   int64_t k, int64_t a_batch_stride, int64_t b_batch_stride, cudaStream_t stream) {
    // TODO(lab4/04) begin: one block of THREADS threads per BM x BN tile of C and per matrix of the batch (x: column tiles, y: row tiles, z: the batch), y and z capped at MAX_GRID_YZ (the kernel's loops cover the rest), launched on `stream`; see the chapter's section "The tiled matmul"; about 6 lines.
    const int64_t col_tiles = (n + BN - 1) / BN;
    const int64_t row_tiles = (m + BM - 1) / BM;
    const dim3 grid(static_cast<unsigned int>(col_tiles < INT32_MAX ? col_tiles : INT32_MAX),
                    static_cast<unsigned int>(row_tiles < MAX_GRID_YZ ? row_tiles : MAX_GRID_YZ),
                    static_cast<unsigned int>(batch < MAX_GRID_YZ ? batch : MAX_GRID_YZ));
    matmul_kernel<<<grid, THREADS, 0, stream>>>(c, a, b, batch, m, n, k, a_batch_stride, b_batch_stride);
    // TODO(lab4/04) end
    return cudaGetLastError();
}

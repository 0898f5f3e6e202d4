// Lab 5 · Task 03 — linear: a GEMV at the memory roofline for decode, a tensor-core GEMM for prefill
//
// Implement: gemv_kernel (m <= 8: each warp streams one or two rows of w in 16-byte packets, the
//            first stage loaded before the wait for the kernel before, each next stage
//            loaded while the current one is multiplied, x's rows read
//            through L1, float32 sums reduced by warp shuffles; with NORM, RMSNorm folded in
//            front), gemm_tc_kernel (m > 8, f16/bf16:
//            128 x 128 tiles on the tensor cores through WMMA, the tiles of x and w staged by
//            cp.async into two shared-memory stages) and the dispatch in linear_epi() between them;
//            gemm_simt_kernel (f32 prefill, lab 4's tiled SGEMM) is given.
// Contract:  DEVICE data, dense, row-major; x (m, k), w (n, k) like nn.Linear's weight, out (m, n).
//            out = x @ w.T summed in float32 and rounded once to T, after the epilogue:
//              0: nothing; 1: + extra (m, n); 2: silu(x @ w.T) * (x @ extra.T), extra a second
//              weight (n, k). out overlaps nothing; inputs are read-only.
//            kiln_rmsnorm_linear: the same for m <= 8 with x replaced by rmsnorm(x, norm_w):
//              each row of x times rsqrt(mean(x^2) + eps) times norm_w, in float32, unrounded.
//            kiln_rmsnorm_linear_qkv: kiln_rmsnorm_linear (epilogue 0) over wq, wk and wv stacked
//              (Stacked: the rows of one matrix), out (m, nq + nk + nv).
//            m, n, k >= 0 (m or n == 0: nothing to do); any m, n (no multiple of a tile needed);
//            k % 8 == 0 for f16 and bf16, else cudaErrorInvalidValue; f32 takes any k. Pointers
//            are 16-byte aligned by the header's contract; a call whose aren't (or f32 with k % 4
//            != 0) takes the scalar-load path, right but slower. 64-bit offsets throughout.
//            Launches only on `stream`, never synchronizes or allocates, returns the launch's error.
// Test:      make test-lab5 TASK=03

#include "kiln_llm/kernels/llm_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <cstdint>

// ---- element types ------------------------------------------------------------------------------

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
    return v;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
    return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}

// silu(a) = a * sigmoid(a) = a / (1 + e^-a): for a very negative e^-a is inf and the quotient -0, no NaN.
__device__ __forceinline__ float silu(float a) { return a / (1.0f + expf(-a)); }

// VEC consecutive elements of a row, loaded as one: 16 bytes (8 halves or 4 floats) on the fast
// path, one element (VEC = 1) on the fallback for rows that are not 16-byte aligned.
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Packet {
    T v[VEC];
};

// A packet of w, read once and never again: ld.global.nc (the read-only path) with
// L1::no_allocate, so the stream of weights does not evict x's rows, which every warp re-reads from L1.
template <typename T, int VEC>
__device__ __forceinline__ Packet<T, VEC> load_stream(const T* p) {
    Packet<T, VEC> r;
    if constexpr (sizeof(T) * VEC == 16) {
        uint4 u;
        asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
            : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
            : "l"(p));
        *reinterpret_cast<uint4*>(&r) = u;
    } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) r.v[i] = p[i];
    }
    return r;
}

// A packet of x: small and read by every warp of the grid, so it stays in L1 / L2.
template <typename T, int VEC>
__device__ __forceinline__ Packet<T, VEC> load_cached(const T* p) {
    Packet<T, VEC> r;
    if constexpr (sizeof(T) * VEC == 16) {
        *reinterpret_cast<uint4*>(&r) = __ldg(reinterpret_cast<const uint4*>(p));
    } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) r.v[i] = p[i];
    }
    return r;
}

// acc + sum_i w[i] * x[i], in float32.
template <typename T, int VEC>
__device__ __forceinline__ float dot(float acc, const Packet<T, VEC>& w, const Packet<T, VEC>& x) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) acc = fmaf(to_float(w.v[i]), to_float(x.v[i]), acc);
    return acc;
}

// With the RMSNorm prologue: x's packet times the norm's weight g, in float32, for the dot, and
// its squares added to ss (the row's sum of squares, which scales the sums at the end).
template <typename T, int VEC>
__device__ __forceinline__ void scale_by_norm(const Packet<T, VEC>& xp, const Packet<T, VEC>& gp, float (&xg)[VEC],
                                              float& ss) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
        const float v = to_float(xp.v[i]);
        ss = fmaf(v, v, ss);
        xg[i] = v * to_float(gp.v[i]);
    }
}

template <typename T, int VEC>
__device__ __forceinline__ float dot(float acc, const Packet<T, VEC>& w, const float (&x)[VEC]) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) acc = fmaf(to_float(w.v[i]), x[i], acc);
    return acc;
}

// The value of out[row][col] from the float32 sum(s) and the epilogue, rounded once.
template <typename T, int EPI>
__device__ __forceinline__ T finish(float acc, float acc3, const T* extra, int64_t idx) {
    if constexpr (EPI == 1) acc += to_float(extra[idx]);
    if constexpr (EPI == 2) acc = silu(acc) * acc3;
    return from_float<T>(acc);
}

// ---- decode: GEMV (m <= 8) ------------------------------------------------------------------------

constexpr int MAX_GEMV_M = 8;   // rows of x the GEMV takes; more go to the GEMM
constexpr int GEMV_WARPS = 4;   // warps per block
constexpr int GEMV_PACKETS = 4;  // packets of w per lane in one stage of the pipeline (spread over its rows)
constexpr int GEMV_THREADS = GEMV_WARPS * 32;

// Rows of w per warp for M rows of x and NW weights. One row per warp gives the most warps to keep
// loads in flight (n = 4096 is 4096 warps, 31 per SM of an H100); from 4 rows of x on, each packet
// of x, re-read from L1 for every row of w, would cost L1 as much as DRAM delivers, so a warp takes
// two rows of w and reads each packet of x once for both. Swiglu already reads two rows (of w and
// w3) per packet of x, and twice the sums would not fit in registers.
__host__ __device__ constexpr int gemv_rows(int m, int nw) { return m >= 4 && nw == 1 ? 2 : 1; }

// The weight a GEMV reads, as a matrix of n rows of k whose row r is at w.row(r, k): one (n, k)
// matrix, or for kiln_rmsnorm_linear_qkv the q, k and v projections stacked, rows [0, n1) of w,
// [n1, n2) of w2 and [n2, n) of w3, so that one launch computes all three, each output in its own
// columns of out. Two types, not one with n1 = n2 = n: the plain kernels then carry no branch
// (and no registers) for a stack they never see.
template <typename T>
struct Single {
    const T* w;
    __device__ __forceinline__ const T* row(int64_t r, int64_t k) const { return w + r * k; }
};

template <typename T>
struct Stacked {
    const T* w;
    const T* w2;
    const T* w3;
    int64_t n1, n2;
    __device__ __forceinline__ const T* row(int64_t r, int64_t k) const {
        return r < n1 ? w + r * k : (r < n2 ? w2 + (r - n1) * k : w3 + (r - n2) * k);
    }
};

// Of each row, what is asked of L2 ahead of the first stage of loads. Asking for more (whole rows)
// was slower on an H100: a grid's first blocks then flood L2 and DRAM with requests the kernel
// before competes with.
constexpr int PREFETCH_BYTES = 2048;

// Asks L2 for the first PREFETCH_BYTES of this warp's rows row0 .. row0 + rows - 1 of w (and, for
// swiglu, S = 2 * rows, of w3 = extra), one 128-byte line per lane: a hint that reads nothing into
// registers. Rows past n are left out.
template <typename T, int S, typename W>
__device__ __forceinline__ void prefetch_rows(const W& w, const T* extra, int64_t row0, int rows, int64_t n,
                                              int64_t k) {
    constexpr int LINES = PREFETCH_BYTES / 128;
    const int lane = threadIdx.x % 32;
    const int64_t row_bytes = k * static_cast<int64_t>(sizeof(T));
#pragma unroll
    for (int i = lane; i < S * LINES; i += 32) {
        const int s = i / LINES;
        const int64_t r = row0 + s % rows, at = static_cast<int64_t>(i % LINES) * 128;
        if (r < n && at < row_bytes) {
            const char* line = reinterpret_cast<const char*>(s < rows ? w.row(r, k) : extra + r * k) + at;
            asm volatile("prefetch.global.L2 [%0];" ::"l"(line));
        }
    }
}

// out (m, n) = x (m, k) @ w (n, k).T (+ epilogue), m <= M, row r of w at w.row(r, k). Warp j of block b owns rows
// (b * GEMV_WARPS + j) * ROWS ... + ROWS - 1 of w (and of w3 = extra for swiglu); lane l reads
// packets l, l + 32, l + 64, ... of each row, so one warp instruction reads 512 contiguous bytes
// of a row. Every lane keeps M x ROWS (x 2 for swiglu) partial sums; a butterfly of
// shuffles gives every lane the totals, and the lanes write them out, one output each.
// NORM: x is first normalized by RMSNorm with weight g (k,) and eps. Each warp reads the whole of
// every row of x anyway, so it sums the squares as it goes and multiplies by g packet by packet;
// the row's factor rsqrt(mean(x^2) + eps) is a scalar and waits for the end. A decode step then
// has no RMSNorm kernel: one launch, one wait and a round trip of the row through memory fewer.
// The weights are no kernel's output, so a warp may load its first stage of them before
// wait_for_previous(): a grid that starts while the kernel before it finishes has its first
// bytes in registers when that kernel is done. x is that kernel's output: it waits.
template <typename T, typename W, int VEC, int M, int EPI, bool NORM>
__global__ void __launch_bounds__(GEMV_THREADS)
    gemv_kernel(T* __restrict__ out, const T* __restrict__ x, const W w, const T* __restrict__ extra,
                const T* __restrict__ g, float eps, int m, int64_t n, int64_t k) {
    constexpr int NW = EPI == 2 ? 2 : 1;  // weight matrices read: w, and w3 (extra) for swiglu
    constexpr int ROWS = gemv_rows(M, NW);  // rows of w per warp
    constexpr int S = ROWS * NW;          // row streams per warp: stream s reads row s % ROWS of weight s / ROWS
    constexpr int STEP = 32 * VEC;        // elements of a row one warp instruction covers
    using P = Packet<T, VEC>;
    prefetch_rows<T, S>(w, extra, (static_cast<int64_t>(blockIdx.x) * GEMV_WARPS + threadIdx.x / 32) * ROWS, ROWS, n, k);
    // TODO(lab5/03) begin: this warp's ROWS rows (and extra's for swiglu); the first stage of w, then wait_for_previous() and start_next(); k in stages, loading the next while multiplying the current with every row of x; the tail of k; reduce over the warp, write through finish(); NORM too; see the chapter's section "The GEMV, step by step"; about 65 lines; try m = 1, n = 9, k = 8 and m = 5, n = 1003, k = 1000.
    // TODO(lab5/03) end
}

// ---- prefill: GEMM on the tensor cores (m > 8, f16 / bf16) --------------------------------------

constexpr int TC_BM = 128;              // rows of x (and of out) per block
constexpr int TC_BROWS = 128;           // rows of weights per block: 128 of w, or 64 of w and 64 of w3
constexpr int TC_BK = 32;               // the step along k: one stage
constexpr int TC_LD = TC_BK + 8;        // a staged row, padded by 16 bytes so WMMA's row reads spread over the banks
constexpr int TC_CHUNKS = TC_BK / 8;    // 16-byte chunks per staged row
constexpr int TC_THREADS = 256;         // 8 warps: 2 along m (64 rows each) x 4 along n
constexpr int TC_STAGE = (TC_BM + TC_BROWS) * TC_LD;  // elements of one stage: x's tile, then the weights'
constexpr int FRAG = 16;                // WMMA's m16n16k16 fragment

static_assert((TC_BM + TC_BROWS) * TC_CHUNKS % TC_THREADS == 0, "every thread copies the same number of chunks");
static_assert(2 * TC_STAGE * 2 <= 48 * 1024, "two stages of 16-bit elements fit in static shared memory");

// 16 bytes global -> shared without passing through registers (sm_80+); src_bytes = 0 writes 16
// zero bytes and reads nothing: the tails of m, n and k are staged as zeros.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool full) {
    const unsigned int dst = static_cast<unsigned int>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(full ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// wait until at most N of this thread's committed groups are still in flight
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// out (m, n) = x (m, k) @ w (n, k).T (+ epilogue). Block b covers rows m0 .. m0 + 127 of x and
// columns n0 .. n0 + BN - 1 of out, with m's tile varying fastest across blocks, so that the blocks
// running together share one tile of w (read once from DRAM) and x (small) stays in L2.
// w's tile (BN, k-step) is, read column-major, the (k-step, BN) operand B of WMMA: no transpose.
template <typename T, int EPI>
__global__ void __launch_bounds__(TC_THREADS)
    gemm_tc_kernel(T* __restrict__ out, const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ extra,
                   int64_t m, int64_t n, int64_t k, int64_t m_tiles) {
    using namespace nvcuda;
    constexpr int NW = EPI == 2 ? 2 : 1;
    constexpr int BN = TC_BROWS / NW;    // columns of out per block
    constexpr int WN = BN / 4;           // columns of out per warp
    constexpr int FM = 64 / FRAG;        // fragments per warp along m
    constexpr int FN = WN / FRAG;        // fragments per warp along n, per weight
    __shared__ __align__(128) T smem[2 * TC_STAGE];
    wait_for_previous();
    start_next();
    // TODO(lab5/03) begin: clear the accumulator fragments; stage step 0 with cp.async (zeros past m, n and k); per step of k: stage the next one, wait for this one, multiply its tiles on the tensor cores; store the fragments through a scratch and write through finish(); see the chapter's section "Prefill is a GEMM: tensor cores and cp.async"; about 70 lines; try m = 9, 129 and n = 33 at k = 8, 40 and 1000.
    // TODO(lab5/03) end
}

// ---- prefill on CUDA cores: f32, and rows that are not 16-byte aligned (given) ---------------------

constexpr int ST_BM = 64, ST_BN = 64, ST_BK = 16, ST_TM = 4, ST_TN = 4;
constexpr int ST_THREADS = (ST_BM / ST_TM) * (ST_BN / ST_TN);  // 256

// Lab 4's tiled SGEMM with w read transposed (w's rows are out's columns) and the epilogue: x's
// and w's tiles staged in shared memory as float32, a 4 x 4 block of out per thread.
template <typename T, int EPI>
__global__ void __launch_bounds__(ST_THREADS)
    gemm_simt_kernel(T* __restrict__ out, const T* __restrict__ x, const T* __restrict__ w,
                     const T* __restrict__ extra, int64_t m, int64_t n, int64_t k, int64_t m_tiles) {
    constexpr int NW = EPI == 2 ? 2 : 1;
    __shared__ __align__(16) float xs[ST_BK][ST_BM + 4];
    __shared__ __align__(16) float ws[NW][ST_BK][ST_BN + 4];
    const int tid = threadIdx.x, tx = tid % (ST_BN / ST_TN), ty = tid / (ST_BN / ST_TN);
    const int64_t m0 = (static_cast<int64_t>(blockIdx.x) % m_tiles) * ST_BM;
    const int64_t n0 = (static_cast<int64_t>(blockIdx.x) / m_tiles) * ST_BN;
    float acc[NW][ST_TM][ST_TN] = {};
    wait_for_previous();
    start_next();
    for (int64_t k0 = 0; k0 < k; k0 += ST_BK) {
        // consecutive threads read consecutive k of one row of x or w: 64-byte runs
#pragma unroll
        for (int e = tid; e < ST_BM * ST_BK; e += ST_THREADS) {
            const int r = e / ST_BK, kk = e % ST_BK;
            const int64_t gr = m0 + r, gk = k0 + kk;
            xs[kk][r] = (gr < m && gk < k) ? to_float(x[gr * k + gk]) : 0.0f;
#pragma unroll
            for (int s = 0; s < NW; ++s) {
                const int64_t gc = n0 + r;  // ST_BM == ST_BN: the same (r, kk) walk covers w's tile
                ws[s][kk][r] = (gc < n && gk < k) ? to_float((s == 0 ? w : extra)[gc * k + gk]) : 0.0f;
            }
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < ST_BK; ++kk) {
            const float4 xv = *reinterpret_cast<const float4*>(&xs[kk][ty * ST_TM]);
            const float xr[ST_TM] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
            for (int s = 0; s < NW; ++s) {
                const float4 wv = *reinterpret_cast<const float4*>(&ws[s][kk][tx * ST_TN]);
                const float wr[ST_TN] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
                for (int i = 0; i < ST_TM; ++i) {
#pragma unroll
                    for (int j = 0; j < ST_TN; ++j) acc[s][i][j] = fmaf(xr[i], wr[j], acc[s][i][j]);
                }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < ST_TM; ++i) {
#pragma unroll
        for (int j = 0; j < ST_TN; ++j) {
            const int64_t row = m0 + ty * ST_TM + i, col = n0 + tx * ST_TN + j;
            if (row < m && col < n) {
                const int64_t idx = row * n + col;
                out[idx] = finish<T, EPI>(acc[0][i][j], acc[NW - 1][i][j], extra, idx);
            }
        }
    }
}
static_assert(ST_BM == ST_BN, "gemm_simt_kernel stages x's and w's tiles with one walk");

// ---- dispatch -------------------------------------------------------------------------------------

static bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// What the GEMV takes besides x, w and extra: the RMSNorm prologue's weight and eps (g null: none).
struct Prologue {
    const void* g;
    float eps;
};

template <typename T, typename W, int VEC, int M, int EPI, bool NORM>
static void launch_gemv(T* out, const T* x, const W& w, const T* extra, Prologue norm, int64_t m, int64_t n, int64_t k,
                        cudaStream_t stream) {
    constexpr int64_t rows_per_block = GEMV_WARPS * gemv_rows(M, EPI == 2 ? 2 : 1);
    const int64_t blocks = (n + rows_per_block - 1) / rows_per_block;
    launch_chained(gemv_kernel<T, W, VEC, M, EPI, NORM>, dim3(static_cast<unsigned int>(blocks)), dim3(GEMV_THREADS),
                   stream, out, x, w, extra, static_cast<const T*>(norm.g), norm.eps, static_cast<int>(m), n, k);
}

// m (1 .. 8) rounded up to the next compiled size: 1, 2, 4 or 8 rows of sums per lane
template <typename T, int VEC, int EPI, bool NORM = false, typename W>
static void gemv_for_m(T* out, const T* x, const W& w, const T* extra, int64_t m, int64_t n, int64_t k,
                       cudaStream_t stream, Prologue norm = Prologue{nullptr, 0.0f}) {
    if (m == 1) {
        launch_gemv<T, W, VEC, 1, EPI, NORM>(out, x, w, extra, norm, m, n, k, stream);
    } else if (m == 2) {
        launch_gemv<T, W, VEC, 2, EPI, NORM>(out, x, w, extra, norm, m, n, k, stream);
    } else if (m <= 4) {
        launch_gemv<T, W, VEC, 4, EPI, NORM>(out, x, w, extra, norm, m, n, k, stream);
    } else {
        launch_gemv<T, W, VEC, MAX_GEMV_M, EPI, NORM>(out, x, w, extra, norm, m, n, k, stream);
    }
}

template <typename T, int EPI>
static void launch_gemm(bool tensor_cores, T* out, const T* x, const T* w, const T* extra, int64_t m, int64_t n,
                        int64_t k, cudaStream_t stream) {
    if constexpr (sizeof(T) == 2) {
        if (tensor_cores) {
            const int64_t m_tiles = (m + TC_BM - 1) / TC_BM, bn = TC_BROWS / (EPI == 2 ? 2 : 1);
            const int64_t blocks = m_tiles * ((n + bn - 1) / bn);
            gemm_tc_kernel<T, EPI>
                <<<static_cast<unsigned int>(blocks), TC_THREADS, 0, stream>>>(out, x, w, extra, m, n, k, m_tiles);
            return;
        }
    }
    const int64_t m_tiles = (m + ST_BM - 1) / ST_BM;
    const int64_t blocks = m_tiles * ((n + ST_BN - 1) / ST_BN);
    gemm_simt_kernel<T, EPI>
        <<<static_cast<unsigned int>(blocks), ST_THREADS, 0, stream>>>(out, x, w, extra, m, n, k, m_tiles);
}

template <typename T, int EPI>
static void linear_epi(bool vec, T* out, const T* x, const T* w, const T* extra, int64_t m, int64_t n, int64_t k,
                       cudaStream_t stream) {
    // TODO(lab5/03) begin: m <= MAX_GEMV_M: the GEMV, with 16-byte packets (16 / sizeof(T) elements) when `vec` and single elements otherwise; else the GEMM on the tensor cores when `vec` (launch_gemm picks CUDA cores for f32); see the chapter's section "Decode is a GEMV: streaming the weights"; about 8 lines.
    // TODO(lab5/03) end
}

// The sizes and pointers kiln_linear and kiln_rmsnorm_linear refuse, as cudaErrorInvalidValue.
template <typename T>
static bool linear_args_ok(int epilogue, const T* extra, int64_t m, int64_t n, int64_t k) {
    if (epilogue < 0 || epilogue > 2 || m < 0 || n < 0 || k < 0) return false;
    if (epilogue != 0 && extra == nullptr) return false;
    if (sizeof(T) == 2 && k % 8 != 0) return false;
    // one launch covers at most 2^31 - 1 blocks (grid.x), and the GEMV's rows of x are int
    return (n + GEMV_WARPS - 1) / GEMV_WARPS <= INT32_MAX &&
           ((m + ST_BM - 1) / ST_BM) * ((n + ST_BN - 1) / ST_BN) <= INT32_MAX;
}

template <typename T>
static cudaError_t linear(int epilogue, T* out, const T* x, const T* w, const T* extra, int64_t m, int64_t n,
                         int64_t k, cudaStream_t stream) {
    constexpr int64_t VEC = 16 / sizeof(T);
    if (!linear_args_ok(epilogue, extra, m, n, k)) return cudaErrorInvalidValue;
    if (m == 0 || n == 0) return cudaSuccess;
    // 16-byte packets need every row of x and of the weights to start on a 16-byte boundary
    const bool vec = k % VEC == 0 && aligned16(x) && aligned16(w) && (epilogue != 2 || aligned16(extra));
    switch (epilogue) {
        case 0:
            linear_epi<T, 0>(vec, out, x, w, extra, m, n, k, stream);
            break;
        case 1:
            linear_epi<T, 1>(vec, out, x, w, extra, m, n, k, stream);
            break;
        default:
            linear_epi<T, 2>(vec, out, x, w, extra, m, n, k, stream);
            break;
    }
    return cudaGetLastError();
}

// kiln_rmsnorm_linear: the GEMV with the RMSNorm prologue (m <= MAX_GEMV_M; a prefill's m is the
// GEMM's, which normalizes nothing: kiln_rmsnorm, then kiln_linear)
template <typename T, int EPI, typename W>
static void rmsnorm_gemv(bool vec, T* out, const T* x, const T* g, float eps, const W& w, const T* extra,
                         int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
    constexpr int VEC = 16 / sizeof(T);
    if (vec) {
        gemv_for_m<T, VEC, EPI, true>(out, x, w, extra, m, n, k, stream, Prologue{g, eps});
    } else {
        gemv_for_m<T, 1, EPI, true>(out, x, w, extra, m, n, k, stream, Prologue{g, eps});
    }
}

template <typename T>
static cudaError_t rmsnorm_linear(int epilogue, T* out, const T* x, const T* g, float eps, const T* w, const T* extra,
                                  int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
    constexpr int64_t VEC = 16 / sizeof(T);
    if (!linear_args_ok(epilogue, extra, m, n, k) || m > MAX_GEMV_M || g == nullptr || !(eps >= 0.0f) || k < 1) {
        return cudaErrorInvalidValue;
    }
    if (m == 0 || n == 0) return cudaSuccess;
    const bool vec =
        k % VEC == 0 && aligned16(x) && aligned16(w) && aligned16(g) && (epilogue != 2 || aligned16(extra));
    switch (epilogue) {
        case 0:
            rmsnorm_gemv<T, 0>(vec, out, x, g, eps, Single<T>{w}, extra, m, n, k, stream);
            break;
        case 1:
            rmsnorm_gemv<T, 1>(vec, out, x, g, eps, Single<T>{w}, extra, m, n, k, stream);
            break;
        default:
            rmsnorm_gemv<T, 2>(vec, out, x, g, eps, Single<T>{w}, extra, m, n, k, stream);
            break;
    }
    return cudaGetLastError();
}

// kiln_rmsnorm_linear_qkv: the decode step's three projections of one normalized row as one GEMV
// over the stacked weights, out (m, nq + nk + nv).
template <typename T>
static cudaError_t rmsnorm_linear_qkv(T* out, const T* x, const T* g, float eps, const T* wq, const T* wk, const T* wv,
                                      int64_t m, int64_t nq, int64_t nk, int64_t nv, int64_t k, cudaStream_t stream) {
    constexpr int64_t VEC = 16 / sizeof(T);
    if (nq < 0 || nk < 0 || nv < 0 || wq == nullptr || wk == nullptr || wv == nullptr) return cudaErrorInvalidValue;
    const int64_t n = nq + nk + nv;
    if (!linear_args_ok(0, static_cast<const T*>(nullptr), m, n, k) || m > MAX_GEMV_M || g == nullptr ||
        !(eps >= 0.0f) || k < 1) {
        return cudaErrorInvalidValue;
    }
    if (m == 0 || n == 0) return cudaSuccess;
    const bool vec = k % VEC == 0 && aligned16(x) && aligned16(g) && aligned16(wq) && aligned16(wk) && aligned16(wv);
    rmsnorm_gemv<T, 0>(vec, out, x, g, eps, Stacked<T>{wq, wk, wv, nq, nq + nk}, nullptr, m, n, k, stream);
    return cudaGetLastError();
}

COURSE_API cudaError_t kiln_linear_f32(int epilogue, float* out, const float* x, const float* w, const float* extra,
                                       int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
    return linear<float>(epilogue, out, x, w, extra, m, n, k, stream);
}

COURSE_API cudaError_t kiln_linear_f16(int epilogue, __half* out, const __half* x, const __half* w,
                                       const __half* extra, int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
    return linear<__half>(epilogue, out, x, w, extra, m, n, k, stream);
}

COURSE_API cudaError_t kiln_linear_bf16(int epilogue, __nv_bfloat16* out, const __nv_bfloat16* x,
                                        const __nv_bfloat16* w, const __nv_bfloat16* extra, int64_t m, int64_t n,
                                        int64_t k, cudaStream_t stream) {
    return linear<__nv_bfloat16>(epilogue, out, x, w, extra, m, n, k, stream);
}

#define KILN_RMSNORM_LINEAR(SUFFIX, T)                                                                               \
    COURSE_API cudaError_t kiln_rmsnorm_linear_##SUFFIX(int epilogue, T* out, const T* x, const T* norm_w, float eps, \
                                                        const T* w, const T* extra, int64_t m, int64_t n, int64_t k,  \
                                                        cudaStream_t stream) {                                         \
        return rmsnorm_linear<T>(epilogue, out, x, norm_w, eps, w, extra, m, n, k, stream);                          \
    }

#define KILN_RMSNORM_LINEAR_QKV(SUFFIX, T)                                                                          \
    COURSE_API cudaError_t kiln_rmsnorm_linear_qkv_##SUFFIX(T* out, const T* x, const T* norm_w, float eps,           \
                                                            const T* wq, const T* wk, const T* wv, int64_t m,         \
                                                            int64_t nq, int64_t nk, int64_t nv, int64_t k,             \
                                                            cudaStream_t stream) {                                     \
        return rmsnorm_linear_qkv<T>(out, x, norm_w, eps, wq, wk, wv, m, nq, nk, nv, k, stream);                     \
    }

KILN_RMSNORM_LINEAR(f32, float)
KILN_RMSNORM_LINEAR(f16, __half)
KILN_RMSNORM_LINEAR(bf16, __nv_bfloat16)

KILN_RMSNORM_LINEAR_QKV(f32, float)
KILN_RMSNORM_LINEAR_QKV(f16, __half)
KILN_RMSNORM_LINEAR_QKV(bf16, __nv_bfloat16)

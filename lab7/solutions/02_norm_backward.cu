// Lab 7 · Task 02 — Layer norm and RMSNorm backward: dx per row, dweight (and dbias) reduced over
//                   the rows in a fixed order
//
// Implement: layernorm_backward_{f32,bf16} and rmsnorm_backward_{f32,bf16}: the gradients of a
//            normalisation layer, given the forward pass's saved row statistics. Two launches: the
//            first gives each block a slice of rows, writes dx row by row and keeps, per column,
//            the slice's sums of dy * xhat (and of dy) in registers, then writes them to `scratch`
//            as one partial row per block; the second adds the partial rows, in a fixed order,
//            into dweight (and dbias). No atomics: the same inputs give the same bits every run.
// Contract:  dy, x: DEVICE (rows, C) row-major and contiguous, float32 (the _f32 entries) or
//            bfloat16 (the _bf16 entries), 4-byte (2-byte) aligned. weight: DEVICE (C,) of that
//            dtype. mean (layer norm only) and rstd: DEVICE float32 (rows,), as the forward pass
//            saved them (rstd = 1 / sqrt(var + eps); the kernel never recomputes them).
//            dx: DEVICE (rows, C) of the dtype. dweight, dbias (layer norm only): DEVICE float32
//            (C,), OVERWRITTEN (not accumulated into: whatever they held is ignored).
//            scratch: DEVICE float32, 16-byte aligned, `scratch_floats` floats, its content on
//            entry ignored and on return unspecified; the kernel needs at most
//            norm_scratch_floats(rows, C, rms) floats (given below: one partial row of C floats per
//            block, at most MAX_PARTIALS blocks, for dweight and for dbias) and a smaller
//            scratch_floats returns cudaErrorInvalidValue. 1 <= rows, 1 <= C <= MAX_C (16384, the
//            widest hidden size of today's models); rows * C may pass 2^31 (64-bit offsets).
//            With xhat = (x - mean) * rstd (RMSNorm: x * rstd) and g = dy * weight, per row:
//              dx      = rstd * (g - mean_C(g) - xhat * mean_C(g * xhat))   (RMSNorm: no mean_C(g))
//              dweight = sum over rows of dy * xhat;   dbias = sum over rows of dy
//            Arithmetic in float32 for both dtypes, dx rounded once at the store. Deterministic:
//            the same inputs give bit-identical outputs on every call. No buffer overlaps another;
//            the inputs are not modified. Everything on `stream`; no synchronisation, no
//            allocation. Returns cudaErrorInvalidValue for sizes outside the contract, else the
//            launch error.
// Test:      make test-lab7 TASK=02

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include <cuda_bf16.h>

#include "course.h"

[[maybe_unused]] constexpr int WARP = 32;  // threads of a warp
[[maybe_unused]] constexpr unsigned FULL = 0xffffffffu;  // every lane takes part in a shuffle
[[maybe_unused]] constexpr int MAX_C = 16384;  // LLaMA 3 405B's hidden size
[[maybe_unused]] constexpr int MAX_PARTIALS = 512;  // the most partial rows the scratch must hold, per reduced vector

// ---------------------------------------------------------------------------------------------
// Given: a float from either element type and back; Vec<T, W>, W consecutive elements read or
// written at once (W = 16 / sizeof(T): one 16-byte access, which needs a 16-byte-aligned address;
// W = 1: one element); and the scratch the contract promises.
// ---------------------------------------------------------------------------------------------

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
    return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}

template <typename T, int W>
struct alignas(sizeof(T) * W) Vec {
    T v[W];
};

// Floats of scratch a call may use: a partial row of C floats for each of at most MAX_PARTIALS
// slices of rows, for dweight, and as many again for dbias (layer norm).
[[maybe_unused]] static size_t norm_scratch_floats(int rows, int C, bool rms) {
    return (rms ? 1 : 2) * (size_t)C * (size_t)std::min(rows, MAX_PARTIALS);
}

// TODO(lab7/02) begin: sum a pair of floats over a team of threads (a warp, or the whole block) so that every thread of the team gets the same bits: butterfly shuffles in the warp, then one pair per warp through shared memory; the block is reused row after row, so think about when a warp may overwrite a slot another warp has not read yet; see the chapter's section "Task 02: norm backward"; about 25 lines.
__device__ __forceinline__ float2 warp_sum(float2 v) {
#pragma unroll
    for (int offset = WARP / 2; offset > 0; offset /= 2) {
        v.x += __shfl_xor_sync(FULL, v.x, offset);
        v.y += __shfl_xor_sync(FULL, v.y, offset);
    }
    return v;
}

// (sum of v.x, sum of v.y) over the team, in every thread of it. A block-wide team goes through
// `slots`, two sets used in turn (`parity`): a warp writes the set of row i + 2 only after the
// barrier of row i + 1, which no warp reaches before it has read row i's set.
template <int TEAM>
__device__ __forceinline__ float2 team_sum(float2 v, float2 (*slots)[TEAM / WARP], int parity) {
    v = warp_sum(v);
    if constexpr (TEAM == WARP) {
        return v;
    } else {
        const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
        if (lane == 0) slots[parity][warp] = v;
        __syncthreads();
        v = lane < TEAM / WARP ? slots[parity][lane] : make_float2(0.0f, 0.0f);
        return warp_sum(v);
    }
}
// TODO(lab7/02) end

// TODO(lab7/02) begin: the first kernel: block b owns a slice of rows and a team (a warp, or the whole block) handles one row at a time: pass 1 reads the row's dy, x and weight (Vecs of W elements, lane + k * TEAM for k < K) and forms sum(g) and sum(g * xhat) while adding dy * xhat and dy into per-thread column sums in registers; team_sum; pass 2 reads the row again and writes dx. At the end the teams' column sums are added in a fixed order and the block writes its partial rows to scratch; see the chapter's section "Task 02: norm backward"; about 90 lines; try C = 1, 7, 771 (scalar path) and 768, 4096 (16-byte path), rows 1 and 3, and 16384 rows.
// Blocks an SM must hold at once, which caps the registers a thread may use (65536 per SM): 3
// blocks of 8 warps (85 registers), 4 of 256 threads (64), 1 of 1024 (64).
template <int TEAM, int THREADS>
constexpr int MIN_BLOCKS = TEAM == WARP ? 3 : 1024 / THREADS;

// dy, x (rows, C), weight (C,), mean, rstd (rows,) -> dx (rows, C), and
// partials (2 or 1, gridDim.x, C): block b's sums over its rows of dy * xhat (then of dy).
// Thread `lane` of a team owns the columns of Vecs lane + k * TEAM (k < K), the same in every
// row, so its column sums stay in registers; TEAM * K * W >= C.
template <typename T, bool RMS, int W, int TEAM, int THREADS, int K>
__global__ void __launch_bounds__(THREADS, MIN_BLOCKS<TEAM, THREADS>)
    norm_backward_rows(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ weight,
                       const float* __restrict__ mean, const float* __restrict__ rstd, T* __restrict__ dx,
                       float* __restrict__ partials, int rows, int C, int rows_per_block) {
    constexpr int TEAMS = THREADS / TEAM;
    constexpr int SUMS = RMS ? 1 : 2;  // dweight, and dbias for layer norm
    using V = Vec<T, W>;
    __shared__ float2 slots[2][TEAM / WARP];
    __shared__ float columns[TEAMS > 1 ? SUMS * TEAM * K * W : 1];

    const int lane = threadIdx.x % TEAM, team = threadIdx.x / TEAM;
    const int vecs = C / W;  // W divides C on this path
    const float inv_c = 1.0f / (float)C;
    const int first = blockIdx.x * rows_per_block;
    const int last = first + min(rows_per_block, rows - first);  // no int overflow near rows = 2^31

    float dw[K][W], db[K][W];
#pragma unroll
    for (int k = 0; k < K; ++k)
#pragma unroll
        for (int e = 0; e < W; ++e) dw[k][e] = db[k][e] = 0.0f;

    int parity = 0;
    for (int r = first + team; r < last; r += TEAMS, parity ^= 1) {
        const size_t base = (size_t)r * C;
        const V* dyr = reinterpret_cast<const V*>(dy + base);
        const V* xr = reinterpret_cast<const V*>(x + base);
        const V* wv = reinterpret_cast<const V*>(weight);
        const float mu = RMS ? 0.0f : mean[r];
        const float rs = rstd[r];

        // pass 1: sum(g) and sum(g * xhat) of the row; the column sums of dy * xhat and dy
        float2 s = make_float2(0.0f, 0.0f);
#pragma unroll
        for (int k = 0; k < K; ++k) {
            const int i = lane + k * TEAM;
            if (i < vecs) {
                const V d = dyr[i], xv = xr[i], w = wv[i];
#pragma unroll
                for (int e = 0; e < W; ++e) {
                    const float dye = to_float(d.v[e]);
                    const float xh = (to_float(xv.v[e]) - mu) * rs;
                    const float g = dye * to_float(w.v[e]);
                    s.x += g;
                    s.y += g * xh;
                    dw[k][e] += dye * xh;
                    db[k][e] += dye;
                }
            }
        }
        s = team_sum<TEAM>(s, slots, parity);
        const float a = RMS ? 0.0f : s.x * inv_c;
        const float b = s.y * inv_c;

        // pass 2: the row again (from L1 or L2, read a moment ago), dx written once
        V* dxr = reinterpret_cast<V*>(dx + base);
#pragma unroll
        for (int k = 0; k < K; ++k) {
            const int i = lane + k * TEAM;
            if (i < vecs) {
                const V d = dyr[i], xv = xr[i], w = wv[i];
                V out;
#pragma unroll
                for (int e = 0; e < W; ++e) {
                    const float xh = (to_float(xv.v[e]) - mu) * rs;
                    const float g = to_float(d.v[e]) * to_float(w.v[e]);
                    out.v[e] = from_float<T>(rs * (g - a - xh * b));
                }
                dxr[i] = out;
            }
        }
    }

    // the block's partial rows: partials[0][blockIdx.x][c] (dweight), partials[1][blockIdx.x][c] (dbias)
    float* pw = partials + (size_t)blockIdx.x * C;
    float* pb = partials + ((size_t)gridDim.x + blockIdx.x) * C;
    if constexpr (TEAMS == 1) {
#pragma unroll
        for (int k = 0; k < K; ++k) {
            const int i = lane + k * TEAM;
            if (i < vecs) {
#pragma unroll
                for (int e = 0; e < W; ++e) {
                    pw[i * W + e] = dw[k][e];
                    if constexpr (!RMS) pb[i * W + e] = db[k][e];
                }
            }
        }
    } else {
        // the teams add their column sums in shared memory one after another, team 0 first: a
        // fixed order, so the partial row has the same bits in every run
        float* cw = columns;
        float* cb = columns + (RMS ? 0 : TEAM * K * W);
        for (int t = 0; t < TEAMS; ++t) {
            if (team == t) {
#pragma unroll
                for (int k = 0; k < K; ++k) {
                    const int i = lane + k * TEAM;
                    if (i < vecs) {
#pragma unroll
                        for (int e = 0; e < W; ++e) {
                            const int c = i * W + e;
                            cw[c] = t == 0 ? dw[k][e] : cw[c] + dw[k][e];
                            if constexpr (!RMS) cb[c] = t == 0 ? db[k][e] : cb[c] + db[k][e];
                        }
                    }
                }
            }
            __syncthreads();
        }
        for (int c = threadIdx.x; c < C; c += THREADS) {
            pw[c] = cw[c];
            if constexpr (!RMS) pb[c] = cb[c];
        }
    }
}
// TODO(lab7/02) end

// TODO(lab7/02) begin: the second kernel: out[c] = the sum over the partial rows b of partials[b][c], in an order fixed by the code (not by the timing): a block of 32 columns x 32 threads down the partial rows, each thread one strided chain, then the 32 chains of a column added by a fixed shuffle tree; blockIdx.y picks dweight or dbias; about 25 lines.
// partials (gridDim.y, parts, C) -> out0 (C,) (and out1 (C,) for blockIdx.y == 1); block (32, 32).
__global__ void __launch_bounds__(WARP * WARP)
    sum_partials(const float* __restrict__ partials, float* __restrict__ out0, float* __restrict__ out1, int parts,
                 int C) {
    __shared__ float tile[WARP][WARP + 1];  // +1: the transposed read below hits 32 banks
    const int tx = threadIdx.x, ty = threadIdx.y;
    const float* src = partials + (size_t)blockIdx.y * parts * C;
    const int c = blockIdx.x * WARP + tx;
    float s = 0.0f;
    if (c < C)
        for (int b = ty; b < parts; b += WARP) s += src[(size_t)b * C + c];
    tile[ty][tx] = s;
    __syncthreads();
    // warp ty adds the 32 chains of column blockIdx.x * 32 + ty
    float v = tile[tx][ty];
#pragma unroll
    for (int offset = WARP / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(FULL, v, offset);
    const int col = blockIdx.x * WARP + ty;
    if (tx == 0 && col < C) (blockIdx.y == 0 ? out0 : out1)[col] = v;
}
// TODO(lab7/02) end

// TODO(lab7/02) begin: the launches for one (T, RMS, W): the first kernel on as many blocks as the GPU holds at once (at most MAX_PARTIALS, at most one per row, none without rows), with a warp per row up to C = 768 (8 rows of a 256-thread block in flight), a 256-thread block per row up to 4096 and 1024 threads up to MAX_C, K = (columns a thread owns) / W; then the second kernel on the partial rows; about 35 lines.
// One launch of the first kernel. Its grid is one wave: as many blocks as the GPU holds at once
// (rows split evenly among them), so no SM waits on a second, partial wave; *parts says how many.
template <typename T, bool RMS, int W, int TEAM, int THREADS, int K>
static cudaError_t launch_rows(const T* dy, const T* x, const T* weight, const float* mean, const float* rstd, T* dx,
                               float* partials, int rows, int C, int* parts, cudaStream_t stream) {
    const auto kernel = norm_backward_rows<T, RMS, W, TEAM, THREADS, K>;
    static const int per_sm = [] {  // the kernel's blocks per SM: a property of the build, asked once
        int n = 1;
        (void)cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, norm_backward_rows<T, RMS, W, TEAM, THREADS, K>,
                                                            THREADS, 0);
        return std::max(n, 1);
    }();
    int device = 0, sms = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    const int wave = std::max(1, std::min(MAX_PARTIALS, sms * per_sm));
    const int rows_per_block = (rows + wave - 1) / wave;
    *parts = (rows + rows_per_block - 1) / rows_per_block;  // none empty: (parts - 1) * rows_per_block < rows
    kernel<<<*parts, THREADS, 0, stream>>>(dy, x, weight, mean, rstd, dx, partials, rows, C, rows_per_block);
    return cudaGetLastError();
}

template <typename T, bool RMS, int W>
static cudaError_t launch(const T* dy, const T* x, const T* weight, const float* mean, const float* rstd, T* dx,
                          float* dweight, float* dbias, float* scratch, int rows, int C, cudaStream_t stream) {
    int parts = 0;
    if (C <= 768) {  // a warp per row, 24 columns per thread: GPT-2 small's 768 in one sweep of a warp
        CUDA_CHECK((launch_rows<T, RMS, W, WARP, 256, 24 / W>(dy, x, weight, mean, rstd, dx, scratch, rows, C, &parts,
                                                               stream)));
    } else if (C <= 4096) {  // a 256-thread block per row, 16 columns per thread
        CUDA_CHECK((launch_rows<T, RMS, W, 256, 256, 16 / W>(dy, x, weight, mean, rstd, dx, scratch, rows, C, &parts,
                                                              stream)));
    } else {  // 1024 threads per row, 16 columns each: up to MAX_C
        CUDA_CHECK((launch_rows<T, RMS, W, 1024, 1024, 16 / W>(dy, x, weight, mean, rstd, dx, scratch, rows, C,
                                                                &parts, stream)));
    }
    const dim3 block(WARP, WARP), grid((unsigned)((C + WARP - 1) / WARP), RMS ? 1 : 2);
    sum_partials<<<grid, block, 0, stream>>>(scratch, dweight, dbias, parts, C);
    CUDA_CHECK(cudaGetLastError());
    return cudaSuccess;
}
// TODO(lab7/02) end

template <typename T, bool RMS>
static cudaError_t norm_backward(const T* dy, const T* x, const T* weight, const float* mean, const float* rstd,
                                 T* dx, float* dweight, float* dbias, float* scratch, size_t scratch_floats, int rows,
                                 int C, cudaStream_t stream) {
    // TODO(lab7/02) begin: refuse sizes outside the contract (a scratch smaller than norm_scratch_floats too), then take the 16-byte path (W = 16 / sizeof(T)) where W divides C and dy, x, weight and dx all sit on the 16-byte grid, else W = 1; about 10 lines.
    if (rows < 1 || C < 1 || C > MAX_C || scratch == nullptr || scratch_floats < norm_scratch_floats(rows, C, RMS))
        return cudaErrorInvalidValue;
    constexpr int N = 16 / sizeof(T);
    const auto on_grid = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
    if (C % N == 0 && on_grid(dy) && on_grid(x) && on_grid(weight) && on_grid(dx))
        return launch<T, RMS, N>(dy, x, weight, mean, rstd, dx, dweight, dbias, scratch, rows, C, stream);
    return launch<T, RMS, 1>(dy, x, weight, mean, rstd, dx, dweight, dbias, scratch, rows, C, stream);  // off the grid
    //~ return cudaErrorNotYetImplemented;
    // TODO(lab7/02) end
}

COURSE_API cudaError_t layernorm_backward_f32(const float* dy, const float* x, const float* weight, const float* mean,
                                              const float* rstd, float* dx, float* dweight, float* dbias,
                                              float* scratch, size_t scratch_floats, int rows, int C,
                                              cudaStream_t stream) {
    return norm_backward<float, false>(dy, x, weight, mean, rstd, dx, dweight, dbias, scratch, scratch_floats, rows,
                                       C, stream);
}

COURSE_API cudaError_t layernorm_backward_bf16(const __nv_bfloat16* dy, const __nv_bfloat16* x,
                                               const __nv_bfloat16* weight, const float* mean, const float* rstd,
                                               __nv_bfloat16* dx, float* dweight, float* dbias, float* scratch,
                                               size_t scratch_floats, int rows, int C, cudaStream_t stream) {
    return norm_backward<__nv_bfloat16, false>(dy, x, weight, mean, rstd, dx, dweight, dbias, scratch, scratch_floats,
                                               rows, C, stream);
}

COURSE_API cudaError_t rmsnorm_backward_f32(const float* dy, const float* x, const float* weight, const float* rstd,
                                            float* dx, float* dweight, float* scratch, size_t scratch_floats, int rows,
                                            int C, cudaStream_t stream) {
    return norm_backward<float, true>(dy, x, weight, nullptr, rstd, dx, dweight, nullptr, scratch, scratch_floats,
                                      rows, C, stream);
}

COURSE_API cudaError_t rmsnorm_backward_bf16(const __nv_bfloat16* dy, const __nv_bfloat16* x,
                                             const __nv_bfloat16* weight, const float* rstd, __nv_bfloat16* dx,
                                             float* dweight, float* scratch, size_t scratch_floats, int rows, int C,
                                             cudaStream_t stream) {
    return norm_backward<__nv_bfloat16, true>(dy, x, weight, nullptr, rstd, dx, dweight, nullptr, scratch,
                                              scratch_floats, rows, C, stream);
}

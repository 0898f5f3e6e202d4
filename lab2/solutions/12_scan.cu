// Lab 2 · Task 12 — The scan ladder: three ways to compute prefix sums
//
// Implement: the three rungs of the chapter's scan ladder, each an inclusive prefix sum
//            out[i] = in[0] + ... + in[i] over the whole array.
//            Rungs 1 and 2 scan in three phases: a kernel scans every block's tile in shared
//            memory and writes the tile's total, the totals are scanned (by the same code, one
//            level up), and add_block_offsets_kernel adds to every tile the sum of the tiles
//            before it. You write scan_hillis_steele_kernel (rung 1: the naive doubling scan,
//            double-buffered, one element per thread), scan_blelloch_kernel (rung 2: the
//            work-efficient up-sweep and down-sweep, two elements per thread) and
//            add_block_offsets_kernel; the host code that chains the phases is given.
//            Rung 3 reads and writes every element once, in one kernel: tile_scan (32 elements
//            per thread in registers, warp shuffles, the warps' totals), look_back (the sum of
//            all tiles before this one, from what earlier blocks published) and the body of
//            scan_single_pass_kernel. Its host code, the tile loads and stores and the
//            publish/wait helpers are given.
// Contract:  in is a DEVICE float32 array of n elements (read-only; 4-byte aligned, not
//            necessarily 16-byte aligned), out a DEVICE float32 array of n elements that does
//            not overlap in. 1 <= n < 2^32. On return (after synchronization)
//            out[i] = in[0] + ... + in[i], added in float32 (rung 3 carries the sums of whole
//            tiles in float64). Kernels run on the default stream; each entry point returns the
//            first error met and does not synchronize (except when a scratch buffer grows).
// Test:      make test-lab2 TASK=12

#include "course.h"

#include <cstddef>
#include <cstdint>

constexpr int WARP = 32;

// Shared-memory index with one padding word after every 32. Threads that access words 32 (or a
// multiple of 32) apart hit the same bank; with the padding, word i sits in bank (i + i / 32) % 32,
// so such strides spread over the banks. Used by rung 2's tree (optional) and rung 3's tile.
__device__ __forceinline__ unsigned padded(unsigned i) { return i + i / WARP; }

// ---------------------------------------------------------------------------------------------
// Rungs 1 and 2: scan each tile, scan the tiles' totals, add them back.
// A block-scan kernel scans its tile of `in` (elements past `count` count as 0) into `out`
// (inclusive, local to the tile) and, when block_sums is not null, writes the tile's total to
// block_sums[blockIdx.x].
// ---------------------------------------------------------------------------------------------

constexpr int HS_THREADS = 512;  // rung 1: one element per thread, tiles of 512
constexpr int BL_THREADS = 512;  // rung 2: two elements per thread, tiles of 1024
constexpr int BL_TILE = 2 * BL_THREADS;
constexpr int ADD_THREADS = 256;

// Rung 1 · Hillis–Steele. At step k every element adds the one 2^k places before it: after
// log2(512) = 9 steps element t holds the sum of elements 0..t of its tile. O(T log T) additions.
__global__ void scan_hillis_steele_kernel(const float* __restrict__ in, float* __restrict__ out,
                                          float* __restrict__ block_sums, size_t count) {
    // TODO(lab2/12) begin: the tile's inclusive scan into out (elements past count are not written) and, when block_sums is not null, the tile's total into block_sums[blockIdx.x]: one element per thread in shared memory; at each step (offset 1, 2, 4, ... below blockDim.x) every thread adds the element offset places before its own, reading one buffer and writing the other, so no thread overwrites a value another still has to read; see the chapter's scan ladder, rung 1; about 15 lines; try n = 1, 33, 512 and 513.
    __shared__ float buf[2][HS_THREADS];  // each step reads buf[src] and writes buf[1 - src]
    const unsigned t = threadIdx.x;
    const size_t i = (size_t)blockIdx.x * blockDim.x + t;
    buf[0][t] = i < count ? in[i] : 0.0f;
    __syncthreads();
    unsigned src = 0;
    for (unsigned offset = 1; offset < blockDim.x; offset *= 2) {
        const float mine = buf[src][t];
        buf[1 - src][t] = t >= offset ? mine + buf[src][t - offset] : mine;
        src = 1 - src;
        __syncthreads();
    }
    if (i < count) out[i] = buf[src][t];
    if (block_sums != nullptr && t == blockDim.x - 1) block_sums[blockIdx.x] = buf[src][t];
    // TODO(lab2/12) end
}

// Rung 2 · Blelloch. An up-sweep builds the tree of partial sums in place, a down-sweep turns it
// into the exclusive scan: 2 (T - 1) additions for the whole tile instead of T log2 T.
__global__ void scan_blelloch_kernel(const float* __restrict__ in, float* __restrict__ out,
                                     float* __restrict__ block_sums, size_t count) {
    // TODO(lab2/12) begin: the same result as rung 1 for a tile of 2 * blockDim.x elements, each thread loading two of them blockDim.x apart; up-sweep (each level adds the left half's sum into the right half's last element, half as many threads as the level before), keep the root (the tile's total), set it to 0, down-sweep (each node hands its value to its left child and its value plus the left child's old value to its right child): that gives the exclusive scan, and each element added back gives the inclusive one; padded() avoids the tree's bank conflicts; see the chapter's scan ladder, rung 2; about 35 lines; try n = 1, 2, 1024 and 1025.
    __shared__ float tree[BL_TILE + BL_TILE / WARP];
    const unsigned t = threadIdx.x, tile = 2 * blockDim.x;
    const size_t base = (size_t)blockIdx.x * tile;
    const unsigned ai = t, bi = t + blockDim.x;  // two elements blockDim.x apart: coalesced loads
    const float a = base + ai < count ? in[base + ai] : 0.0f;
    const float b = base + bi < count ? in[base + bi] : 0.0f;
    tree[padded(ai)] = a;
    tree[padded(bi)] = b;
    // up-sweep: after the level of stride s, the element at every (2s)-th position from 2s - 1 on
    // holds the sum of the 2s elements that end there
    unsigned stride = 1;
    for (unsigned active = tile / 2; active > 0; active /= 2, stride *= 2) {
        __syncthreads();
        if (t < active) {
            const unsigned right = stride * (2 * t + 2) - 1;
            tree[padded(right)] += tree[padded(right - stride)];
        }
    }
    // thread 0 made the last (root) addition itself: it can read the root without a barrier
    if (t == 0) {
        if (block_sums != nullptr) block_sums[blockIdx.x] = tree[padded(tile - 1)];
        tree[padded(tile - 1)] = 0.0f;  // the identity at the root turns the scan exclusive
    }
    // down-sweep: stride goes back from tile / 2 to 1
    for (unsigned active = 1; active < tile; active *= 2) {
        stride /= 2;
        __syncthreads();
        if (t < active) {
            const unsigned right = stride * (2 * t + 2) - 1, left = right - stride;
            const float from_left = tree[padded(left)];
            tree[padded(left)] = tree[padded(right)];
            tree[padded(right)] += from_left;
        }
    }
    __syncthreads();
    // tree holds the exclusive scan: adding each element back makes it inclusive
    if (base + ai < count) out[base + ai] = tree[padded(ai)] + a;
    if (base + bi < count) out[base + bi] = tree[padded(bi)] + b;
    // TODO(lab2/12) end
}

// Phase 3 of rungs 1 and 2. offsets is the inclusive scan of the tiles' totals, so offsets[b - 1]
// is the sum of every element before tile b. Launched with one block per tile from tile 1 on.
__global__ void add_block_offsets_kernel(float* __restrict__ out, const float* __restrict__ offsets,
                                         size_t count, unsigned tile) {
    // TODO(lab2/12) begin: add to every element of tile blockIdx.x + 1 (tile elements, tile may be larger than blockDim.x, the last tile may be partial) the sum of all the tiles before it; see the chapter's scan ladder, the three phases; about 6 lines; try n = 513, 1025 and 2^20 + 3.
    const size_t b = (size_t)blockIdx.x + 1;  // tile 0 has nothing before it
    const float offset = offsets[b - 1];
    for (unsigned j = threadIdx.x; j < tile; j += blockDim.x) {
        const size_t i = b * tile + j;
        if (i < count) out[i] += offset;
    }
    // TODO(lab2/12) end
}

// Device buffers kept from call to call. One grows when a larger n needs more: only the first
// call at a new largest size allocates, so the timed calls (after warm-up) pay for no cudaMalloc.
// Before the old buffer is freed the device is synchronized, because kernels still queued may be
// using it. New memory is zeroed, which rung 3's flags rely on.
struct Scratch {
    void* data = nullptr;
    size_t bytes = 0;
};

static cudaError_t reserve(Scratch& scratch, size_t bytes, void** buffer) {
    if (bytes > scratch.bytes) {
        if (scratch.data != nullptr) {
            CUDA_CHECK(cudaDeviceSynchronize());
            CUDA_CHECK(cudaFree(scratch.data));
            scratch.data = nullptr;
            scratch.bytes = 0;
        }
        CUDA_CHECK(cudaMalloc(&scratch.data, bytes));
        CUDA_CHECK(cudaMemset(scratch.data, 0, bytes));
        scratch.bytes = bytes;
    }
    *buffer = scratch.data;
    return cudaSuccess;
}

using BlockScan = void (*)(const float*, float*, float*, size_t);

struct Rung {
    BlockScan kernel;
    unsigned threads;  // per block
    unsigned tile;     // elements per block
};

// Floats of scratch a scan of `count` values needs: every level with more than one tile keeps
// the tiles' totals and their scan; the level above works on the totals.
static size_t scratch_floats(size_t count, unsigned tile) {
    size_t floats = 0;
    for (size_t tiles = (count + tile - 1) / tile; tiles > 1; tiles = (tiles + tile - 1) / tile)
        floats += 2 * tiles;
    return floats;
}

// out = inclusive scan of in[0..count). One tile: one block does it all. More: scan each tile and
// keep the totals, scan the totals the same way (a level up: tile times fewer values), add them
// back. For n < 2^32 there are at most 4 levels.
static cudaError_t scan_level(const Rung& rung, const float* in, float* out, size_t count, float* scratch) {
    const size_t tiles = (count + rung.tile - 1) / rung.tile;
    if (tiles == 1) {
        rung.kernel<<<1, rung.threads>>>(in, out, nullptr, count);
        return cudaGetLastError();
    }
    float* totals = scratch;           // (tiles,) the sum of each tile
    float* offsets = scratch + tiles;  // (tiles,) their inclusive scan
    rung.kernel<<<(unsigned)tiles, rung.threads>>>(in, out, totals, count);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(scan_level(rung, totals, offsets, tiles, scratch + 2 * tiles));
    add_block_offsets_kernel<<<(unsigned)(tiles - 1), ADD_THREADS>>>(out, offsets, count, rung.tile);
    return cudaGetLastError();
}

static Scratch partial_sums;  // rungs 1 and 2

static cudaError_t scan_three_phase(const Rung& rung, const float* in, float* out, size_t n) {
    float* scratch = nullptr;
    const size_t floats = scratch_floats(n, rung.tile);
    if (floats > 0) {
        void* buffer = nullptr;
        CUDA_CHECK(reserve(partial_sums, floats * sizeof(float), &buffer));
        scratch = static_cast<float*>(buffer);
    }
    return scan_level(rung, in, out, n, scratch);
}

// ---------------------------------------------------------------------------------------------
// Rung 3: one pass. Each block scans a tile of 4096 elements, learns the sum of all the tiles
// before it from what the earlier blocks published (decoupled look-back), and writes its tile.
// ---------------------------------------------------------------------------------------------

constexpr int SP_THREADS = 128;
constexpr int ITEMS = 32;                 // consecutive elements per thread, scanned in registers
constexpr int TILE = SP_THREADS * ITEMS;  // 4096 elements per block
constexpr int SP_WARPS = SP_THREADS / WARP;
// Blocks per SM the compiler must leave room for: it caps registers at 65536 / (8 * 128) = 64 a
// thread. A block waits in its look-back with its loads done; the SM's other blocks keep the
// memory busy meanwhile, so more of them at once made the rung faster (see the chapter).
constexpr int SP_MIN_BLOCKS = 8;

// What tile t publishes for the tiles after it, in one 16-byte word: its state and a value.
// state 2 * epoch: value is the tile's own total (its aggregate); 2 * epoch + 1: value is the sum
// of every element up to the end of the tile (its inclusive prefix). epoch counts the calls, so a
// descriptor left by an earlier call reads as "nothing yet" and they never need clearing. Sums of
// whole tiles are kept in float64: see the chapter for why (error, and run-to-run reproducibility).
struct __align__(16) TileDescriptor {
    unsigned long long state;
    double value;
};
struct TileStatus {
    unsigned* ticket;        // the next tile to hand out
    TileDescriptor* tiles;   // (tiles,)
};

// Hands out tiles in the order blocks start (0, 1, 2, ...), whatever their blockIdx. A block then
// only ever waits for tiles held by blocks that are already running, which will finish: with
// blockIdx order a block could wait for a block the hardware has not started, and that block
// for a free SM, forever. The block that draws the last ticket resets the counter for the next
// call (every other block has drawn its ticket by then). Called by every thread.
__device__ unsigned draw_tile(TileStatus status) {
    __shared__ unsigned tile;
    if (threadIdx.x == 0) {
        tile = atomicAdd(status.ticket, 1u);
        if (tile == gridDim.x - 1) atomicExch(status.ticket, 0u);
    }
    __syncthreads();
    return tile;
}

// Publishes state and value with ONE 16-byte store, and reads them with one 16-byte load: a
// reader that sees the state sees the value written with it, so neither side needs a fence, and
// a waiting lane pays one trip to L2 per look, not two (the flag, then the value behind a fence).
// volatile: every access goes to L2, never a stale copy in L1 or a register. The hardware
// performs an aligned 16-byte access by one thread as one transaction; CUB's single-pass scan
// relies on the same for its 16-byte descriptors (the PTX memory model itself promises
// indivisibility only per 8-byte element).
__device__ __forceinline__ void publish(TileDescriptor* d, unsigned long long state, double value) {
    asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(d), "l"(state), "l"(__double_as_longlong(value))
                 : "memory");
}

__device__ __forceinline__ TileDescriptor read_descriptor(const TileDescriptor* d) {
    unsigned long long state, bits;
    asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(state), "=l"(bits) : "l"(d) : "memory");
    return TileDescriptor{state, __longlong_as_double(bits)};
}

// Spins until tile d has published something in this call and returns what it published. Each
// waiting lane runs this on its own.
__device__ __forceinline__ TileDescriptor wait_for_tile(const TileDescriptor* d, unsigned epoch) {
    TileDescriptor seen;
    do {
        seen = read_descriptor(d);
    } while (seen.state / 2 != epoch);
    return seen;
}

// Loads the tile's `valid` elements (the rest as 0) into stage, coalesced: at step k the block
// reads consecutive elements. With `in` 16-byte aligned and the tile full, as float4s (a quarter
// of the load instructions); otherwise one float at a time. stage is padded (see padded()).
__device__ __forceinline__ void load_tile(const float* __restrict__ in, unsigned valid, bool vec,
                                          float (&stage)[TILE + TILE / WARP]) {
    const unsigned t = threadIdx.x;
    if (vec && valid == TILE) {
#pragma unroll
        for (int k = 0; k < ITEMS / 4; ++k) {
            const unsigned j = k * SP_THREADS + t, i = 4 * j;
            const float4 x = reinterpret_cast<const float4*>(in)[j];
            stage[padded(i)] = x.x;  // four words in a row: i is a multiple of 4, so no padding between them
            stage[padded(i) + 1] = x.y;
            stage[padded(i) + 2] = x.z;
            stage[padded(i) + 3] = x.w;
        }
    } else {
#pragma unroll
        for (int k = 0; k < ITEMS; ++k) {
            const unsigned i = k * SP_THREADS + t;
            stage[padded(i)] = i < valid ? in[i] : 0.0f;
        }
    }
}

// The mirror of load_tile: writes the tile's `valid` elements of stage to out, coalesced.
__device__ __forceinline__ void store_tile(float* __restrict__ out, unsigned valid, bool vec,
                                           const float (&stage)[TILE + TILE / WARP]) {
    const unsigned t = threadIdx.x;
    if (vec && valid == TILE) {
#pragma unroll
        for (int k = 0; k < ITEMS / 4; ++k) {
            const unsigned j = k * SP_THREADS + t, i = 4 * j;
            reinterpret_cast<float4*>(out)[j] =
                make_float4(stage[padded(i)], stage[padded(i) + 1], stage[padded(i) + 2], stage[padded(i) + 3]);
        }
    } else {
#pragma unroll
        for (int k = 0; k < ITEMS; ++k) {
            const unsigned i = k * SP_THREADS + t;
            if (i < valid) out[i] = stage[padded(i)];
        }
    }
}

// The tile is in stage (load_tile), `valid` elements (1..TILE; the rest are 0). On return v[k] is
// the inclusive prefix, within the tile, of tile element threadIdx.x * ITEMS + k, and the function
// returns the tile's total to every thread. warp_totals is shared memory.
__device__ float tile_scan(float (&v)[ITEMS], const float (&stage)[TILE + TILE / WARP], float (&warp_totals)[SP_WARPS]) {
    // TODO(lab2/12) begin: give each thread its ITEMS consecutive elements of stage in v (padded() keeps those reads free of bank conflicts); scan them sequentially in registers; scan the 32 thread totals of each warp with __shfl_up_sync; combine the warps' totals through warp_totals (one barrier); add to every v[k] what comes before the thread in the tile; return the tile's total; see the chapter's scan ladder, rung 3; about 30 lines; try n = 1, 32, 33, 4096 and 4097.
    const unsigned t = threadIdx.x, lane = t % WARP, warp = t / WARP;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) v[k] = stage[padded(t * ITEMS + k)];

    // 1. each thread: its own ITEMS elements, one after the other
#pragma unroll
    for (int k = 1; k < ITEMS; ++k) v[k] += v[k - 1];
    // 2. each warp: an inclusive scan of its 32 thread totals, register to register
    float running = v[ITEMS - 1];
#pragma unroll
    for (int offset = 1; offset < WARP; offset *= 2) {
        const float up = __shfl_up_sync(0xffffffffu, running, offset);
        if (lane >= offset) running += up;
    }
    float lanes_below = __shfl_up_sync(0xffffffffu, running, 1);  // the lanes before this one
    if (lane == 0) lanes_below = 0.0f;
    // 3. the block: the last lane of each warp holds the warp's total; every warp scans those
    // SP_WARPS totals itself, which costs less than a second barrier
    if (lane == WARP - 1) warp_totals[warp] = running;
    __syncthreads();
    float warps = lane < SP_WARPS ? warp_totals[lane] : 0.0f;
#pragma unroll
    for (int offset = 1; offset < SP_WARPS; offset *= 2) {
        const float up = __shfl_up_sync(0xffffffffu, warps, offset);
        if (lane >= offset) warps += up;
    }
    const float total = __shfl_sync(0xffffffffu, warps, SP_WARPS - 1);
    const float warps_below = __shfl_sync(0xffffffffu, warps, warp > 0 ? warp - 1 : 0);
    const float before = (warp > 0 ? warps_below : 0.0f) + lanes_below;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) v[k] += before;
    return total;
    //~ return 0.0f;
    // TODO(lab2/12) end
}

// Called by all 32 lanes of the block's first warp once the tile's total (aggregate) is known.
// Publishes it for the tiles after this one, gathers the totals of the tiles before it, publishes
// this tile's inclusive prefix and returns the sum of every element before the tile (0 for tile 0).
__device__ double look_back(TileStatus status, unsigned tile, float aggregate, unsigned epoch) {
    // TODO(lab2/12) begin: tile 0 publishes its inclusive prefix at once; any other tile publishes its aggregate, then looks at the 32 tiles before it at a time (lane k at tile - 1 - k, waiting for each to publish), adds in float64 the values up to and including the nearest tile that has published an inclusive prefix (__ballot_sync finds it, a warp reduction adds), moves 32 tiles further back if none has, and finally publishes aggregate + that sum as its own inclusive prefix; see the chapter's scan ladder, rung 3 (decoupled look-back); about 25 lines; try n = 4097, 2^20 + 3 and 2^24.
    const unsigned lane = threadIdx.x % WARP;
    if (tile == 0) {
        if (lane == 0) publish(status.tiles, 2ull * epoch + 1, (double)aggregate);
        return 0.0;
    }
    if (lane == 0) publish(status.tiles + tile, 2ull * epoch, (double)aggregate);
    double before = 0.0;
    for (int top = (int)tile - 1;; top -= WARP) {
        // lane k looks at tile top - k; lanes past tile 0 count as an inclusive 0 (tile 0 always
        // publishes an inclusive prefix, so the walk stops at or before them)
        const int pred = top - (int)lane;
        bool inclusive = true;
        double value = 0.0;
        if (pred >= 0) {
            const TileDescriptor seen = wait_for_tile(status.tiles + pred, epoch);
            inclusive = seen.state % 2 == 1;
            value = seen.value;
        }
        // the nearest tile with an inclusive prefix ends the walk: the lanes beyond it do not count
        const unsigned found = __ballot_sync(0xffffffffu, inclusive);
        if (found != 0 && (int)lane > __ffs(found) - 1) value = 0.0;
#pragma unroll
        for (int offset = WARP / 2; offset > 0; offset /= 2) value += __shfl_down_sync(0xffffffffu, value, offset);
        before += __shfl_sync(0xffffffffu, value, 0);
        if (found != 0) break;
    }
    if (lane == 0) publish(status.tiles + tile, 2ull * epoch + 1, before + aggregate);
    return before;
    //~ return 0.0;
    // TODO(lab2/12) end
}

__global__ void __launch_bounds__(SP_THREADS, SP_MIN_BLOCKS)
    scan_single_pass_kernel(const float* __restrict__ in, float* __restrict__ out, size_t count,
                            TileStatus status, unsigned epoch, bool vec) {
    // TODO(lab2/12) begin: draw a tile (draw_tile), load it (load_tile), barrier, scan it (tile_scan), let the first warp find the sum of everything before it (look_back) and share it with the block through shared memory, then write the tile's results back through stage (add the prefix to v, store v into stage where each thread read it, barrier, store_tile); only the tile's valid elements (the last tile may be partial); see the chapter's scan ladder, rung 3; about 20 lines; try n = 1, 4097 and 2^20 + 3.
    __shared__ float stage[TILE + TILE / WARP];  // the tile, for coalesced loads and stores
    __shared__ float warp_totals[SP_WARPS];
    __shared__ float prefix_shared;
    const unsigned tile = draw_tile(status);
    const size_t base = (size_t)tile * TILE;
    const unsigned valid = count - base < TILE ? (unsigned)(count - base) : TILE;

    load_tile(in + base, valid, vec, stage);
    __syncthreads();
    float v[ITEMS];
    const float aggregate = tile_scan(v, stage, warp_totals);
    if (threadIdx.x < WARP) {
        const double before = look_back(status, tile, aggregate, epoch);
        if (threadIdx.x == 0) prefix_shared = (float)before;
    }
    __syncthreads();  // also: every thread is done reading stage (tile_scan's barrier came after)
    const float prefix = prefix_shared;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) stage[padded(threadIdx.x * ITEMS + k)] = v[k] + prefix;
    __syncthreads();
    store_tile(out + base, valid, vec, stage);
    // TODO(lab2/12) end
}

static Scratch tile_statuses;  // rung 3 only: the partial sums of rungs 1 and 2 would read as descriptors

static cudaError_t scan_single_pass(const float* in, float* out, size_t n) {
    static unsigned epoch = 0;  // counts the calls (2^31 of them before the states would wrap)
    const size_t tiles = (n + TILE - 1) / TILE;
    // ticket | descriptors (tiles,), 256-byte aligned
    void* buffer = nullptr;
    CUDA_CHECK(reserve(tile_statuses, 256 + sizeof(TileDescriptor) * tiles, &buffer));
    char* bytes = static_cast<char*>(buffer);
    TileStatus status;
    status.ticket = reinterpret_cast<unsigned*>(bytes);
    status.tiles = reinterpret_cast<TileDescriptor*>(bytes + 256);
    ++epoch;
    // float4 loads and stores where both arrays start on 16 bytes (every tile then does: TILE is a
    // multiple of 4); a view that starts one float in takes the scalar path
    const bool vec = reinterpret_cast<uintptr_t>(in) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0;
    scan_single_pass_kernel<<<(unsigned)tiles, SP_THREADS>>>(in, out, n, status, epoch, vec);
    return cudaGetLastError();
}

COURSE_API cudaError_t scan_1(const float* in, float* out, size_t n) {
    return scan_three_phase({scan_hillis_steele_kernel, HS_THREADS, HS_THREADS}, in, out, n);
}

COURSE_API cudaError_t scan_2(const float* in, float* out, size_t n) {
    return scan_three_phase({scan_blelloch_kernel, BL_THREADS, BL_TILE}, in, out, n);
}

COURSE_API cudaError_t scan_3(const float* in, float* out, size_t n) { return scan_single_pass(in, out, n); }

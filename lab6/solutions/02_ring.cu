// Lab 6 · Task 02 — A ring all-reduce by hand: reduce-scatter, then all-gather, over CUDA IPC memory
//
// Implement: a communicator whose device buffer every rank (one process per GPU) maps through CUDA
//            IPC handles, and an all-reduce (sum) of float32 in place in that buffer: the ring's
//            reduce-scatter (world - 1 steps, each rank adding its left neighbour's partial sum of
//            one chunk into its own), then its all-gather (world - 1 steps, each rank copying the
//            finished chunk its left neighbour holds), the steps separated by flags in peer memory.
// Contract:  ring_alloc(capacity, &comm): on the current device, a buffer of `capacity` floats
//            (1 <= capacity) plus this rank's flags, zeroed; comm is an opaque host pointer.
//            ring_buffer(comm, &data): the buffer's device pointer (the caller writes its input
//            there and reads the sum from there). ring_export(comm, handle): the buffer's
//            cudaIpcMemHandle_t (64 bytes) into `handle`. ring_open(comm, handles, rank, world):
//            handles holds world handles, rank by rank (this rank's own among them); maps every
//            other rank's buffer; 1 <= world <= 8, 0 <= rank < world, else cudaErrorInvalidValue.
//            ring_all_reduce(comm, n, stream): every rank calls it with the same n (1 <= n <=
//            capacity, else cudaErrorInvalidValue) in the same order; afterwards data[i], i < n, is
//            the sum over the ranks of their data[i], on every rank; data[i] for i >= n is left
//            alone. Ordered on `stream` (a CUDA graph may capture it): it does not synchronize,
//            and no call needs a reset before the next. ring_close(comm) unmaps the peers' buffers;
//            ring_free(comm) frees this rank's. Every function is called with comm's device
//            current and returns the first error.
// Test:      make test-lab6 TASK=02

#include <cstdint>
#include <cstring>

#include "course.h"

constexpr int MAX_WORLD = 8;
constexpr int MAX_BLOCKS = 128;  // at most this many blocks a call: each must be resident (they wait on peers)
constexpr int THREADS = 512;
constexpr int UNROLL = 4;  // float4 loads in flight per thread: the link's latency is hidden by many

// The peers' memory as this rank sees it: rank p's buffer and p's flags, this rank's own at p == rank.
struct Peers {
    float* data[MAX_WORLD];
    uint32_t* flags[MAX_WORLD];
};

// One allocation per rank, exported as one IPC handle:
//   [data: capacity floats, padded to 256 bytes][flags: MAX_BLOCKS x MAX_WORLD u32][epochs: MAX_BLOCKS u32]
// flags[b * MAX_WORLD + p] is written by rank p's block b (the last barrier it reached); this
// rank's block b only reads it. epochs[b] counts the barriers this rank's block b has passed: kept
// on the device, so repeated calls and graph replays never reset anything.
struct Comm {
    int device = 0;
    int rank = 0;
    int world = 0;
    size_t capacity = 0;
    char* base = nullptr;
    Peers peers{};
};

static size_t data_bytes(size_t capacity) { return (capacity * sizeof(float) + 255) / 256 * 256; }
static size_t flag_bytes() { return sizeof(uint32_t) * MAX_BLOCKS * MAX_WORLD; }
static size_t total_bytes(size_t capacity) {
    return data_bytes(capacity) + flag_bytes() + sizeof(uint32_t) * MAX_BLOCKS;
}

COURSE_API cudaError_t ring_alloc(size_t capacity, void** comm) {
    // TODO(lab6/02) begin: allocate one device buffer for the data, the flags and the epoch counters (the layout above), zero it, and return a new Comm; see the chapter's section "2.3 Sharing a buffer: CUDA IPC"; about 10 lines; try it alone with world = 1.
    if (comm == nullptr || capacity == 0) return cudaErrorInvalidValue;
    Comm* c = new Comm;
    c->capacity = capacity;
    CUDA_CHECK(cudaGetDevice(&c->device));
    cudaError_t e = cudaMalloc(&c->base, total_bytes(capacity));
    if (e == cudaSuccess) e = cudaMemset(c->base, 0, total_bytes(capacity));
    if (e == cudaSuccess) e = cudaDeviceSynchronize();  // zero before any peer can see it
    if (e != cudaSuccess) {
        if (c->base) cudaFree(c->base);
        delete c;
        (void)cudaGetLastError();
        return e;
    }
    *comm = c;
    return cudaSuccess;
    //~ return cudaErrorNotYetImplemented;
    // TODO(lab6/02) end
}

COURSE_API cudaError_t ring_buffer(void* comm, float** data) {
    if (comm == nullptr || data == nullptr) return cudaErrorInvalidValue;
    *data = reinterpret_cast<float*>(static_cast<Comm*>(comm)->base);
    return cudaSuccess;
}

COURSE_API cudaError_t ring_export(void* comm, cudaIpcMemHandle_t* handle) {
    // TODO(lab6/02) begin: the IPC handle of the buffer ring_alloc made; see the chapter's section "2.3 Sharing a buffer: CUDA IPC"; 2 lines.
    if (comm == nullptr || handle == nullptr) return cudaErrorInvalidValue;
    CUDA_CHECK(cudaIpcGetMemHandle(handle, static_cast<Comm*>(comm)->base));
    return cudaSuccess;
    //~ return cudaErrorNotYetImplemented;
    // TODO(lab6/02) end
}

COURSE_API cudaError_t ring_open(void* comm, const cudaIpcMemHandle_t* handles, int rank, int world) {
    // TODO(lab6/02) begin: check rank and world, then map every other rank's buffer (cudaIpcOpenMemHandle with cudaIpcMemLazyEnablePeerAccess: a process cannot open its own handle) and fill Peers with each rank's data and flags pointers; see the chapter's section "2.3 Sharing a buffer: CUDA IPC"; about 15 lines.
    if (comm == nullptr || handles == nullptr || world < 1 || world > MAX_WORLD || rank < 0 || rank >= world)
        return cudaErrorInvalidValue;
    Comm* c = static_cast<Comm*>(comm);
    c->rank = rank;
    c->world = world;
    for (int p = 0; p < world; ++p) {
        char* base = c->base;
        if (p != rank) {
            void* mapped = nullptr;
            CUDA_CHECK(cudaIpcOpenMemHandle(&mapped, handles[p], cudaIpcMemLazyEnablePeerAccess));
            base = static_cast<char*>(mapped);
        }
        c->peers.data[p] = reinterpret_cast<float*>(base);
        c->peers.flags[p] = reinterpret_cast<uint32_t*>(base + data_bytes(c->capacity));
    }
    return cudaSuccess;
    //~ return cudaErrorNotYetImplemented;
    // TODO(lab6/02) end
}

COURSE_API cudaError_t ring_close(void* comm) {
    // TODO(lab6/02) begin: unmap what ring_open mapped (every rank but this one); 8 lines.
    if (comm == nullptr) return cudaErrorInvalidValue;
    Comm* c = static_cast<Comm*>(comm);
    for (int p = 0; p < c->world; ++p) {
        if (p != c->rank && c->peers.data[p] != nullptr) CUDA_CHECK(cudaIpcCloseMemHandle(c->peers.data[p]));
        c->peers.data[p] = nullptr;
        c->peers.flags[p] = nullptr;
    }
    c->world = 0;
    return cudaSuccess;
    //~ return cudaErrorNotYetImplemented;
    // TODO(lab6/02) end
}

COURSE_API cudaError_t ring_free(void* comm) {
    if (comm == nullptr) return cudaSuccess;
    Comm* c = static_cast<Comm*>(comm);
    const cudaError_t e = c->base ? cudaFree(c->base) : cudaSuccess;
    delete c;
    return e;
}

// TODO(lab6/02) begin: the flags' two sides (a store with release semantics and a load with acquire semantics, both at system scope: the other side is another GPU), and a barrier of one block with the same block of every rank that uses them and this block's epoch; see the chapter's section "2.4 Flags in peer memory"; about 30 lines; think about what a flag left over from the previous call must not let through.
__device__ __forceinline__ void st_release_sys(uint32_t* p, uint32_t v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
    uint32_t v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// Block blockIdx.x of every rank meets here: returns when each has reached its barrier number
// `epoch` (or later). Thread p < world tells rank p (writing into p's flags) and waits for rank p
// (reading its own flags). The __syncthreads on either side make the block's other threads' work
// before the barrier visible to the peers' work after theirs.
__device__ __forceinline__ void block_barrier(const Peers& peers, int rank, int world, uint32_t epoch) {
    __syncthreads();
    const int p = threadIdx.x;
    if (p < world) {
        __threadfence_system();  // the block's writes (ordered before by __syncthreads) reach the peers first
        st_release_sys(peers.flags[p] + blockIdx.x * MAX_WORLD + rank, epoch);
        const uint32_t* mine = peers.flags[rank] + blockIdx.x * MAX_WORLD + p;
        // a rank is at most one barrier ahead; the difference is signed so the counter may wrap
        while (static_cast<int32_t>(ld_acquire_sys(mine) - epoch) < 0) {
        }
    }
    __syncthreads();
}
// TODO(lab6/02) end

// TODO(lab6/02) begin: the kernel: an entry barrier, then world - 1 reduce-scatter steps (chunk (rank - s - 1) mod world: own += left's) and world - 1 all-gather steps (chunk (rank - s) mod world: own = left's), a barrier after each step; chunks of `chunk` floats (a multiple of 4) whose last ones are short or empty; float4 where a whole one fits, single floats for a chunk's tail; the block's epoch read at the start and stored at the end; see the chapter's sections "2.2 The ring" and "2.4 Flags in peer memory"; about 60 lines; try n = 1 and n = 5 by hand on 2 ranks.
// One chunk of the ring, [start, end) of the buffer: own = left (copy) or own += left (reduce).
// Every rank's block b covers the same offsets of every chunk (the grid is the same on all ranks),
// so a barrier of block b alone orders everything block b of the peers wrote that it reads.
template <bool REDUCE>
__device__ __forceinline__ void ring_step(float* own, const float* left, size_t start, size_t end) {
    const size_t len = end - start;
    const size_t quads = len / 4;
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    float4* o4 = reinterpret_cast<float4*>(own + start);
    const float4* l4 = reinterpret_cast<const float4*>(left + start);
    for (size_t q0 = tid; q0 < quads; q0 += stride * UNROLL) {
        float4 a[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const size_t q = q0 + u * stride;
            if (q < quads) a[u] = __ldcg(l4 + q);  // L2, not L1: the peer's line changes between steps
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const size_t q = q0 + u * stride;
            if (q < quads) {
                if (REDUCE) {
                    const float4 b = o4[q];
                    a[u].x += b.x;
                    a[u].y += b.y;
                    a[u].z += b.z;
                    a[u].w += b.w;
                }
                o4[q] = a[u];
            }
        }
    }
    for (size_t i = 4 * quads + tid; i < len; i += stride) {
        const float v = __ldcg(left + start + i);
        own[start + i] = REDUCE ? own[start + i] + v : v;
    }
}

__global__ void __launch_bounds__(THREADS) ring_kernel(Peers peers, uint32_t* epochs, int rank, int world, size_t n,
                                                       size_t chunk) {
    uint32_t epoch = epochs[blockIdx.x];
    float* own = peers.data[rank];
    const float* left = peers.data[(rank + world - 1) % world];
    block_barrier(peers, rank, world, ++epoch);  // every rank's input is in its buffer
    for (int s = 0; s < world - 1; ++s) {  // reduce-scatter
        const int c = ((rank - s - 1) % world + world) % world;
        const size_t start = c * chunk < n ? c * chunk : n, end = start + chunk < n ? start + chunk : n;
        ring_step<true>(own, left, start, end);
        block_barrier(peers, rank, world, ++epoch);
    }
    // this rank now holds chunk (rank + 1) mod world summed over every rank
    for (int s = 0; s < world - 1; ++s) {  // all-gather
        const int c = ((rank - s) % world + world) % world;
        const size_t start = c * chunk < n ? c * chunk : n, end = start + chunk < n ? start + chunk : n;
        ring_step<false>(own, left, start, end);
        block_barrier(peers, rank, world, ++epoch);  // the last: no peer reads this buffer any more
    }
    if (threadIdx.x == 0) epochs[blockIdx.x] = epoch;
}
// TODO(lab6/02) end

COURSE_API cudaError_t ring_all_reduce(void* comm, size_t n, cudaStream_t stream) {
    // TODO(lab6/02) begin: check n, split it in world chunks of a multiple of 4 floats, pick a grid from n alone (every rank must launch the same one), launch on `stream` and check the launch; see the chapter's section "2.2 The ring"; about 15 lines.
    if (comm == nullptr) return cudaErrorInvalidValue;
    Comm* c = static_cast<Comm*>(comm);
    if (c->world < 1 || n == 0 || n > c->capacity) return cudaErrorInvalidValue;
    // a chunk of a multiple of 4 floats starts on the 16-byte grid (the buffer is 256-byte aligned)
    const size_t chunk = ((n + c->world - 1) / c->world + 3) / 4 * 4;
    const size_t quads = (chunk + 3) / 4;
    const size_t want = (quads + (size_t)THREADS * UNROLL - 1) / ((size_t)THREADS * UNROLL);
    const int blocks = (int)(want < MAX_BLOCKS ? (want > 0 ? want : 1) : MAX_BLOCKS);
    uint32_t* epochs = c->peers.flags[c->rank] + MAX_BLOCKS * MAX_WORLD;
    ring_kernel<<<blocks, THREADS, 0, stream>>>(c->peers, epochs, c->rank, c->world, n, chunk);
    CUDA_CHECK(cudaGetLastError());
    return cudaSuccess;
    //~ return cudaErrorNotYetImplemented;
    // TODO(lab6/02) end
}

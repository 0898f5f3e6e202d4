// Lab 6 · Task 03 — A one-shot all-reduce for small messages: every GPU reads every peer's buffer
//
// Implement: the same communicator as task 02 (given here: its buffer shared through CUDA IPC
//            handles, its flags and its epochs), and an all-reduce (sum) of float32 in place in
//            the buffer for the small messages of a decode step (8 KB to 256 KB): after one barrier
//            every rank reads every rank's buffer directly and adds them, in rank order; a second
//            barrier says that every rank has read this rank's input before it is overwritten with
//            the sum. One step of the link's latency, where the ring takes 2 (world - 1).
// Contract:  one_shot_alloc, one_shot_buffer, one_shot_export, one_shot_open, one_shot_close and
//            one_shot_free as task 02's ring_* (given). one_shot_all_reduce(comm, n, stream): every
//            rank calls it with the same n (1 <= n <= capacity, else cudaErrorInvalidValue) in the
//            same order; afterwards data[i], i < n, is the sum over the ranks of their data[i],
//            added in rank order (so every rank holds the same bits), on every rank; data[i] for
//            i >= n is left alone. Ordered on `stream` (a CUDA graph may capture it): it does not
//            synchronize, and no call needs a reset before the next. Every function is called with
//            comm's device current and returns the first error.
// Test:      make test-lab6 TASK=03

#include <cstdint>
#include <cstring>

#include "course.h"

constexpr int MAX_WORLD = 8;
constexpr int MAX_BLOCKS = 64;  // at most this many blocks a call: each must be resident (they wait on peers)
constexpr int THREADS = 256;

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

COURSE_API cudaError_t one_shot_alloc(size_t capacity, void** comm) {
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
}

COURSE_API cudaError_t one_shot_buffer(void* comm, float** data) {
    if (comm == nullptr || data == nullptr) return cudaErrorInvalidValue;
    *data = reinterpret_cast<float*>(static_cast<Comm*>(comm)->base);
    return cudaSuccess;
}

COURSE_API cudaError_t one_shot_export(void* comm, cudaIpcMemHandle_t* handle) {
    if (comm == nullptr || handle == nullptr) return cudaErrorInvalidValue;
    CUDA_CHECK(cudaIpcGetMemHandle(handle, static_cast<Comm*>(comm)->base));
    return cudaSuccess;
}

COURSE_API cudaError_t one_shot_open(void* comm, const cudaIpcMemHandle_t* handles, int rank, int world) {
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
}

COURSE_API cudaError_t one_shot_close(void* comm) {
    if (comm == nullptr) return cudaErrorInvalidValue;
    Comm* c = static_cast<Comm*>(comm);
    for (int p = 0; p < c->world; ++p) {
        if (p != c->rank && c->peers.data[p] != nullptr) CUDA_CHECK(cudaIpcCloseMemHandle(c->peers.data[p]));
        c->peers.data[p] = nullptr;
        c->peers.flags[p] = nullptr;
    }
    c->world = 0;
    return cudaSuccess;
}

COURSE_API cudaError_t one_shot_free(void* comm) {
    if (comm == nullptr) return cudaSuccess;
    Comm* c = static_cast<Comm*>(comm);
    const cudaError_t e = c->base ? cudaFree(c->base) : cudaSuccess;
    delete c;
    return e;
}

// TODO(lab6/03) begin: the flags' two sides, as in your task 02 (a store with release semantics and a load with acquire semantics, both at system scope: the other side is another GPU), and a barrier of one block with the same block of every rank that uses them and this block's epoch; see the chapter's section "2.4 Flags in peer memory"; about 30 lines (task 02's); think about what a flag left over from the previous call must not let through.
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
// TODO(lab6/03) end

// TODO(lab6/03) begin: the kernel: an entry barrier, then, in rounds of gridDim.x * blockDim.x float4s, each thread adds its float4 (or, past the last whole one, its single floats) of every rank's buffer in rank order, a barrier (every rank has read this round of this rank's buffer), and writes the sum into its own buffer; the block's epoch read at the start and stored at the end; see the chapter's section "3.2 One step"; about 45 lines; try n = 5 on 2 ranks by hand.
// Block b of every rank covers the same elements (the grid is the same on all ranks): a barrier
// of block b alone orders its reads of the peers' inputs before their writes of the sums.
__global__ void __launch_bounds__(THREADS) one_shot_kernel(Peers peers, uint32_t* epochs, int rank, int world,
                                                           size_t n) {
    uint32_t epoch = epochs[blockIdx.x];
    block_barrier(peers, rank, world, ++epoch);  // every rank's input is in its buffer
    const size_t per_round = (size_t)gridDim.x * blockDim.x * 4;
    const size_t rounds = (n + per_round - 1) / per_round;  // the same for every thread: the barriers match
    float* own = peers.data[rank];
    for (size_t r = 0; r < rounds; ++r) {
        const size_t i = r * per_round + 4 * ((size_t)blockIdx.x * blockDim.x + threadIdx.x);
        float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
        if (i + 4 <= n) {
            for (int p = 0; p < world; ++p) {  // rank order: every rank adds the same numbers the same way
                const float4 v = __ldcg(reinterpret_cast<const float4*>(peers.data[p] + i));
                sum.x += v.x;
                sum.y += v.y;
                sum.z += v.z;
                sum.w += v.w;
            }
        } else if (i < n) {
            float* s = &sum.x;
            for (int p = 0; p < world; ++p)
                for (size_t k = i; k < n; ++k) s[k - i] += __ldcg(peers.data[p] + k);
        }
        block_barrier(peers, rank, world, ++epoch);  // every rank has read these elements of this buffer
        if (i + 4 <= n) {
            *reinterpret_cast<float4*>(own + i) = sum;
        } else if (i < n) {
            const float* s = &sum.x;
            for (size_t k = i; k < n; ++k) own[k] = s[k - i];
        }
    }
    if (threadIdx.x == 0) epochs[blockIdx.x] = epoch;
}
// TODO(lab6/03) end

COURSE_API cudaError_t one_shot_all_reduce(void* comm, size_t n, cudaStream_t stream) {
    // TODO(lab6/03) begin: check n, pick a grid from n alone (every rank must launch the same one: one float4 a thread, at most MAX_BLOCKS blocks), launch on `stream` and check the launch; see the chapter's section "3.2 One step"; about 10 lines.
    if (comm == nullptr) return cudaErrorInvalidValue;
    Comm* c = static_cast<Comm*>(comm);
    if (c->world < 1 || n == 0 || n > c->capacity) return cudaErrorInvalidValue;
    const size_t want = ((n + 3) / 4 + THREADS - 1) / THREADS;
    const int blocks = (int)(want < MAX_BLOCKS ? want : MAX_BLOCKS);
    uint32_t* epochs = c->peers.flags[c->rank] + MAX_BLOCKS * MAX_WORLD;
    one_shot_kernel<<<blocks, THREADS, 0, stream>>>(c->peers, epochs, c->rank, c->world, n);
    CUDA_CHECK(cudaGetLastError());
    return cudaSuccess;
    //~ return cudaErrorNotYetImplemented;
    // TODO(lab6/03) end
}

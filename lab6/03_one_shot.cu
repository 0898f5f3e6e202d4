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
// TODO(lab6/03) end

// TODO(lab6/03) begin: the kernel: an entry barrier, then, in rounds of gridDim.x * blockDim.x float4s, each thread adds its float4 (or, past the last whole one, its single floats) of every rank's buffer in rank order, a barrier (every rank has read this round of this rank's buffer), and writes the sum into its own buffer; the block's epoch read at the start and stored at the end; see the chapter's section "3.2 One step"; about 45 lines; try n = 5 on 2 ranks by hand.
// TODO(lab6/03) end

COURSE_API cudaError_t one_shot_all_reduce(void* comm, size_t n, cudaStream_t stream) {
    // TODO(lab6/03) begin: check n, pick a grid from n alone (every rank must launch the same one: one float4 a thread, at most MAX_BLOCKS blocks), launch on `stream` and check the launch; see the chapter's section "3.2 One step"; about 10 lines.
    return cudaErrorNotYetImplemented;  //~
    // TODO(lab6/03) end
}

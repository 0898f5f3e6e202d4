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
    return cudaErrorNotYetImplemented;  //~
    // TODO(lab6/02) end
}

COURSE_API cudaError_t ring_buffer(void* comm, float** data) {
    if (comm == nullptr || data == nullptr) return cudaErrorInvalidValue;
    *data = reinterpret_cast<float*>(static_cast<Comm*>(comm)->base);
    return cudaSuccess;
}

COURSE_API cudaError_t ring_export(void* comm, cudaIpcMemHandle_t* handle) {
    // TODO(lab6/02) begin: the IPC handle of the buffer ring_alloc made; see the chapter's section "2.3 Sharing a buffer: CUDA IPC"; 2 lines.
    return cudaErrorNotYetImplemented;  //~
    // TODO(lab6/02) end
}

COURSE_API cudaError_t ring_open(void* comm, const cudaIpcMemHandle_t* handles, int rank, int world) {
    // TODO(lab6/02) begin: check rank and world, then map every other rank's buffer (cudaIpcOpenMemHandle with cudaIpcMemLazyEnablePeerAccess: a process cannot open its own handle) and fill Peers with each rank's data and flags pointers; see the chapter's section "2.3 Sharing a buffer: CUDA IPC"; about 15 lines.
    return cudaErrorNotYetImplemented;  //~
    // TODO(lab6/02) end
}

COURSE_API cudaError_t ring_close(void* comm) {
    // TODO(lab6/02) begin: unmap what ring_open mapped (every rank but this one); 8 lines.
    return cudaErrorNotYetImplemented;  //~
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
// TODO(lab6/02) end

// TODO(lab6/02) begin: the kernel: an entry barrier, then world - 1 reduce-scatter steps (chunk (rank - s - 1) mod world: own += left's) and world - 1 all-gather steps (chunk (rank - s) mod world: own = left's), a barrier after each step; chunks of `chunk` floats (a multiple of 4) whose last ones are short or empty; float4 where a whole one fits, single floats for a chunk's tail; the block's epoch read at the start and stored at the end; see the chapter's sections "2.2 The ring" and "2.4 Flags in peer memory"; about 60 lines; try n = 1 and n = 5 by hand on 2 ranks.
// TODO(lab6/02) end

COURSE_API cudaError_t ring_all_reduce(void* comm, size_t n, cudaStream_t stream) {
    // TODO(lab6/02) begin: check n, split it in world chunks of a multiple of 4 floats, pick a grid from n alone (every rank must launch the same one), launch on `stream` and check the launch; see the chapter's section "2.2 The ring"; about 15 lines.
    return cudaErrorNotYetImplemented;  //~
    // TODO(lab6/02) end
}

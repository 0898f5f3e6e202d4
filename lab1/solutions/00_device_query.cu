// Lab 1 · Task 00 — Device query and thread indices
//
// Implement: query_device: read the device's properties into a DeviceInfo;
//            whoami_kernel: every thread records which block and which thread it is.
// Contract:  query_device(device, info): info is a HOST pointer to one DeviceInfo, written
//            (name NUL-terminated). Returns cudaSuccess, or the error from
//            cudaGetDeviceProperties (e.g. cudaErrorInvalidDevice for a bad index).
//            whoami(block_ids, thread_ids, blocks, threads_per_block): block_ids and
//            thread_ids are DEVICE int32 arrays of blocks * threads_per_block elements,
//            both written: element g = b * threads_per_block + t gets b and t.
//            1 <= threads_per_block <= 1024. Returns the launch error; does not synchronize.
// Test:      make test-lab1 TASK=00

#include "course.h"

#include <cstring>

// Plain C layout: the grader mirrors it with a ctypes.Structure.
struct DeviceInfo {
    char name[256];
    int major;                 // compute capability
    int minor;
    int sm_count;              // multiProcessorCount
    int warp_size;
    int max_threads_per_block;
    int max_threads_per_sm;    // maxThreadsPerMultiProcessor
    int l2_cache_bytes;        // l2CacheSize
    unsigned long long total_global_mem;      // bytes
    unsigned long long shared_mem_per_block;  // bytes (sharedMemPerBlock)
};
// 256 + 7 * 4 = 284 bytes of name and ints, padded to 288 so the 8-byte fields are aligned.
static_assert(sizeof(DeviceInfo) == 304, "the grader's ctypes mirror assumes this layout");

COURSE_API cudaError_t query_device(int device, DeviceInfo* info) {
    // TODO(lab1/00) begin: fill every field of *info from the device's properties (the name always NUL-terminated) and pass on the error of a failed query, such as a bad device index; see §5.1 and §4.5; about 15 lines; try device 0 and device -1.
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    strncpy(info->name, prop.name, sizeof(info->name) - 1);
    info->name[sizeof(info->name) - 1] = '\0';  // strncpy does not terminate a full-length copy
    info->major = prop.major;
    info->minor = prop.minor;
    info->sm_count = prop.multiProcessorCount;
    info->warp_size = prop.warpSize;
    info->max_threads_per_block = prop.maxThreadsPerBlock;
    info->max_threads_per_sm = prop.maxThreadsPerMultiProcessor;
    info->l2_cache_bytes = prop.l2CacheSize;
    info->total_global_mem = prop.totalGlobalMem;
    info->shared_mem_per_block = prop.sharedMemPerBlock;
    return cudaSuccess;
    //~ return cudaErrorNotYetImplemented;
    // TODO(lab1/00) end
}

// block_ids (blocks * threads_per_block,), thread_ids (blocks * threads_per_block,)
__global__ void whoami_kernel(int* __restrict__ block_ids, int* __restrict__ thread_ids) {
    // TODO(lab1/00) begin: every thread records its block number and its thread number in the one slot of each array that belongs to it alone; see §2.4 and §2.5; about 3 lines; try 1 block of 1 thread, and 3 blocks of 32 (every slot written exactly once).
    int g = blockIdx.x * blockDim.x + threadIdx.x;
    block_ids[g] = blockIdx.x;
    thread_ids[g] = threadIdx.x;
    // TODO(lab1/00) end
}

COURSE_API cudaError_t whoami(int* block_ids, int* thread_ids, int blocks, int threads_per_block) {
    // A failed runtime call (e.g. query_device on a bad index) stays recorded as the "last
    // error"; drop it so the check below reports this launch only.
    (void)cudaGetLastError();
    whoami_kernel<<<blocks, threads_per_block>>>(block_ids, thread_ids);
    return cudaGetLastError();
}

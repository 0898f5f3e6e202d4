// Lab 2 · Task 03 — waves and tails: how many blocks the GPU runs at once, and what one more costs
//
// Implement: occupancy_report, which tells how many blocks of a given kernel one SM holds at once
//            for a launch configuration (threads per block, dynamic shared memory), how many SMs
//            the GPU has, and their product: the blocks the whole GPU runs at once, one wave;
//            and waves, how many waves a grid of a given number of blocks takes.
//            The kernels being measured are given: busy_kernel (every block spins for the same
//            number of clock cycles, so every block takes the same time wherever it runs) and
//            heavy_kernel (keeps so many values in registers that registers limit it). run_busy,
//            given, launches busy_kernel; kernel_handle, given, lets the grader ask the driver
//            about the same kernels.
// Contract:  occupancy_report(kernel, threads, dynamic_smem, blocks_per_sm, sms, blocks_per_wave):
//            kernel is BUSY_KERNEL (0) or HEAVY_KERNEL (1), any other value returns
//            cudaErrorInvalidValue; 1 <= threads <= 1024; 0 <= dynamic_smem <= 48 KiB (bytes per
//            block). blocks_per_sm, sms and blocks_per_wave are HOST pointers to one value each,
//            all three written: blocks_per_sm for the current device (0 when one block does not
//            fit at all), sms its SM count, blocks_per_wave = blocks_per_sm * sms. Returns
//            cudaSuccess or the first error of a runtime call.
//            waves(blocks, blocks_per_wave): 0 <= blocks <= 2^62 and 1 <= blocks_per_wave <= 2^62;
//            returns the smallest w with w * blocks_per_wave >= blocks (0 for no blocks).
//            run_busy(block_ids, blocks, threads): block_ids is a DEVICE int32 array of
//            blocks * threads elements, written: element b * threads + t gets b, after its block
//            has spun for SPIN_CYCLES clock cycles. 1 <= threads <= 1024. Returns the launch
//            error; does not synchronize.
// Test:      make test-lab2 TASK=03

#include "course.h"

#include <algorithm>
#include <cstddef>

enum KernelId { BUSY_KERNEL = 0, HEAVY_KERNEL = 1 };

constexpr long long SPIN_CYCLES = 200000;  // one block's life: about 0.1 ms at a 2 GHz SM clock
constexpr int HEAVY_VALUES = 64;           // values each heavy_kernel thread keeps live at once

// ---- given: the kernels being measured ---------------------------------------------------------

// block_ids (gridDim.x * blockDim.x,). Every thread waits `cycles` ticks of its SM's clock, then
// records its block. Waiting on the clock, rather than doing arithmetic, makes a block last the
// same time however many other blocks share its SM: the time of a grid is then its number of
// waves times one block's life, exactly the model of the chapter. Few registers, no shared memory.
__global__ void busy_kernel(int* __restrict__ block_ids, long long cycles) {
    const long long start = clock64();
    while (clock64() - start < cycles) {
    }
    block_ids[(size_t)blockIdx.x * blockDim.x + threadIdx.x] = blockIdx.x;
}

// out (gridDim.x * blockDim.x,). Each thread keeps HEAVY_VALUES floats live through the loop, each
// step reading its neighbour, so the compiler must hold all of them in registers: ptxas gives it
// well over 64 registers per thread (`-Xptxas -v` says how many), and registers, not threads,
// limit how many of its blocks an SM holds. The grader only asks about its occupancy.
__global__ void heavy_kernel(float* __restrict__ out, int steps) {
    float v[HEAVY_VALUES];
#pragma unroll
    for (int k = 0; k < HEAVY_VALUES; ++k) v[k] = (float)(threadIdx.x + k);
    for (int s = 0; s < steps; ++s) {
#pragma unroll
        for (int k = 0; k < HEAVY_VALUES; ++k) v[k] = fmaf(v[k], v[(k + 1) % HEAVY_VALUES], 1.0f);
    }
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < HEAVY_VALUES; ++k) sum += v[k];
    out[(size_t)blockIdx.x * blockDim.x + threadIdx.x] = sum;
}

// The kernel a KernelId names, as the runtime's occupancy functions take it; nullptr for no kernel.
static const void* kernel_by_id(int kernel) {
    switch (kernel) {
        case BUSY_KERNEL: return (const void*)busy_kernel;
        case HEAVY_KERNEL: return (const void*)heavy_kernel;
        default: return nullptr;
    }
}

// For the grader: the driver's handle of a kernel, so that it can ask the driver's own occupancy
// calculator about the very code your library holds and compare its answer with yours.
COURSE_API cudaError_t kernel_handle(int kernel, cudaFunction_t* fn) {
    const void* k = kernel_by_id(kernel);
    if (k == nullptr) return cudaErrorInvalidValue;
    CUDA_CHECK(cudaGetFuncBySymbol(fn, k));
    return cudaSuccess;
}

// blocks blocks of threads threads of busy_kernel: blocks_per_wave of them at a time, each wave
// taking SPIN_CYCLES.
COURSE_API cudaError_t run_busy(int* block_ids, int blocks, int threads) {
    busy_kernel<<<blocks, threads>>>(block_ids, SPIN_CYCLES);
    return cudaGetLastError();
}

// ---- the task ----------------------------------------------------------------------------------

// How an SM allocates (the chapter's table in "3.3 How many blocks fit on an SM"): no device
// attribute reports these, and they hold from compute capability 7.0 to 12.x.
[[maybe_unused]] constexpr int REGISTER_UNIT = 256;  // registers are given to a warp in units of 256
[[maybe_unused]] constexpr int QUARTERS = 4;         // the register file is 4 quarters, one per warp scheduler
[[maybe_unused]] constexpr int SMEM_UNIT = 128;      // shared memory is given to a block in units of 128 bytes (256 before 8.0)

[[maybe_unused]] static long long round_up(long long x, long long unit) { return (x + unit - 1) / unit * unit; }

COURSE_API cudaError_t occupancy_report(int kernel, int threads, size_t dynamic_smem, int* blocks_per_sm,
                                        int* sms, long long* blocks_per_wave) {
    const void* fn = kernel_by_id(kernel);
    if (fn == nullptr) return cudaErrorInvalidValue;
    // TODO(lab2/03) begin: for the kernel fn on the current device, how many of its blocks (of `threads` threads and `dynamic_smem` bytes of dynamic shared memory) one SM holds at once, derived from the resources as the chapter's worked example does: the kernel's registers and static shared memory from cudaFuncGetAttributes, the SM's limits from cudaDeviceGetAttribute, each of the four limits rounded as the hardware allocates (never the runtime's occupancy calculator: the grader compares with it); the SM count as the device reports it, and blocks_per_wave, their product; every runtime call checked; see the chapter's section "3.4 Worked example: four limits, one minimum"; about 25 lines; try heavy_kernel with 96 threads, and busy_kernel with 64 threads and 8 KiB.
    return cudaErrorNotYetImplemented;  //~
    // TODO(lab2/03) end
}

COURSE_API long long waves(long long blocks, long long blocks_per_wave) {
    // TODO(lab2/03) begin: how many waves a grid of `blocks` blocks takes when the GPU runs `blocks_per_wave` at once, a partly filled last wave counting as a whole one, exact for every blocks up to 2^62 (integers only: a double holds 53 bits); see the chapter's section on waves and tails; 1 line; try 0, 264, 265 and 528 blocks at 264 per wave.
    return -1;  //~
    // TODO(lab2/03) end
}

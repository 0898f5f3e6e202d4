// course_mma.h — the shared-memory swizzle and the PTX wrappers of lab 2's tensor-core rungs:
// cp.async (16-byte copies global -> shared, commit, wait) and ldmatrix (.x4, .x4.trans).
//
// Task 15's rung 3 (mma.sync GEMM) and task 16's rung 3 (flash attention) both use them; the
// chapter's sections 15.6 and 16.3 explain each. The mma.sync wrapper stays in each task file: its
// types are the task's own. The instructions exist from sm_80 on (ldmatrix from sm_75); for an
// older target every wrapper compiles to nothing and the tasks' entry points refuse to launch.
#pragma once

#include "course.h"

#include <cstdint>

// Where chunk `chunk` (8 16-bit elements, 16 bytes) of row `row` of a shared tile with CPR chunks
// per row lies, as an offset in elements from the tile's start. The tile is unpadded; what the swizzle
// changes is which 16-byte slot of its row the chunk takes: its index XOR-ed with bits of the row.
// Shared memory has 32 banks of 4 bytes, so a 128-byte line holds 8 slots, one per group of 4
// banks. ldmatrix reads 8 rows of 16 bytes per phase (one 8 x 8 matrix) and is conflict-free when
// those 8 rows sit in 8 different slots. Its rows are 8 consecutive rows of a tile, starting at a
// multiple of 8, at the same logical chunk; likewise a warp's 32 cp.async writes fill whole lines.
// - CPR >= 8 (task 15's B tile, 16 chunks of 256-byte rows; task 16's K and V tiles, 8 or 16): every row starts a new line, so without a
//   swizzle the 8 rows fall on the same slot (8-way conflict); chunk ^ (row % 8) gives rows
//   0..7 the slots c ^ 0 .. c ^ 7, all different.
// - CPR < 8 (task 15's A tile: 4 chunks, 64 bytes per row): a line holds 8 / CPR rows; slot =
//   (row % (8 / CPR)) * CPR + chunk. Without a swizzle rows 0, 2, 4, 6 share a slot (4-way);
//   chunk ^ ((row / (8 / CPR)) % CPR) separates them: A's rows 0..7 at chunk 0 get slots
//   0, 4, 1, 5, 2, 6, 3, 7.
// The XOR only permutes slots within a row, so a row's chunks stay inside it, and the writes and
// the reads must both go through this function: a swizzle used on one side only reads the wrong
// chunks (wrong values); a different but consistent one gives right values, maybe with conflicts.
template <int CPR>
__host__ __device__ constexpr int swizzle(int row, int chunk) {
    static_assert(CPR >= 2 && (CPR & (CPR - 1)) == 0, "a power of two chunks per row");
    if constexpr (CPR >= 8)
        return (row * CPR + (chunk ^ (row & 7))) * 8;
    else
        return (row * CPR + (chunk ^ ((row / (8 / CPR)) & (CPR - 1)))) * 8;
}
static_assert(swizzle<4>(2, 0) == (2 * 4 + 1) * 8 && swizzle<8>(3, 1) == (3 * 8 + 2) * 8 &&
                  swizzle<16>(3, 9) == (3 * 16 + 10) * 8,
              "the worked examples of lab 2 sections 15.6 and 16.3");

// cp.async.cg.shared.global: copies 16 bytes from global memory (gmem, 16-byte aligned) to shared
// memory (smem, 16-byte aligned) without passing through registers and without waiting: the
// copy lands later (see cp_async_wait). src_bytes is 16 or 0: with 0 nothing is read from gmem
// and the 16 bytes at smem are zeroed (keep gmem a valid address anyway). .cg: cached in L2 only.
//
// Built with COURSE_SYNC_COPIES (the grader does, for racecheck only) it copies at once, with a plain
// load and store: racecheck counts an asynchronous copy's write only when its group is waited for,
// and would miss a stage refilled before the barrier that ends the other warps' reads of it.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, int src_bytes) {
#if defined(COURSE_SYNC_COPIES)
    *static_cast<uint4*>(smem) = src_bytes ? *static_cast<const uint4*>(gmem) : make_uint4(0, 0, 0, 0);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_bytes) : "memory");
#endif
}

// Closes the group of this thread's cp.asyncs issued since the last commit (an empty group if
// there were none: it still counts).
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Waits until at most N of this thread's committed groups are still in flight: all older groups
// have landed in shared memory. Only the calling thread's copies: the other threads' become
// visible after a __syncthreads() that every thread reaches after its own wait.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// ldmatrix.x4: the warp loads four 8 x 8 matrices of 16-bit elements from shared memory. Lanes
// 8i .. 8i + 7 give the addresses of matrix i's 8 rows (16 bytes each, 16-byte aligned), and lane l
// receives in r[i] the two elements at row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of matrix i:
// the layout of mma.sync's A fragment, and of its B fragment for a tile stored n-major (k contiguous).
__device__ __forceinline__ void ldmatrix_x4(uint32_t* r, const void* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
#endif
}

// ldmatrix.x4.trans: the same rows, each matrix transposed on the way: lane l receives the two
// elements at rows 2 (l % 4) and 2 (l % 4) + 1 of column l / 4. From a tile stored k-major (its rows
// are k), that is mma.sync's B fragment: two values of consecutive k for one n.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t* r, const void* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
#endif
}

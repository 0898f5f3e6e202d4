// Lab 2 · Task 08 — inline PTX: %laneid, fma.rn.f32, bfe.u32 and a streaming load
//
// Implement: four __device__ helpers, each one PTX instruction in an asm statement: lane_id
//            (mov.u32 from the special register %laneid), fma_rn (fma.rn.f32: a * b + c rounded
//            once), bfe_u32 (bfe.u32: a bit field of x) and, optionally, load_streaming
//            (ld.global.cs.f32, a load that tells the caches the data is read once; its stub is
//            a plain load and is correct). Then the bodies of the two kernels that use them.
//            The launches are given; fma_lanes runs 2-D blocks of 16 x 16 threads on purpose.
// Contract:  fma_lanes: a, b, c are DEVICE float32 vectors of n elements, read-only; out
//            (float32) and lanes (uint32) are DEVICE vectors of n elements, written, overlapping
//            nothing. out[i] = a[i] * b[i] + c[i] rounded once to float32 (to nearest, ties to
//            even); lanes[i] = the lane (0..31) of the thread that computed element i, as
//            %laneid reports it, which with the given launch is i % 32.
//            bit_fields: words, pos and len are DEVICE uint32 vectors of n elements, read-only,
//            with pos[i] and len[i] in 0..255; fields (uint32, n elements) is written.
//            fields[i] = bfe.u32(words[i], pos[i], len[i]) as the PTX ISA defines it: bits
//            pos .. min(pos + len, 32) - 1 of words[i], moved down to bit 0, zeros above; 0 when
//            len == 0 or pos >= 32.
//            1 <= n < 2^31. Both return the launch error; neither synchronizes.
// Test:      make test-lab2 TASK=08

#include "course.h"

#include <cstddef>

constexpr int BLOCK_X = 16, BLOCK_Y = 16;  // fma_lanes' 2-D blocks: 256 threads, 8 warps
constexpr int THREADS = 256;               // bit_fields' 1-D blocks

// ---- the PTX helpers ---------------------------------------------------------------------------

// This thread's lane in its warp, 0..31.
__device__ __forceinline__ unsigned lane_id() {
    // TODO(lab2/08) begin: the lane read from the special register %laneid by one mov.u32 in an asm statement, not computed from threadIdx; see the chapter's section on inline PTX (operands, constraint letters, %% in the template); about 3 lines.
    return 0u;  //~
    // TODO(lab2/08) end
}

// a * b + c with a single rounding, whatever nvcc's -fmad setting.
__device__ __forceinline__ float fma_rn(float a, float b, float c) {
    // TODO(lab2/08) begin: a * b + c rounded once to nearest even, by one fma.rn.f32 in an asm statement (not a * b + c in C++, not fmaf); see the chapter's section on inline PTX; about 3 lines.
    return 0.0f;  //~
    // TODO(lab2/08) end
}

// The field of len bits of x that starts at bit pos, moved down to bit 0 (pos, len in 0..255).
__device__ __forceinline__ unsigned bfe_u32(unsigned x, unsigned pos, unsigned len) {
    // TODO(lab2/08) begin: the field by one bfe.u32 in an asm statement, so len == 0, pos >= 32 and pos + len > 32 behave as the PTX ISA defines (no C++ shifts: x >> 32 is undefined in C++); see the chapter's section on inline PTX; about 3 lines.
    return 0u;  //~
    // TODO(lab2/08) end
}

// *p, read with a hint that the line will not be used again (p points to global memory).
__device__ __forceinline__ float load_streaming(const float* p) {
    // TODO(lab2/08) begin: optional: *p loaded by one ld.global.cs.f32 in an asm statement, the pointer passed with the constraint letter for a 64-bit register; the plain load below is correct without it; see the chapter's section on inline PTX; about 3 lines.
    return *p;  //~
    // TODO(lab2/08) end
}

// ---- the kernels -------------------------------------------------------------------------------

// a, b, c (n,) -> out (n,), lanes (n,). Blocks are 16 x 16: a warp holds two rows of 16 threads.
__global__ void fma_lanes_kernel(const float* __restrict__ a, const float* __restrict__ b,
                                 const float* __restrict__ c, float* __restrict__ out,
                                 unsigned* __restrict__ lanes, int n) {
    // TODO(lab2/08) begin: one element per thread, numbered by the thread's place in the grid counted as warps are cut (block after block, and within a block by the linear thread index threadIdx.y * blockDim.x + threadIdx.x); out from fma_rn of the three inputs read with load_streaming, lanes from lane_id; threads past n do nothing; see the chapter's section on inline PTX (what %laneid is); about 6 lines; try n = 1, 31 and 33.
    // TODO(lab2/08) end
}

// words, pos, len (n,) -> fields (n,)
__global__ void bit_fields_kernel(const unsigned* __restrict__ words, const unsigned* __restrict__ pos,
                                  const unsigned* __restrict__ len, unsigned* __restrict__ fields, int n) {
    // TODO(lab2/08) begin: fields[i] = bfe_u32 of words[i], pos[i] and len[i], one element per thread of the 1-D grid, threads past n doing nothing; about 3 lines; try n = 1 and 33.
    // TODO(lab2/08) end
}

// ---- given: the launches -----------------------------------------------------------------------

COURSE_API cudaError_t fma_lanes(const float* a, const float* b, const float* c, float* out, unsigned* lanes,
                                 int n) {
    const dim3 block(BLOCK_X, BLOCK_Y);
    const size_t blocks = ((size_t)n + BLOCK_X * BLOCK_Y - 1) / (BLOCK_X * BLOCK_Y);
    fma_lanes_kernel<<<(unsigned)blocks, block>>>(a, b, c, out, lanes, n);
    return cudaGetLastError();
}

COURSE_API cudaError_t bit_fields(const unsigned* words, const unsigned* pos, const unsigned* len, unsigned* fields,
                                  int n) {
    const size_t blocks = ((size_t)n + THREADS - 1) / THREADS;
    bit_fields_kernel<<<(unsigned)blocks, THREADS>>>(words, pos, len, fields, n);
    return cudaGetLastError();
}

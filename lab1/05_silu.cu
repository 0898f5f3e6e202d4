// Lab 1 · Task 05 — SiLU from the host, end to end
//
// Implement: everything: a kernel that computes SiLU for any n, and silu(), which moves x to
//            the device, runs the kernel with a launch you choose, brings y back and frees
//            what it allocated, checking every runtime call.
// Contract:  x and y are HOST float32 arrays of n elements; x is read-only, y is written.
//            y[i] = x[i] / (1 + exp(-x[i])). n may be 0 (returns cudaSuccess at once) and
//            has no upper limit of its own: when the device buffers cannot be allocated (the
//            first one, or only the second) the function returns cudaErrorMemoryAllocation,
//            leaks nothing and leaves y untouched. Synchronous: y is ready when it returns.
//            Returns cudaSuccess or the first error met.
// Test:      make test-lab1 TASK=05

#include "course.h"

#include <algorithm>
#include <cstdint>

// TODO(lab1/05) begin: write the SiLU kernel: correct for every size_t n, whatever grid you decide to launch; see §5.6 and §2.5 (index types); about 8 lines; think about n = 1, n = 1000 and n above 2^31.
// TODO(lab1/05) end

COURSE_API cudaError_t silu(const float* x, float* y, size_t n) {
    // TODO(lab1/05) begin: the whole host side: n == 0 succeeds at once; device buffers, both copies and a launch of your choosing; every runtime call and the launch checked; every buffer freed on every exit path, a failure after the first allocation included, and y untouched when an allocation fails; see §4.2, §4.5, §4.6 (clean-up) and §5.6; about 25 lines; try n = 0, 1, 1000 and an n too large to allocate.
    return cudaErrorNotYetImplemented;  //~
    // TODO(lab1/05) end
}

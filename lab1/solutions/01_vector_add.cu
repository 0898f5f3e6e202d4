// Lab 1 · Task 01 — Vector add in one block
//
// Implement: vector_add_kernel (one thread per element) and its launch with one block.
// Contract:  a, b, c are DEVICE float32 arrays of n elements; a and b are read-only, c is
//            written; c does not overlap a or b. 1 <= n <= 1024 (one block holds at most
//            1024 threads; for other n the launch fails and its error is returned).
//            Returns the launch error; does not synchronize.
// Test:      make test-lab1 TASK=01

#include "course.h"

// a (n,), b (n,) -> c (n,)
__global__ void vector_add_kernel(const float* __restrict__ a, const float* __restrict__ b,
                                  float* __restrict__ c, int n) {
    // TODO(lab1/01) begin: each thread adds the one element it owns, and a thread without an element touches no memory; see §2.4 and §2.5; about 2 lines; try n = 1, 31, 33 and 1024.
    int i = threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
    // TODO(lab1/01) end
}

COURSE_API cudaError_t vector_add(const float* a, const float* b, float* c, int n) {
    // TODO(lab1/01) begin: launch the kernel as a single block that covers all n elements; see §2.2 and §5.2; 1 line; n = 1 and n = 1024 are the edges.
    vector_add_kernel<<<1, n>>>(a, b, c, n);
    // TODO(lab1/01) end
    return cudaGetLastError();
}

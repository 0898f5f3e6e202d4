// course_cublaslt.h — what every cuBLASLt matmul of the course needs around its call: the four
// descriptors of one matmul, destroyed on every way out, and a pointer's alignment for the
// heuristic. Lab 3's task 03 (linear + ReLU in one matmul) and lab 7's task 03 (a linear layer's
// backward through the BGRAD and DGELU_BGRAD epilogues) both use them.
#pragma once

#include <cublasLt.h>

#include <cstdint>

// Destroys whatever of a matmul's descriptors exists when it goes out of scope: a CUBLAS_CHECK
// that returns early leaks none of them.
struct LtDescriptors {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    LtDescriptors() = default;
    LtDescriptors(const LtDescriptors&) = delete;  // one owner: a copy would destroy them twice
    LtDescriptors& operator=(const LtDescriptors&) = delete;
    ~LtDescriptors() {
        if (pref) cublasLtMatmulPreferenceDestroy(pref);
        if (d) cublasLtMatrixLayoutDestroy(d);
        if (b) cublasLtMatrixLayoutDestroy(b);
        if (a) cublasLtMatrixLayoutDestroy(a);
        if (op) cublasLtMatmulDescDestroy(op);
    }
};

// The largest power of two, up to the 256 bytes cuBLASLt assumes unless told, that divides p's
// address: what the preference's MIN_ALIGNMENT_*_BYTES must say, or the heuristic may pick a
// kernel whose 16-byte loads fault on a view that starts at an odd element.
inline uint32_t alignment_of(const void* p) {
    uint32_t bytes = 256;
    while (reinterpret_cast<uintptr_t>(p) % bytes != 0) bytes /= 2;
    return bytes;
}

// course.h — the few lines every task file shares.
//
// COURSE_API marks the entry points the grader calls through ctypes: C linkage keeps their
// names unmangled, default visibility keeps them exported from the shared library.
// CUDA_CHECK is the course's one error-check macro: it names the file and line of the failing
// call and returns the error from the enclosing function (which therefore returns cudaError_t),
// because a library loaded into Python must never call exit(). It also clears the runtime's
// "last error", so the cudaGetLastError() after the next healthy launch does not report it again.
#pragma once

#include <cuda_runtime.h>
#include <cstdio>

#define COURSE_API extern "C" __attribute__((visibility("default")))

#define CUDA_CHECK(call)                                                              \
    do {                                                                              \
        cudaError_t course_err_ = (call);                                             \
        if (course_err_ != cudaSuccess) {                                             \
            fprintf(stderr, "%s:%d: CUDA error %s (%s) in `%s`\n", __FILE__, __LINE__, \
                    cudaGetErrorName(course_err_), cudaGetErrorString(course_err_),    \
                    #call);                                                           \
            (void)cudaGetLastError();                                                 \
            return course_err_;                                                       \
        }                                                                             \
    } while (0)

// Lets the grader print error names with the same runtime the task was linked against.
// Every file of a task includes this header, and a task may have several: weak, so the linker
// keeps one definition instead of refusing the duplicates.
COURSE_API __attribute__((weak)) const char* course_error_name(int code) {
    return cudaGetErrorName(static_cast<cudaError_t>(code));
}

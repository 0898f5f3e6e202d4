// course_cublas.h — the CUDA_CHECK of cuBLAS and cuBLASLt, for tasks that link them.
//
// CUBLAS_CHECK names the failing call, its file and line and the status's name on stderr, and
// returns from the enclosing function, which returns cudaError_t like every entry point: cuBLAS
// statuses are not CUDA errors, so every failure reads as cudaErrorUnknown to the caller.
#pragma once

#include <cublas_v2.h>
#include <cstdio>

#define CUBLAS_CHECK(call)                                                                        \
    do {                                                                                          \
        cublasStatus_t course_status_ = (call);                                                   \
        if (course_status_ != CUBLAS_STATUS_SUCCESS) {                                            \
            fprintf(stderr, "%s:%d: cuBLAS error %s in `%s`\n", __FILE__, __LINE__,                \
                    cublasGetStatusName(course_status_), #call);                                  \
            return cudaErrorUnknown;                                                              \
        }                                                                                         \
    } while (0)

// course_scratch.h — one device scratch buffer per task library, kept from call to call.
//
// scratch(floats, &buffer) hands out a device buffer of at least `floats` floats. It is allocated by
// the first call and replaced only when a call needs more than any call before, so that timed
// calls after the warm-up pay for no cudaMalloc. The device is synchronized before the old buffer
// is freed, because kernels still queued may be reading it. Never freed: the process's exit
// releases it. One buffer per translation unit (the function is static): a task that needs two
// carves them out of one. Not thread-safe. Lab 2's task 00 has you write this yourself.
#pragma once

#include "course.h"

#include <cstddef>

static cudaError_t scratch(size_t floats, float** buffer) {
    static float* data = nullptr;
    static size_t capacity = 0;
    if (floats > capacity) {
        if (data != nullptr) {
            CUDA_CHECK(cudaDeviceSynchronize());
            CUDA_CHECK(cudaFree(data));
            data = nullptr;
            capacity = 0;
        }
        CUDA_CHECK(cudaMalloc(&data, floats * sizeof(float)));
        capacity = floats;
    }
    *buffer = data;
    return cudaSuccess;
}

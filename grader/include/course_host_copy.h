// course_host_copy.h — CPU copies between pageable and pinned host memory, on several threads.
//
// Only pinned memory can take part in an asynchronous copy, so a task whose caller hands it
// pageable arrays copies them into pinned staging buffers (and results back out) on the CPU. One
// core copies roughly 10 to 20 GB/s, less than a PCIe Gen5 link moves in one direction: on one
// thread these copies outlast every GPU stage (lab 2, tasks 04 and 06). host_copy splits the bytes
// of one or more copies into equal slices and copies them on up to HOST_COPY_THREADS threads, the
// calling one included. Small copies stay on the calling thread, since starting a thread costs
// some microseconds. Returns when every byte is copied.
//
//     host_copy({{pinned, x, bytes}});                                 // one copy
//     host_copy({{in_stage, x + next, in_bytes}, {y + prev, out_stage, out_bytes}});  // two at once
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <initializer_list>
#include <system_error>
#include <thread>

struct HostCopy {
    void* dst;
    const void* src;
    size_t bytes;
};

constexpr size_t HOST_COPY_THREADS = 8;
constexpr size_t HOST_COPY_MIN_SLICE = size_t(1) << 20;  // below this, a thread costs more than it saves

// Copies the bytes [begin, end) of the copies laid end to end.
static inline void host_copy_range(const HostCopy* copies, size_t count, size_t begin, size_t end) {
    size_t base = 0;  // where copies[i] starts in the concatenation
    for (size_t i = 0; i < count && begin < end; base += copies[i].bytes, ++i) {
        const size_t lo = std::max(begin, base), hi = std::min(end, base + copies[i].bytes);
        if (lo >= hi) continue;
        std::memcpy(static_cast<char*>(copies[i].dst) + (lo - base),
                    static_cast<const char*>(copies[i].src) + (lo - base), hi - lo);
    }
}

static inline void host_copy(std::initializer_list<HostCopy> list) {
    const HostCopy* copies = list.begin();
    const size_t count = list.size();
    size_t total = 0;
    for (const HostCopy& c : list) total += c.bytes;
    // asked once: glibc answers by reading /sys, tens of microseconds that a small copy should not pay
    static const size_t cores = std::max<size_t>(1, std::thread::hardware_concurrency());
    const size_t threads = std::max<size_t>(1, std::min({HOST_COPY_THREADS, cores, total / HOST_COPY_MIN_SLICE}));
    const size_t slice = (total + threads - 1) / threads;
    std::thread helpers[HOST_COPY_THREADS];
    for (size_t t = 1; t < threads && t * slice < total; ++t) {
        const size_t begin = t * slice, end = std::min(total, begin + slice);
        try {
            helpers[t] = std::thread([=] { host_copy_range(copies, count, begin, end); });
        } catch (const std::system_error&) {
            host_copy_range(copies, count, begin, end);  // no thread to spare: copy this slice here
        }
    }
    host_copy_range(copies, count, 0, std::min(slice, total));
    for (std::thread& h : helpers)
        if (h.joinable()) h.join();
}

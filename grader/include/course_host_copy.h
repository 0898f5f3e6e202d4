// course_host_copy.h — CPU copies between pageable and pinned host memory, on several threads.
//
// Only pinned memory can take part in an asynchronous copy, so a task whose caller hands it
// pageable arrays copies them into pinned staging buffers (and results back out) on the CPU. One
// core copies roughly 10 to 20 GB/s, less than a PCIe Gen5 link moves in one direction: on one
// thread these copies outlast every GPU stage (lab 2, tasks 04 and 06). host_copy splits the bytes
// of one or more copies into equal slices and copies them on up to HOST_COPY_THREADS threads, the
// calling one included. The helper threads start on the first large copy and then wait for the
// next one for the life of the process: waking a waiting thread costs a few microseconds where
// starting one costs tens, which a pipeline of small chunks would pay on every chunk. Small copies
// stay on the calling thread. Returns when every byte is copied. Calls from several threads at once
// take turns.
//
//     host_copy({{pinned, x, bytes}});                                 // one copy
//     host_copy({{in_stage, x + next, in_bytes}, {y + prev, out_stage, out_bytes}});  // two at once
#pragma once

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <initializer_list>
#include <mutex>
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

// The helper threads and the copy they are working on. Slice 0 of a copy is the caller's; the
// helpers take the others, one at a time, until none is left.
struct HostCopyPool {
    std::mutex turn;  // held by a caller for its whole copy
    std::mutex m;     // guards the fields below
    std::condition_variable work, done;
    const HostCopy* copies = nullptr;
    size_t count = 0, total = 0, slice = 0;
    size_t next = 0, slices = 0;  // the next slice to hand out, and how many this copy has
    size_t pending = 0;           // helpers' slices not copied yet
    size_t started = 0;           // helper threads running in this process
    pid_t owner = 0;              // the process that started them: a forked child inherits none
};

static inline void host_copy_helper(HostCopyPool* p) {
    std::unique_lock<std::mutex> lock(p->m);
    for (;;) {
        p->work.wait(lock, [p] { return p->next < p->slices; });
        const size_t begin = p->next++ * p->slice, end = std::min(p->total, begin + p->slice);
        const HostCopy* copies = p->copies;
        const size_t count = p->count;
        lock.unlock();
        host_copy_range(copies, count, begin, end);
        lock.lock();
        if (--p->pending == 0) p->done.notify_one();
    }
}

static inline void host_copy(std::initializer_list<HostCopy> list) {
    const HostCopy* copies = list.begin();
    const size_t count = list.size();
    size_t total = 0;
    for (const HostCopy& c : list) total += c.bytes;
    // asked once: glibc answers by reading /sys, tens of microseconds that a small copy should not pay
    static const size_t cores = std::max<size_t>(1, std::thread::hardware_concurrency());
    size_t threads = std::max<size_t>(1, std::min({HOST_COPY_THREADS, cores, total / HOST_COPY_MIN_SLICE}));
    if (threads == 1) {
        host_copy_range(copies, count, 0, total);
        return;
    }
    // never freed: its helpers wait for work until the process ends
    static HostCopyPool* const pool = new HostCopyPool;
    std::lock_guard<std::mutex> mine(pool->turn);
    std::unique_lock<std::mutex> lock(pool->m);
    if (pool->owner != getpid()) {  // the first copy of this process
        pool->owner = getpid();
        pool->started = 0;
    }
    while (pool->started + 1 < threads) {
        try {
            std::thread(host_copy_helper, pool).detach();
            ++pool->started;
        } catch (const std::system_error&) {
            break;  // no thread to spare: fewer slices
        }
    }
    threads = std::min(threads, pool->started + 1);
    const size_t slice = (total + threads - 1) / threads;
    pool->copies = copies;
    pool->count = count;
    pool->total = total;
    pool->slice = slice;
    pool->slices = (total + slice - 1) / slice;
    pool->next = 1;
    pool->pending = pool->slices - 1;
    lock.unlock();
    pool->work.notify_all();
    host_copy_range(copies, count, 0, std::min(slice, total));
    lock.lock();
    pool->done.wait(lock, [] { return pool->pending == 0; });
    pool->slices = 0;
}

// Lab 6 · Task 01 — Peer memory: which GPUs reach each other, and a kernel that reads a peer
//
// Implement: peer_can_access (the peer-access matrix of the first n devices) and peer_copy (a
//            kernel on device 0 that copies device 1's memory by reading it directly, through
//            peer access, with 16-byte loads where the pointers allow).
// Contract:  peer_can_access: out is a HOST int32 array of n * n; out[i * n + j] = 1 when device i
//            can access device j's memory directly (cudaDeviceCanAccessPeer), else 0; 0 on the
//            diagonal (a device's own memory is no peer's). 1 <= n <= the device count, else
//            cudaErrorInvalidDevice. Returns the first error.
//            peer_copy: dst is a DEVICE float32 array of n elements on device 0, src one on
//            device 1, at any 4-byte alignment; they do not overlap. dst[i] = src[i]. The copy is
//            a kernel launched on device 0's default stream that reads src through peer access:
//            no cudaMemcpy* (peer or not) in it. Enables device 0's access to device 1 once;
//            every later call finds it enabled (cudaErrorPeerAccessAlreadyEnabled), which is not
//            an error: clear it and go on. cudaErrorPeerAccessUnsupported where device 0 cannot
//            access device 1. Called with device 0 current, and leaves it current. 1 <= n (n may
//            pass 2^31). Returns the first error; does not synchronize.
// Test:      make test-lab6 TASK=01

#include <cstdint>

#include "course.h"

constexpr int THREADS = 256;

COURSE_API cudaError_t peer_can_access(int* out, int n) {
    // TODO(lab6/01) begin: count the devices, refuse an n the machine does not have, then ask cudaDeviceCanAccessPeer for every ordered pair i != j; see the chapter's section "P2P, UVA and the two calls"; about 10 lines; try it on a machine whose matrix you know from `nvidia-smi topo -m`.
    int count = 0;
    CUDA_CHECK(cudaGetDeviceCount(&count));
    if (n < 1 || n > count) return cudaErrorInvalidDevice;
    for (int i = 0; i < n; ++i) {
        for (int j = 0; j < n; ++j) {
            int can = 0;
            if (i != j) CUDA_CHECK(cudaDeviceCanAccessPeer(&can, i, j));
            out[i * n + j] = can ? 1 : 0;
        }
    }
    return cudaSuccess;
    //~ return cudaErrorNotYetImplemented;
    // TODO(lab6/01) end
}

// TODO(lab6/01) begin: a grid-stride copy kernel whose loads of src travel over the link: 16 bytes a load where dst and src sit alike on the 16-byte grid (the floats before the first boundary and after the last whole float4 copied on their own), 4 bytes a load where they do not; size_t indices; see the chapter's section "A kernel that reads a peer"; about 20 lines; try n = 1, 3 and a src one float into its buffer.
// dst (n,) on this device, src (n,) on the peer. `head` floats come before the first 16-byte
// boundary of both, then `quads` float4s, then the rest (fewer than 4). Pointers aligned unlike
// each other have no common grid: the caller passes head = n and quads = 0, and every float is
// copied on its own.
__global__ void peer_copy_kernel(float* __restrict__ dst, const float* __restrict__ src, size_t n, size_t head,
                                 size_t quads) {
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const float4* src4 = reinterpret_cast<const float4*>(src + head);
    float4* dst4 = reinterpret_cast<float4*>(dst + head);
    for (size_t i = tid; i < quads; i += stride) dst4[i] = src4[i];
    for (size_t i = tid; i < head; i += stride) dst[i] = src[i];
    for (size_t i = head + 4 * quads + tid; i < n; i += stride) dst[i] = src[i];
}

// Device `device`'s access to `peer`'s memory, enabled once: a second enable reports
// cudaErrorPeerAccessAlreadyEnabled, which also sits in the runtime's last error until read.
static cudaError_t enable_peer_access(int device, int peer) {
    int can = 0;
    CUDA_CHECK(cudaDeviceCanAccessPeer(&can, device, peer));
    if (!can) return cudaErrorPeerAccessUnsupported;
    const cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);  // from the current device
    if (e == cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError();
        return cudaSuccess;
    }
    return e;
}
// TODO(lab6/01) end

COURSE_API cudaError_t peer_copy(float* dst, const float* src, size_t n) {
    // TODO(lab6/01) begin: remember the current device, make device 0 current, enable its access to device 1, split n into head, float4s and tail by the pointers' alignment, launch on a grid that fills device 0's SMs, and make the caller's device current again whatever happened; see the chapter's section "A kernel that reads a peer"; about 20 lines; count head, quads and tail by hand for n = 3 with src one float in.
    int caller = 0;
    CUDA_CHECK(cudaGetDevice(&caller));
    CUDA_CHECK(cudaSetDevice(0));
    cudaError_t e = enable_peer_access(0, 1);
    if (e == cudaSuccess) {
        const bool alike = (((uintptr_t)dst ^ (uintptr_t)src) & 15) == 0;
        size_t head = n, quads = 0;
        if (alike) {
            head = ((16 - ((uintptr_t)src & 15)) & 15) / sizeof(float);
            if (head > n) head = n;
            quads = (n - head) / 4;
        }
        int sms = 0;
        e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
        if (e == cudaSuccess) {
            const size_t work = quads > n - 4 * quads ? quads : n - 4 * quads;  // the longest loop
            size_t blocks = (work + THREADS - 1) / THREADS;
            const size_t most = (size_t)sms * 8;  // 8 blocks of 256 fill an SM's 2048 threads
            if (blocks > most) blocks = most;
            if (blocks < 1) blocks = 1;
            peer_copy_kernel<<<(unsigned)blocks, THREADS>>>(dst, src, n, head, quads);
            e = cudaGetLastError();
        }
    }
    const cudaError_t back = cudaSetDevice(caller);
    return e != cudaSuccess ? e : back;
    //~ return cudaErrorNotYetImplemented;
    // TODO(lab6/01) end
}

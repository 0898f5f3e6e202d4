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
    return cudaErrorNotYetImplemented;  //~
    // TODO(lab6/01) end
}

// TODO(lab6/01) begin: a grid-stride copy kernel whose loads of src travel over the link: 16 bytes a load where dst and src sit alike on the 16-byte grid (the floats before the first boundary and after the last whole float4 copied on their own), 4 bytes a load where they do not; size_t indices; see the chapter's section "A kernel that reads a peer"; about 20 lines; try n = 1, 3 and a src one float into its buffer.
// TODO(lab6/01) end

COURSE_API cudaError_t peer_copy(float* dst, const float* src, size_t n) {
    // TODO(lab6/01) begin: remember the current device, make device 0 current, enable its access to device 1, split n into head, float4s and tail by the pointers' alignment, launch on a grid that fills device 0's SMs, and make the caller's device current again whatever happened; see the chapter's section "A kernel that reads a peer"; about 20 lines; count head, quads and tail by hand for n = 3 with src one float in.
    return cudaErrorNotYetImplemented;  //~
    // TODO(lab6/01) end
}

"""Honest lab 6 solutions written differently from the reference: each must pass under every seed.

tests/test_honest_alternatives.py grades each one (grader/instructor/honest.py) with several
values of GRADER_SEED, on a machine of as many GPUs as its task needs (tasks 02 to 04: 2). They
are edits to the reference solutions; each changes what a student could legitimately choose
otherwise: the grid, how the all-gather moves its bytes, how the flags are spelled, the order of
the sum, how the NCCL call is waited for.
"""

from __future__ import annotations

from grader.instructor.honest import Alternative

RING_AG_LOOP = (
    "    for (int s = 0; s < world - 1; ++s) {  // all-gather\n"
    "        const int c = ((rank - s) % world + world) % world;\n"
    "        const size_t start = c * chunk < n ? c * chunk : n, end = start + chunk < n ? start + chunk : n;\n"
    "        ring_step<false>(own, left, start, end);\n"
    "        block_barrier(peers, rank, world, ++epoch);  // the last: no peer reads this buffer any more\n"
    "    }\n"
)
RING_LAUNCH = (
    "    ring_kernel<<<blocks, THREADS, 0, stream>>>(c->peers, epochs, c->rank, c->world, n, chunk);\n"
    "    CUDA_CHECK(cudaGetLastError());\n"
)

ALTERNATIVES: dict[str, Alternative] = {
    "02_ring.small_grid": Alternative(
        "02_ring.cu",
        [
            ("constexpr int MAX_BLOCKS = 128;", "constexpr int MAX_BLOCKS = 8;"),
            ("constexpr int THREADS = 512;", "constexpr int THREADS = 128;"),
            ("constexpr int UNROLL = 4;", "constexpr int UNROLL = 1;"),
        ],
        "a grid of at most 8 blocks of 128 threads, one float4 in flight a thread: slower, as right",
    ),
    "02_ring.all_gather_by_copy_engine": Alternative(
        "02_ring.cu",
        [
            (RING_AG_LOOP, ""),
            (
                "// TODO(lab6/02) end\n\nCOURSE_API cudaError_t ring_all_reduce(",
                "// every block of every rank meets once: after this rank's copies, before its next input\n"
                "__global__ void ring_exit_kernel(Peers peers, uint32_t* epochs, int rank, int world) {\n"
                "    uint32_t epoch = epochs[blockIdx.x];\n"
                "    block_barrier(peers, rank, world, ++epoch);\n"
                "    if (threadIdx.x == 0) epochs[blockIdx.x] = epoch;\n"
                "}\n"
                "// TODO(lab6/02) end\n\nCOURSE_API cudaError_t ring_all_reduce(",
            ),
            (
                RING_LAUNCH,
                RING_LAUNCH
                + "    // the all-gather by the copy engines: rank p holds chunk (p + 1) mod world, summed; the\n"
                "    // kernel's last barrier says every rank has finished its reduce-scatter\n"
                "    for (int p = 0; p < c->world; ++p) {\n"
                "        if (p == c->rank) continue;\n"
                "        const size_t k = (size_t)((p + 1) % c->world);\n"
                "        const size_t start = k * chunk < n ? k * chunk : n, end = start + chunk < n ? start + chunk : n;\n"  # noqa: E501
                "        if (end > start)\n"
                "            CUDA_CHECK(cudaMemcpyAsync(c->peers.data[c->rank] + start, c->peers.data[p] + start,\n"
                "                                       (end - start) * sizeof(float), cudaMemcpyDeviceToDevice, stream));\n"  # noqa: E501
                "    }\n"
                "    ring_exit_kernel<<<blocks, 32, 0, stream>>>(c->peers, epochs, c->rank, c->world);\n"
                "    CUDA_CHECK(cudaGetLastError());\n",
            ),
        ],
        "the reduce-scatter in the kernel, the all-gather as cudaMemcpyAsync from each chunk's owner, then a "
        "barrier kernel so that no rank writes its next input while a peer still copies from it",
    ),
    "03_one_shot.atomic_ref_flags": Alternative(
        "03_one_shot.cu",
        [
            ("#include <cstring>\n", "#include <cstring>\n#include <cuda/atomic>\n"),
            (
                '    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");',
                "    cuda::atomic_ref<uint32_t, cuda::thread_scope_system>(*p).store(v, cuda::memory_order_release);",
            ),
            (
                "    uint32_t v;\n"
                '    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");\n'
                "    return v;",
                "    return cuda::atomic_ref<uint32_t, cuda::thread_scope_system>(*const_cast<uint32_t*>(p))\n"
                "        .load(cuda::memory_order_acquire);",
            ),
        ],
        "the flags through libcu++'s cuda::atomic_ref at system scope instead of inline PTX",
    ),
    "04_nccl.async_then_wait": Alternative(
        "kiln_tp/cuda.py",
        [
            (
                "                dist.all_reduce(out, op=op)\n",
                "                # the work's wait() makes the current stream (ex.stream) wait for NCCL's; the host\n"
                "                # goes on at once, as with async_op=False\n"
                "                dist.all_reduce(out, op=op, async_op=True).wait()\n",
            )
        ],
        "the reduction queued with async_op=True and its work's wait() called at once: the same stream order "
        "as async_op=False, spelled the way overlapping code does",
    ),
    "03_one_shot.own_buffer_first": Alternative(
        "03_one_shot.cu",
        [
            (
                "            for (int p = 0; p < world; ++p) {  // rank order: every rank adds the same numbers the same way\n"  # noqa: E501
                "                const float4 v = __ldcg(reinterpret_cast<const float4*>(peers.data[p] + i));\n",
                "            for (int k = 0; k < world; ++k) {  // its own buffer first (exact for whole numbers)\n"
                "                const int p = (rank + k) % world;\n"
                "                const float4 v = __ldcg(reinterpret_cast<const float4*>(peers.data[p] + i));\n",
            ),
        ],
        "the buffers added starting from its own: the ranks' sums may differ in their last bits for arbitrary "
        "floats, and the grader's whole-number inputs make every order exact",
    ),
}

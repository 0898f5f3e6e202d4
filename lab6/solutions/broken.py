"""Deliberately broken lab 6 submissions, written as edits to the reference solutions.

tests/test_broken_variants.py applies each edit, grades the result and expects the verdict given
here, as for the other labs. Task 05 (tensor-parallel LLaMA, its sharding and its graph) is graded
on the CPU with gloo, so its variants are graded on every machine, CI included. Task 01 (peer
memory), tasks 02 and 03 (the ring and one-shot all-reduces over CUDA IPC memory) and task 04
(the all_reduce lowered to NCCL) need 2 GPUs: their variants are graded on a machine that shows 2
or more, except the one the build's rule catches (AT_BUILD), graded anywhere nvcc runs; those of
tasks 02 and 03 are compiled everywhere nvcc runs (tests/test_broken_variants.py). Each variant
names its class of mistake, one of those the task's spec lists in `mistakes`.
"""

from __future__ import annotations

from grader.instructor.broken import Variant

SHARD = "kiln_tp/shard.py"
PEER = "01_peer.cu"
NCCL = "kiln_tp/cuda.py"
RING = "02_ring.cu"
ONE_SHOT = "03_one_shot.cu"
# the flag's acquire load in tasks 02 and 03, which their first variants make a plain load
ACQUIRE_LOAD = 'asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");'
PLAIN_LOAD = "v = *p;  // the peer's release store is enough"
# the solution's launch body, which most of task 04's variants rewrite
COPY = "            out.copy_(x)  # a cudaMemcpyAsync into the planned slot; x keeps its value\n"
COPY_THEN_REDUCE = (
    COPY + "            if world > 1:\n"
    "                # NCCL, in place on out; async_op=False: ex.stream waits for the reduction (the host does\n"
    "                # not), so the next launch on ex.stream reads the sum\n"
    "                dist.all_reduce(out, op=op)\n"
)

VARIANTS: dict[str, Variant] = {
    "01_peer.never_enabled": Variant(
        PEER,
        [
            (
                "    const cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);  // from the current device",
                "    const cudaError_t e = cudaSuccess;  // UVA: every device sees one address space already",
            )
        ],
        {"crash"},
        "peer_copy",
        "peer access checked with cudaDeviceCanAccessPeer but never enabled: UVA gives the kernel src's address, "
        "not a mapping of device 1's memory in device 0's page tables, and its first load faults",
        mistake="peer access not enabled",
    ),
    "01_peer.already_enabled_left_in_last_error": Variant(
        PEER,
        [
            (
                "    if (e == cudaErrorPeerAccessAlreadyEnabled) {\n"
                "        (void)cudaGetLastError();\n"
                "        return cudaSuccess;",
                "    if (e == cudaErrorPeerAccessAlreadyEnabled) {  // enabled by an earlier call: fine\n"
                "        return cudaSuccess;",
            )
        ],
        {"crash"},
        "cudaErrorPeerAccessAlreadyEnabled",
        "the second enable's error is recognised but not cleared: the cudaGetLastError() after the launch returns it, "
        "so every call after the first fails",
        mistake="already enabled",
    ),
    "01_peer.tail_dropped": Variant(
        PEER,
        [("    for (size_t i = head + 4 * quads + tid; i < n; i += stride) dst[i] = src[i];\n", "")],
        {"wrong"},
        "peer_copy, case n=",
        "the floats after the last whole float4 are never copied (n = 1, 3, 2^20 + 1)",
        mistake="tail",
    ),
    "01_peer.float4_from_unaligned_src": Variant(
        PEER,
        [
            (
                "        const bool alike = (((uintptr_t)dst ^ (uintptr_t)src) & 15) == 0;",
                "        const bool alike = ((uintptr_t)dst & 15) == 0;  // cudaMalloc aligns to 256 bytes",
            )
        ],
        {"crash"},
        "misaligned",
        "the 16-byte path chosen from dst's alignment alone: with src one float into its buffer, the float4 "
        "accesses after the head are 4 bytes off the grid on one side",
        mistake="unaligned pointer",
    ),
    "01_peer.launched_on_device_1": Variant(
        PEER,
        [
            (
                "    CUDA_CHECK(cudaSetDevice(0));\n    cudaError_t e = enable_peer_access(0, 1);",
                "    CUDA_CHECK(cudaSetDevice(1));  // run where src lives: local reads, only the writes cross\n"
                "    cudaError_t e = enable_peer_access(1, 0);",
            )
        ],
        {"wrong"},
        "another device",
        "the kernel launched on device 1, writing dst through device 1's access to device 0: the right bytes, but "
        "on a device and stream the caller does not wait on (the contract launches on device 0)",
        mistake="wrong device",
    ),
    "01_peer.diagonal_set": Variant(
        PEER,
        [("            int can = 0;\n", "            int can = 1;  // a device always reaches its own memory\n")],
        {"wrong"},
        "peer_can_access",
        "the diagonal set to 1: a device's own memory is not a peer's (and cudaDeviceEnablePeerAccess refuses it)",
        mistake="diagonal",
    ),
    "01_peer.copy_engine": Variant(
        PEER,
        [
            (
                "            peer_copy_kernel<<<(unsigned)blocks, THREADS>>>(dst, src, n, head, quads);",
                "            cudaMemcpyPeerAsync(dst, 0, src, 1, n * sizeof(float), 0);  // the copy engine does it",
            )
        ],
        {"rule violation"},
        "cudaMemcpy",
        "the copy handed to the copy engine (cudaMemcpyPeerAsync): the baseline, not a kernel reading the peer",
        mistake="copy engine",
    ),
    "05_tensor_parallel.q_heads_round_robin": Variant(
        SHARD,
        [
            (
                "    q, kv, f = share(local.n_heads * dh), share(local.n_kv_heads * dh), share(local.hidden_dim)",
                "    # query heads dealt out like cards, head h to rank h % world (wo's columns follow them)\n"
                "    q = torch.arange(config.n_heads * dh).view(config.n_heads, dh)[rank::world].reshape(-1)\n"
                "    kv, f = share(local.n_kv_heads * dh), share(local.hidden_dim)",
            )
        ],
        {"wrong"},
        "test_world2_matches_unsharded[gqa]",
        "query heads dealt round-robin (h % world) while kv heads go in blocks: rank 0's head 2 belongs to kv "
        "group 0 at 8 heads over 2, head 6 to group 1, which rank 1 holds",
        mistake="gqa grouping",
    ),
    "05_tensor_parallel.wo_by_rows": Variant(
        SHARD,
        [('out[p + "wo"] = weights[p + "wo"][:, q].contiguous()', 'out[p + "wo"] = weights[p + "wo"][q].contiguous()')],
        {"wrong"},
        "test_shard_slices",
        "wo sliced like wq, by rows (its outputs), instead of by the columns the rank's heads feed",
        mistake="wo by rows",
    ),
    "05_tensor_parallel.residual_inside_the_all_reduce": Variant(
        SHARD,
        [('x = x + all_reduce(linear(a, p + "wo"))', 'x = all_reduce(x + linear(a, p + "wo"))')],
        {"wrong"},
        "test_world2_matches_unsharded",
        "the attention's all-reduce placed after the residual add: every rank's copy of x is summed, W times x",
        mistake="residual in the all-reduce",
    ),
    "05_tensor_parallel.mlp_not_reduced": Variant(
        SHARD,
        [('x = x + all_reduce(linear(g, p + "w2"))', 'x = x + linear(g, p + "w2")')],
        {"wrong"},
        "test_graph_structure",
        "the MLP's down projection not all-reduced: each rank adds only its own columns' partial sum",
        mistake="missing all-reduce",
    ),
    "05_tensor_parallel.whole_kv_cache": Variant(
        SHARD,
        [
            (
                "        n_kv_heads=config.n_kv_heads // world,",
                "        n_kv_heads=config.n_kv_heads,  # k and v are small under GQA: every rank keeps them whole",
            ),
            ('(("wq", q), ("wk", kv), ("wv", kv),', '(("wq", q), ("wk", slice(None)), ("wv", slice(None)),'),
            (
                '        a = b.op("attention", q, kc, vc, pos, scale=dh**-0.5)',
                "        mine = config.n_kv_heads // config.world\n"
                "        rows = {'starts': [0, config.rank * mine, 0], 'ends': [max_seq, (config.rank + 1) * mine, dh]}\n"  # noqa: E501
                "        kc, vc = b.op('slice', kc, **rows), b.op('slice', vc, **rows)  # the rank's kv heads\n"
                '        a = b.op("attention", q, kc, vc, pos, scale=dh**-0.5)',
            ),
        ],
        {"wrong"},
        "test_shard_slices",
        "k and v computed and cached whole on every rank, the rank's kv heads sliced out for attention: right "
        "logits at 8 heads over 2 with W times the cache memory (test_local_caches), but also whole wk/wv "
        "(test_shard_slices) and a local config of 2 heads over 4 kv heads that MHA refuses",
        mistake="whole kv cache",
    ),
    "05_tensor_parallel.interleaved_sliced_as_half": Variant(
        SHARD,
        [
            (
                "from llama.checkpoint import check_weights",
                "from llama.checkpoint import check_weights, convert_rope_layout",
            ),
            (
                "    dh = config.head_dim\n",
                "    dh = config.head_dim\n"
                '    _, weights = convert_rope_layout(config, weights, "half")  # one layout to slice\n',
            ),
        ],
        {"wrong"},
        "gqa_interleaved",
        "the checkpoint brought to the half layout before slicing, the local config still saying interleaved: "
        "RoPE turns the wrong pairs of a llama2.c checkpoint",
        mistake="rope layout",
    ),
    "05_tensor_parallel.classifier_sharded": Variant(
        SHARD,
        [
            (
                "    return local, out\n",
                '    out["output"] = weights["output"][share(config.vocab_size // world)].contiguous()\n'
                "    return local, out\n",
            )
        ],
        {"wrong"},
        "output",
        "the classifier split by vocabulary rows like a column-parallel linear, with no gather of the logits",
        mistake="sharded classifier",
    ),
    "05_tensor_parallel.hidden_dim_not_checked": Variant(
        SHARD,
        [('for field in ("n_heads", "n_kv_heads", "hidden_dim"):', 'for field in ("n_heads", "n_kv_heads"):')],
        {"wrong"},
        "test_refuses_indivisible",
        "hidden_dim not checked: 90 over 4 ranks gives each 22 columns, and 2 of the MLP's columns are dropped",
        mistake="indivisible accepted",
    ),
    "04_nccl.sum_in_a_new_tensor": Variant(
        NCCL,
        [
            (
                COPY_THEN_REDUCE,
                "            total = x.clone()  # as the CPU kernel does: a tensor of its own for the sum\n"
                "            if world > 1:\n"
                "                dist.all_reduce(total, op=op)\n",
            )
        ],
        {"wrong"},
        "test_all_reduce_graph",
        "the sum made in a tensor the launch allocates (the CPU kernel's way): the node's slot of the arena, "
        "which the next launch reads, is never written, and inside a capture the tensor is the graph's",
        mistake="output slot",
    ),
    "04_nccl.input_not_copied": Variant(
        NCCL,
        [(COPY, "")],
        {"wrong"},
        "test_all_reduce_graph",
        "out reduced in place without x copied into it: the ranks add whatever an earlier node or run left in the slot",
        mistake="input not copied",
    ),
    "04_nccl.input_reduced_in_place": Variant(
        NCCL,
        [
            (
                COPY_THEN_REDUCE,
                "            if world > 1:\n"
                "                dist.all_reduce(x, op=op)  # the partial sum reduced where it lies\n"
                "            out.copy_(x)\n",
            )
        ],
        {"wrong"},
        "test_all_reduce_graph",
        "x all-reduced in place, then copied: right where nothing else reads x (the model's all-reduces), wrong for "
        "the z = y + x that reads it after",
        mistake="input reduced in place",
    ),
    "04_nccl.reduced_when_lowered": Variant(
        NCCL,
        [
            (
                "    def launch() -> int:\n"
                "        with torch.cuda.stream(stream):  # current in a capture; not in the capture's warm-up\n"
                + COPY_THEN_REDUCE
                + "        return 0\n\n    return launch\n",
                "    with torch.cuda.stream(stream):  # the work done once, here, when the executor is built\n"
                + "\n".join(line[4:] for line in COPY_THEN_REDUCE.splitlines())
                + "\n    return lambda: 0\n",
            )
        ],
        {"wrong"},
        "test_all_reduce_graph",
        "the copy and the reduction made by the lowering, once, when the executor is built (on an arena of zeros): "
        "the launch every run repeats does nothing",
        mistake="reduced when lowered",
    ),
    "04_nccl.synchronizes": Variant(
        NCCL,
        [
            (
                "                dist.all_reduce(out, op=op)\n",
                "                dist.all_reduce(out, op=op)\n"
                "            torch.cuda.synchronize()  # make sure the sum has landed before the next launch\n",
            )
        ],
        {"wrong", "timeout"},
        "test_all_reduce_graph",
        "a launch that waits for the device on the host: right when launched one by one, but a CUDA graph "
        "cannot capture it, and the executor's capture fails",
        mistake="waits on the host",
    ),
    "04_nccl.not_waited": Variant(
        NCCL,
        [
            (
                "                dist.all_reduce(out, op=op)\n",
                "                dist.all_reduce(out, op=op, async_op=True)  # returns at once\n",
            )
        ],
        {"wrong", "crash", "timeout"},
        "test_all_reduce_graph",
        "the reduction queued with async_op=True and its work never waited for: it runs on NCCL's own stream, "
        "and the next launch on ex.stream reads the slot before the sum is there (rank 1 late makes it certain); "
        "inside a capture NCCL's stream is never joined back",
        mistake="not waited",
    ),
    "02_ring.flag_plain_load": Variant(
        RING,
        [(ACQUIRE_LOAD, PLAIN_LOAD)],
        {"wrong", "timeout"},
        "test_",
        "the flag read with a plain load: nothing tells the compiler or the L1 cache that another GPU writes it, so "
        "the wait loop keeps an old value (and waits forever) or is dropped (and reads the peer's data too early)",
        mistake="flag without acquire",
    ),
    "02_ring.epoch_not_stored": Variant(
        RING,
        [("    if (threadIdx.x == 0) epochs[blockIdx.x] = epoch;\n}\n// TODO(lab6/02) end", "}\n// TODO(lab6/02) end")],
        {"wrong"},
        "test_late_rank",
        "the block's epoch never written back: every call counts its barriers from 0 again, and the flags left by "
        "the previous call already say every peer has arrived",
        mistake="epoch not advanced",
    ),
    "02_ring.tail_dropped": Variant(
        RING,
        [
            (
                "    for (size_t i = 4 * quads + tid; i < len; i += stride) {\n"
                "        const float v = __ldcg(left + start + i);\n"
                "        own[start + i] = REDUCE ? own[start + i] + v : v;\n"
                "    }\n",
                "",
            )
        ],
        {"wrong"},
        "test_sizes",
        "the floats after a chunk's last whole float4 never reduced nor gathered (n = 5: chunk 1 is one float)",
        mistake="tail",
    ),
    "02_ring.chunk_rounded_down": Variant(
        RING,
        [
            (
                "    const size_t chunk = ((n + c->world - 1) / c->world + 3) / 4 * 4;",
                "    const size_t chunk = (n / c->world + 3) / 4 * 4;  // n / world, to a multiple of 4",
            )
        ],
        {"wrong"},
        "test_sizes",
        "the chunk is n / world rounded down before it is rounded up to 4 floats: at n = 1 it is 0 (every chunk "
        "empty, nothing summed) and at n = 9 the last float is in no chunk",
        mistake="n < world",
    ),
    "02_ring.chunk_not_multiple_of_4": Variant(
        RING,
        [
            (
                "    const size_t chunk = ((n + c->world - 1) / c->world + 3) / 4 * 4;",
                "    const size_t chunk = (n + c->world - 1) / c->world;  // n / world, rounded up",
            )
        ],
        {"wrong", "crash"},
        "test_sizes",
        "chunks of n / world floats: at n = 1001 the second chunk starts at float 501, off the 16-byte grid, and "
        "its float4 accesses are misaligned",
        mistake="vector alignment",
    ),
    "02_ring.no_all_gather": Variant(
        RING,
        [
            (
                "    for (int s = 0; s < world - 1; ++s) {  // all-gather\n"
                "        const int c = ((rank - s) % world + world) % world;\n"
                "        const size_t start = c * chunk < n ? c * chunk : n, end = start + chunk < n ? start + chunk : n;\n"  # noqa: E501
                "        ring_step<false>(own, left, start, end);\n"
                "        block_barrier(peers, rank, world, ++epoch);  // the last: no peer reads this buffer any more\n"
                "    }\n",
                "",
            )
        ],
        {"wrong"},
        "test_sizes",
        "the reduce-scatter alone: each rank holds one chunk of the sum and its own partial sums elsewhere",
        mistake="no all-gather",
    ),
    "02_ring.gathered_on_rank_0_only": Variant(
        RING,
        [
            (
                "        ring_step<false>(own, left, start, end);\n",
                "        if (rank == 0) ring_step<false>(own, left, start, end);  // the root collects the result\n",
            )
        ],
        {"wrong"},
        "rank 1",
        "the all-gather made on rank 0 alone, as a reduce to a root would: rank 1 keeps one summed chunk",
        mistake="result on rank 0 only",
    ),
    "02_ring.legacy_stream": Variant(
        RING,
        [
            (
                "    ring_kernel<<<blocks, THREADS, 0, stream>>>(",
                "    ring_kernel<<<blocks, THREADS>>>(",
            )
        ],
        {"wrong"},
        "test_stream",
        "the kernel launched on the legacy default stream, not the caller's: it runs before the input's copy "
        "queued on the caller's stream, and inside a graph's capture the launch fails",
        mistake="wrong stream",
    ),
    "02_ring.no_entry_barrier": Variant(
        RING,
        [("    block_barrier(peers, rank, world, ++epoch);  // every rank's input is in its buffer\n", "")],
        {"wrong"},
        "test_late_rank",
        "no barrier before the first step: a rank reads its left neighbour's chunk before that neighbour has "
        "written its input (a late rank's buffer still holds the previous sum)",
        mistake="no entry barrier",
    ),
    "02_ring.no_exit_barrier": Variant(
        RING,
        [
            (
                "        block_barrier(peers, rank, world, ++epoch);  // the last: no peer reads this buffer any more\n",  # noqa: E501
                "        if (s < world - 2) block_barrier(peers, rank, world, ++epoch);  // the last step needs no wait\n",  # noqa: E501
            )
        ],
        {"wrong"},
        "test_slow_reader",
        "no barrier after the last all-gather step: a rank returns while its right neighbour may still be copying "
        "the last chunk from its buffer, and the next input the caller writes there is what that neighbour copies",
        mistake="buffer reused while read",
    ),
    "03_one_shot.flag_plain_load": Variant(
        ONE_SHOT,
        [(ACQUIRE_LOAD, PLAIN_LOAD)],
        {"wrong", "timeout"},
        "test_",
        "the flag read with a plain load: the wait loop keeps an old value (and waits forever) or is dropped (and "
        "reads the peers' buffers too early)",
        mistake="flag without acquire",
    ),
    "03_one_shot.epoch_not_stored": Variant(
        ONE_SHOT,
        [("    if (threadIdx.x == 0) epochs[blockIdx.x] = epoch;\n}\n// TODO(lab6/03) end", "}\n// TODO(lab6/03) end")],
        {"wrong"},
        "test_late_rank",
        "the block's epoch never written back: the flags of the previous call already say every peer has arrived",
        mistake="epoch not advanced",
    ),
    "03_one_shot.tail_dropped": Variant(
        ONE_SHOT,
        [
            (
                "            *reinterpret_cast<float4*>(own + i) = sum;\n"
                "        } else if (i < n) {\n"
                "            const float* s = &sum.x;\n"
                "            for (size_t k = i; k < n; ++k) own[k] = s[k - i];\n"
                "        }\n",
                "            *reinterpret_cast<float4*>(own + i) = sum;\n        }\n",
            )
        ],
        {"wrong"},
        "test_sizes",
        "the sums of the floats after the last whole float4 computed but never written (n = 1, 2, 3, 5, ...)",
        mistake="tail",
    ),
    "03_one_shot.last_float4_whole": Variant(
        ONE_SHOT,
        [
            (
                "        if (i + 4 <= n) {\n            *reinterpret_cast<float4*>(own + i) = sum;\n",
                "        if (i < n) {  // the buffer is padded: a whole float4 fits\n"
                "            *reinterpret_cast<float4*>(own + i) = sum;\n",
            )
        ],
        {"wrong"},
        "past n",
        "the last float4 written whole where fewer than 4 floats are left: the floats past n become 0",
        mistake="writes past n",
    ),
    "03_one_shot.own_input_left_out": Variant(
        ONE_SHOT,
        [
            (
                "            for (int p = 0; p < world; ++p) {  // rank order: every rank adds the same numbers the same way\n",  # noqa: E501
                "            for (int p = 0; p < world; ++p) {  // rank order: every rank adds the same numbers the same way\n"  # noqa: E501
                "                if (p == rank) continue;  // the peers' inputs, added to this one's\n",
            )
        ],
        {"wrong"},
        "test_sizes",
        "only the peers' buffers added, overwriting this rank's input instead of adding to it",
        mistake="own input left out",
    ),
    "03_one_shot.written_on_rank_0_only": Variant(
        ONE_SHOT,
        [
            (
                "        if (i + 4 <= n) {\n            *reinterpret_cast<float4*>(own + i) = sum;\n",
                "        if (rank == 0 && i + 4 <= n) {  // the root keeps the result\n"
                "            *reinterpret_cast<float4*>(own + i) = sum;\n",
            )
        ],
        {"wrong"},
        "rank 1",
        "the sum written on rank 0 alone, as a reduce to a root would: rank 1 keeps its input",
        mistake="result on rank 0 only",
    ),
    "03_one_shot.legacy_stream": Variant(
        ONE_SHOT,
        [
            (
                "    one_shot_kernel<<<blocks, THREADS, 0, stream>>>(",
                "    one_shot_kernel<<<blocks, THREADS>>>(",
            )
        ],
        {"wrong"},
        "test_stream",
        "the kernel launched on the legacy default stream, not the caller's: it runs before the input's copy "
        "queued on the caller's stream, and inside a graph's capture the launch fails",
        mistake="wrong stream",
    ),
    "03_one_shot.no_entry_barrier": Variant(
        ONE_SHOT,
        [("    block_barrier(peers, rank, world, ++epoch);  // every rank's input is in its buffer\n", "")],
        {"wrong"},
        "test_late_rank",
        "no barrier before the reads: a rank adds its peers' buffers before they have written their inputs (a late "
        "rank's buffer still holds the previous sum)",
        mistake="no entry barrier",
    ),
    "03_one_shot.sum_before_peers_read": Variant(
        ONE_SHOT,
        [
            (
                "        block_barrier(peers, rank, world, ++epoch);  // every rank has read these elements of this buffer\n",  # noqa: E501
                "",
            ),
            (
                "            for (size_t k = i; k < n; ++k) own[k] = s[k - i];\n        }\n    }\n",
                "            for (size_t k = i; k < n; ++k) own[k] = s[k - i];\n        }\n"
                "        block_barrier(peers, rank, world, ++epoch);  // the round is done on every rank\n    }\n",
            ),
        ],
        {"wrong"},
        "test_slow_reader",
        "each round's sum written into the buffer before the barrier that says every peer has read it: a slower "
        "peer reads this rank's sum in place of its input",
        mistake="buffer reused while read",
    ),
}

PEER_VARIANTS = [name for name in VARIANTS if name.startswith("01_")]
TP_VARIANTS = [name for name in VARIANTS if name.startswith("05_")]
NCCL_VARIANTS = [name for name in VARIANTS if name.startswith("04_")]
RING_VARIANTS = [name for name in VARIANTS if name.startswith("02_")]
ONE_SHOT_VARIANTS = [name for name in VARIANTS if name.startswith("03_")]
# one variant of each task per grading run: each task's next beside the others' while they last
_PER_TASK = [PEER_VARIANTS, RING_VARIANTS, ONE_SHOT_VARIANTS, NCCL_VARIANTS, TP_VARIANTS]
BATCHES = [[name for names in _PER_TASK for name in names[i : i + 1]] for i in range(max(len(n) for n in _PER_TASK))]
SANITIZED: list[str] = []
AT_BUILD: list[str] = ["01_peer.copy_engine"]
HUGE: list[str] = []
TIMED: list[str] = []

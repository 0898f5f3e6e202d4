"""Deliberately broken lab 6 submissions, written as edits to the reference solutions.

tests/test_broken_variants.py applies each edit, grades the result and expects the verdict given
here, as for the other labs. Task 05 (tensor-parallel LLaMA, its sharding and its graph) is graded
on the CPU with gloo, so its variants are graded on every machine, CI included. Task 01 (peer
memory) and task 04 (the all_reduce lowered to NCCL) need 2 GPUs: their variants are graded on a
machine that shows 2 or more, except the one the build's rule catches (AT_BUILD), graded anywhere
nvcc runs. Each variant names its class of mistake, one of those the task's spec lists in `mistakes`.
"""

from __future__ import annotations

from grader.instructor.broken import Variant

SHARD = "kiln_tp/shard.py"
PEER = "01_peer.cu"
NCCL = "kiln_tp/cuda.py"
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
}

PEER_VARIANTS = [name for name in VARIANTS if name.startswith("01_")]
TP_VARIANTS = [name for name in VARIANTS if name.startswith("05_")]
NCCL_VARIANTS = [name for name in VARIANTS if name.startswith("04_")]
# one variant of each task per grading run: task 01's beside task 04's and task 05's while they last
BATCHES = [
    PEER_VARIANTS[i : i + 1] + NCCL_VARIANTS[i : i + 1] + TP_VARIANTS[i : i + 1]
    for i in range(max(len(PEER_VARIANTS), len(NCCL_VARIANTS), len(TP_VARIANTS)))
]
SANITIZED: list[str] = []
AT_BUILD: list[str] = ["01_peer.copy_engine"]
HUGE: list[str] = []
TIMED: list[str] = []

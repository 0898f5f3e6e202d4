"""Checks for lab4/kiln/kernels/matmul.cu: kiln_matmul, a batched float32 matmul
c[i] (m, n) = a[i] (m, k) @ b[i] (k, n) with a shared-memory tiled kernel, on a caller's stream.

The inputs. a and b are standard normal. The shapes, written batch x m x k x n: 1x1x1x1, 1x1x1x7
and 1x7x1x1 are one partial tile; from 33x17x65 to 127x255x129 no dimension is a multiple of the
64 x 64 tile or of the 16-wide step along k, so every partial tile and the last partial step of k
are met; batched cases broadcast b (a batch of activations times one weight: b's batch stride 0),
broadcast a, or batch both; k = 4096 is the longest sum the contract promises (the decode-like
4x1x4096x31 and 64x4096x64). The case past 2^31 elements of c (`make grade`, 65537 x 2 x 32769)
catches 32-bit offsets.

The tolerance is lab 2's SGEMM's (lab2/tests/test_14_sgemm.py says why in full): each element is a
float32 sum of k products; for standard normal inputs its rounding error grows like
2^-24 · k / sqrt(6), about 1e-4 at k = 4096, and a float64 emulation of the longest chain measured
at most 8.2e-4 over 2^20 elements. atol = 4e-3 (no rtol) leaves a factor of about 5; a lost term
(|a_ik b_kj|, over 4e-3 for 98% of them), a lost tail of k, TF32 (about 2.5e-4 · sqrt(k) rms) and
an fp16 copy of the answer (where |c| passes 16) are all rejected.

The stream. `replays_in_a_cuda_graph` captures one call into a CUDA graph (on torch's capture
stream) and replays it on new a and b copied into the same buffers: a launch on another stream, a
synchronization or an allocation makes the capture fail, as it would for kiln's whole-model graph.

Performance. The timing case 1x1024x1024x1024 is timed against torch.matmul (cuBLAS in float32,
TF32 off). A 64 x 64 tile with a 4 x 4 register block per thread does 16 FMAs per two 16-byte
shared-memory loads; lab 2's ladder goes further (larger per-thread tiles, float4 global loads,
warp tiling). The performance points need a quarter of cuBLAS's speed. They are not a gate
(`make verify` does not hold the reference solution to them) until the target has been measured on
the course's cards: this kernel's share of cuBLAS at this size depends on the card's SM count (a
1024^2 output is only 256 tiles, fewer than two per SM of an H100's 132: one wave, its SMs not all
equally busy) more than on the student's code.

TASK.mistakes names the class of mistake each case is there to catch; lab4/solutions/broken.py
has a broken variant for each (graded on a GPU).
"""

from grader.child.context import RunContext
from grader.tasks import NO_LIBRARIES, Case, CudaTask, Entry, In, Out, PerfTarget, uses_shared_memory, uses_syncthreads
from grader.tasks.spec import Scalar

STREAM = Scalar("stream", "u64")
SIZES = ["batch", "m", "n", "k", "a_batch_stride", "b_batch_stride"]
ARGS = [Out("c"), In("a"), In("b"), *(Scalar(s, "i64") for s in SIZES), STREAM]
ATOL = 4e-3  # lab 2's SGEMM tolerance for float32 sums of up to 4096 products (see the docstring)
ROWS = 1 << 12  # rows of a per float64 product in the reference: the huge case has no room for all
TIMING = "1x1024x1024x1024"

# (batch, m, k, n, which operand is shared by the batch: "", "a" or "b")
SHAPES = [
    (1, 1, 1, 1, ""),
    (1, 1, 1, 7, ""),
    (1, 7, 1, 1, ""),
    (1, 33, 17, 65, ""),
    (1, 65, 129, 31, ""),
    (1, 100, 36, 68, ""),
    (1, 127, 255, 129, ""),
    (3, 33, 65, 17, "b"),
    (2, 64, 64, 64, "a"),
    (5, 31, 33, 63, ""),
    (4, 1, 4096, 31, "b"),
    (1, 64, 4096, 64, ""),
    (2, 257, 96, 200, "b"),
    (1, 1000, 1000, 1000, ""),
    (1, 1024, 1024, 1024, ""),
]
HUGE = (1, 65537, 2, 32769, "")  # c has 2^31 + 98305 elements


def label(batch: int, m: int, k: int, n: int, shared: str) -> str:
    return f"{batch}x{m}x{k}x{n}" + (f" ({shared} broadcast)" if shared else "")


def case(batch: int, m: int, k: int, n: int, shared: str, huge: bool = False) -> Case:
    return Case(
        label(batch, m, k, n, shared),
        small=batch * m * k * n <= 1 << 22,
        huge=huge,
        batch=batch,
        m=m,
        k=k,
        n=n,
        shared=shared,
    )


def make_inputs(p, rng):
    batch, m, k, n, shared = p["batch"], p["m"], p["k"], p["n"], p["shared"]
    a_batch, b_batch = (1 if shared == "a" else batch), (1 if shared == "b" else batch)
    return {
        "a": rng.randn(a_batch, m, k),
        "b": rng.randn(b_batch, k, n),
        "batch": batch,
        "m": m,
        "n": n,
        "k": k,
        "a_batch_stride": 0 if a_batch == 1 else m * k,
        "b_batch_stride": 0 if b_batch == 1 else k * n,
        "stream": rng.stream(),
    }


def reference(v):
    """c in float64, rounded to float32, a block of rows at a time."""
    import torch

    a, b, batch, m = v["a"], v["b"], v["batch"], v["m"]
    c = torch.empty(batch, m, v["n"], dtype=torch.float32, device=a.device)
    for i in range(batch):
        bi = b[i if b.shape[0] > 1 else 0].double()
        ai = a[i if a.shape[0] > 1 else 0]
        for r in range(0, m, ROWS):
            c[i, r : r + ROWS] = ai[r : r + ROWS].double() @ bi
    return {"c": c}


def cublas(v, o):
    import torch

    # TF32 would round a and b to 10-bit mantissas: the comparison must be float32 against float32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.matmul(v["a"], v["b"], out=o["c"])


def flops(v):
    return 2.0 * v["batch"] * v["m"] * v["n"] * v["k"]  # a multiply and an add per term of each dot product


def replays_in_a_cuda_graph(ctx: RunContext) -> None:
    """One call captured into a CUDA graph on torch's capture stream, then replayed on new a and b
    copied into the same buffers: c must follow them."""
    import torch

    from grader.child.compare import judge

    batch, m, k, n = 3, 70, 33, 65
    a, b = torch.randn(batch, m, k, device="cuda"), torch.randn(k, n, device="cuda")
    c = torch.empty(batch, m, n, device="cuda")
    values = {
        "c": c,
        "a": a,
        "b": b,
        "batch": batch,
        "m": m,
        "n": n,
        "k": k,
        "a_batch_stride": m * k,
        "b_batch_stride": 0,
    }
    graph = ctx.captured([("kiln_matmul", values)])
    for replay in range(2):
        a.copy_(torch.randn_like(a))
        b.copy_(torch.randn_like(b))
        c.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        report = judge("c", c, (a.double() @ b.double()).float(), ATOL, 0.0, None)
        if report:
            ctx.fail(f"kiln_matmul {batch}x{m}x{k}x{n}, replay {replay + 1} of a captured CUDA graph: {report}")
    del graph


TASK = CudaTask(
    lab="lab4",
    number="04",
    title="kiln: batched tiled matmul",
    sources=["kiln/kernels/matmul.cu"],
    entries=[Entry("kiln_matmul", ARGS, reference=reference, baseline=cublas, flops=flops)],
    cases=[case(*s) for s in SHAPES] + [case(*HUGE, huge=True)],
    make_inputs=make_inputs,
    tolerance={"f32": (ATOL, 0.0)},
    timing_case=TIMING,
    checks=[replays_in_a_cuda_graph],
    timeout=120,
    rules=[
        NO_LIBRARIES,
        uses_shared_memory("the tiles of a and b are staged in shared memory", kernels="matmul_kernel"),
        uses_syncthreads(
            "a shared tile must be complete before it is read, and read before it is replaced", kernels="matmul_kernel"
        ),
    ],
    perf=[PerfTarget("kiln_matmul", "speedup", 0.25, 2)],
    mistakes={
        "k tail": "k = 1, 17, 33, 129, 255 (not multiples of the 16-wide step): the last partial step must count",
        "m and n tails": "m x n = 1 x 7, 33 x 65, 127 x 129 and more (not multiples of the 64 x 64 tile): the"
        " partial tiles' loads and stores must stop at the edge",
        "batch strides": "batches of both operands, and of one with the other broadcast (batch stride 0)",
    },
)


def test_matmul(grade):
    grade(TASK)

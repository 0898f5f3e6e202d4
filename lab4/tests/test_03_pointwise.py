"""Checks for lab4/kiln/kernels/pointwise.cu: kiln_unary (relu, silu) and kiln_binary (add, mul with
numpy broadcasting, described to the kernel by strides), both on a caller's stream.

The inputs. Every case runs both entry points. kiln_unary gets n standard-normal values times 4
(so that silu sees its tails), n from 1 to 2^26 + 3: 1, 31, 33 and 257 leave a partial block, and
2^26 + 3 needs more threads than the capped grid has (a grid-stride loop is the only way to cover
it). kiln_binary gets a and b whose shapes broadcast: each of the four axes broadcast in a, in b or
in both, ranks 1 to 4 mixed (numpy aligns them on the right), size-1 dimensions, and random shapes
drawn anew for every seeded draw. make_inputs builds meta the way kiln's executor will: out's shape
padded to 4 dims with leading 1s, then each operand's contiguous strides with 0 where it broadcasts.
The cases past 2^31 elements (`make grade`) catch 32-bit indices: one for each entry point.

The tolerance. relu, add and mul are exact in float32 (one IEEE operation, or none), so
kiln_binary is compared exactly and `relu_is_exact` compares relu bit for bit; torch computes the
same float32 operations. silu is the course's default (atol = rtol = 1e-5) against a float64
reference: x / (1 + e^-x) in float32 is off by a few units in the last place (expf is within 2
ulp), about 1e-7 relative, and an fp16 rounding (2^-11 relative) is rejected.

The stream. Every call gets torch's current stream (0, the legacy default stream, unless torch
has been given another) and must launch on it. `replays_in_a_cuda_graph` captures a call of each
entry point into a CUDA graph (torch's capture stream, a stream of its own) and replays it on new
inputs: a synchronization or an allocation makes the capture fail, and a launch on any other
stream is not captured at all (torch's capture stream is non-blocking, so a launch on the legacy
stream runs once, at capture, and no replay repeats it): the replays give stale outputs, as kiln's
whole-model graph (task 07) would.

No timing case: the grader times an entry point with a host argument (meta) by the host's clock
and counts its wrong outputs on the host, while these outputs are on the device.

TASK.mistakes names the class of mistake each case is there to catch; lab4/solutions/broken.py
has a broken variant for each (graded on a GPU).
"""

from grader.child.context import RunContext
from grader.tasks import NO_LIBRARIES, Case, CudaTask, Entry, HostIn, In, Int, Out
from grader.tasks.spec import Rng, Scalar

STREAM = Scalar("stream", "u64")
UNARY_ARGS = [Int("unary_op"), Out("out"), In("x"), Scalar("n", "i64"), STREAM]
BINARY_ARGS = [Int("binary_op"), Out("out"), In("a"), In("b"), HostIn("meta", "i64"), STREAM]
UNARY = {0: "relu", 1: "silu"}
BINARY = {0: "+", 1: "*"}
CHUNK = 1 << 26  # elements per step of a float64 reference: a huge case must not double its memory

Shape = tuple[int, ...]

# (n, unary op, a's shape, b's shape, binary op): every axis broadcast somewhere, ranks 1 to 4
SHAPES: list[tuple[int, int, Shape, Shape, int]] = [
    (1, 0, (1,), (1,), 0),
    (2, 1, (33,), (33,), 1),
    (31, 0, (31,), (1,), 0),
    (33, 1, (1,), (31,), 1),
    (255, 0, (4, 1), (3,), 0),
    (256, 1, (5, 7), (5, 1), 1),
    (257, 0, (1, 7), (5, 7), 1),
    (1000, 1, (2, 3, 4), (3, 1), 0),
    (4097, 0, (2, 1, 4), (1, 3, 1), 1),
    (65537, 1, (3, 1, 5, 1), (1, 4, 1, 6), 0),
    (100003, 0, (2, 3, 4, 5), (2, 3, 4, 5), 1),
    (33, 1, (1, 1, 1, 33), (7, 1, 5, 33), 0),
    (31, 0, (7, 1, 1, 1), (1, 6, 5, 4), 1),
    ((1 << 20) + 7, 1, (33, 1, 257), (1, 31, 1), 0),
    ((1 << 26) + 3, 0, (64, 1024, 1025), (1025,), 1),
    ((1 << 26) + 3, 1, (64, 1, 1025), (1, 1024, 1), 0),
]
RANDOM_RANKS = [1, 2, 3, 4, 4]  # shapes drawn by make_inputs, new for every draw
HUGE_N = (1 << 31) + 33
HUGE_SHAPE = (2, 32768, 32769)  # 2^31 + 65536 elements


def numel(shape: Shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def broadcast(a: Shape, b: Shape) -> Shape:
    """numpy's rule: align on the right; along each axis the sizes agree or one of them is 1."""
    rank = max(len(a), len(b))
    a, b = (1,) * (rank - len(a)) + a, (1,) * (rank - len(b)) + b
    assert all(x == y or 1 in (x, y) for x, y in zip(a, b, strict=True)), f"{a} and {b} do not broadcast"
    return tuple(max(x, y) for x, y in zip(a, b, strict=True))


def padded_strides(shape: Shape, out: Shape) -> list[int]:
    """Contiguous strides of `shape` along out's 4 padded dims, 0 where `shape` broadcasts."""
    full = (1,) * (4 - len(shape)) + shape
    target = (1,) * (4 - len(out)) + out
    strides, step = [0] * 4, 1
    for d in range(3, -1, -1):
        strides[d] = step if full[d] == target[d] and full[d] > 1 else 0
        step *= full[d]
    return strides


def random_shapes(rank: int, rng: Rng) -> tuple[Shape, Shape]:
    """out's dims in 1..12; along each, both operands have it or one of them broadcasts (1/3 each);
    one operand may drop its leading dims when they are all broadcast (a lower rank)."""
    out = [int(v) for v in rng.integers(1, 13, rank).tolist()]
    who = rng.integers(0, 3, rank).tolist()  # 0: both, 1: a broadcasts, 2: b broadcasts
    a = tuple(1 if w == 1 else d for d, w in zip(out, who, strict=True))
    b = tuple(1 if w == 2 else d for d, w in zip(out, who, strict=True))
    while len(b) > 1 and b[0] == 1:  # numpy's lower rank: b's leading 1s may as well be missing
        b = b[1:]
    return a, b


def case(n: int, uop: int, a: Shape, b: Shape, bop: int, huge: bool = False) -> Case:
    out = broadcast(a, b)
    label = f"n={n} {UNARY[uop]}; {a} {BINARY[bop]} {b} -> {out}"
    big = max(n, numel(out))
    return Case(label, small=big <= 1 << 16, huge=huge, n=n, uop=uop, bop=bop, a_shape=a, b_shape=b, elements=big)


def random_case(i: int, rank: int) -> Case:
    return Case(
        f"random rank {rank} #{i}, n={31 + 2 * i} {UNARY[i % 2]}", n=31 + 2 * i, uop=i % 2, bop=(i + 1) % 2, rank=rank
    )


def make_inputs(p, rng):
    import torch

    if "rank" in p:
        a_shape, b_shape = random_shapes(p["rank"], rng)
    else:
        a_shape, b_shape = p["a_shape"], p["b_shape"]
    out = broadcast(a_shape, b_shape)
    meta = list((1,) * (4 - len(out)) + out) + padded_strides(a_shape, out) + padded_strides(b_shape, out)
    x = rng.randn(p["n"])
    x.mul_(4.0)  # in place: the huge case has no room for a second copy
    return {
        "unary_op": p["uop"],
        "x": x,
        "n": p["n"],
        "binary_op": p["bop"],
        "a": rng.randn(numel(a_shape)),
        "b": rng.randn(numel(b_shape)),
        "meta": torch.tensor(meta, dtype=torch.int64),
        "a_shape": a_shape,
        "b_shape": b_shape,
        "stream": rng.stream(),
    }


def unary_reference(v):
    import torch

    x = v["x"]
    if v["unary_op"] == 0:
        return {"out": x.clamp_min(0.0)}
    out = torch.empty_like(x)
    for s in range(0, x.numel(), CHUNK):  # float64 in chunks: the huge case has no room for all of it
        xs = x[s : s + CHUNK].double()
        out[s : s + CHUNK] = xs * torch.sigmoid(xs)
    return {"out": out}


def binary_reference(v):
    a, b = v["a"].view(v["a_shape"]), v["b"].view(v["b_shape"])
    return {"out": (a + b) if v["binary_op"] == 0 else (a * b)}  # float32: exactly the kernel's operation


def relu_is_exact(ctx: RunContext) -> None:
    """relu bit for bit, on random values and the ones a careless max gets wrong: infinities,
    subnormals (kept, not flushed to 0) and the largest finite floats."""
    import torch

    special = [float("inf"), float("-inf"), 1e-40, -1e-40, 3.4e38, -3.4e38, 1.0, -1.0]
    x = torch.cat([torch.tensor(special), torch.randn(4093) * 4]).cuda()
    out = torch.full_like(x, float("nan"))
    stream = torch.cuda.current_stream().cuda_stream
    rc = ctx.entry("kiln_unary")({"unary_op": 0, "out": out, "x": x, "n": x.numel(), "stream": stream})
    ctx.check_rc("kiln_unary", rc, "relu on special values")
    torch.cuda.synchronize()
    want = torch.relu(x)
    if not torch.equal(out, want):
        i = int((out != want).nonzero()[0])
        ctx.fail(
            f"relu is not exact: {int((out != want).sum())} of {x.numel()} values differ, the first "
            f"relu({float(x[i])!r}) = {float(out[i])!r}, expected {float(want[i])!r}: relu is a comparison, "
            f"nothing is rounded"
        )


def replays_in_a_cuda_graph(ctx: RunContext) -> None:
    """One call of each entry point, captured into a CUDA graph on torch's capture stream, then
    replayed on new inputs copied into the same buffers: the outputs must follow them."""
    import numpy as np
    import torch

    from grader.child.compare import judge

    x, a, b = torch.randn(4099, device="cuda"), torch.randn(5, 1, 33, device="cuda"), torch.randn(7, 1, device="cuda")
    meta = np.array([1, 5, 7, 33, 0, 33, 0, 1, 0, 0, 1, 0], dtype=np.int64)  # (5, 1, 33) + (7, 1) -> (5, 7, 33)
    out_u, out_b = torch.empty_like(x), torch.empty(5, 7, 33, device="cuda")
    calls = [
        ("kiln_unary", {"unary_op": 1, "out": out_u, "x": x, "n": x.numel()}),
        ("kiln_binary", {"binary_op": 1, "out": out_b, "a": a, "b": b, "meta": meta}),
    ]
    graph = ctx.captured(calls)
    for replay in range(2):
        for t in (x, a, b):
            t.copy_(torch.randn_like(t))
        out_u.fill_(float("nan"))
        out_b.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        xd = x.double()
        for name, got, want, tol in (
            ("kiln_unary (silu)", out_u, xd * torch.sigmoid(xd), (1e-5, 1e-5)),
            ("kiln_binary (mul)", out_b, a * b, (0.0, 0.0)),
        ):
            report = judge("out", got, want.float(), *tol, None)
            if report:
                ctx.fail(f"{name}, replay {replay + 1} of a captured CUDA graph on new inputs: {report}")
    del graph


TASK = CudaTask(
    lab="lab4",
    number="03",
    title="kiln: pointwise kernels with broadcasting",
    sources=["kiln/kernels/pointwise.cu"],
    entries=[
        Entry("kiln_unary", UNARY_ARGS, reference=unary_reference),
        Entry("kiln_binary", BINARY_ARGS, reference=binary_reference, tolerance={"f32": (0.0, 0.0)}),
    ],
    cases=[case(*s) for s in SHAPES]
    + [random_case(i, r) for i, r in enumerate(RANDOM_RANKS)]
    + [
        case(HUGE_N, 0, (7, 1), (1, 3), 0, huge=True),
        case(33, 1, HUGE_SHAPE, (1, 1, HUGE_SHAPE[2]), 1, huge=True),
    ],
    make_inputs=make_inputs,
    checks=[relu_is_exact, replays_in_a_cuda_graph],
    timeout=120,
    rules=[NO_LIBRARIES],
    mistakes={
        "broadcast strides": "every axis broadcast in a, in b or both, ranks 1 to 4 mixed, and random shapes:"
        " a stride read along the wrong axis reads the wrong element",
        "grid cap": "n = 2^26 + 3 needs more threads than the capped grid has: only a grid-stride loop covers it",
        "wrong stream": "replays_in_a_cuda_graph captures a call on torch's capture stream: a launch on any other"
        " stream breaks the capture",
        "32-bit index": "the cases past 2^31 elements (make grade), one per entry point",
    },
)


def test_pointwise(grade):
    grade(TASK)

"""Checks for lab4/kiln/cpu.py: the CPU executor, graded on the CPU (no GPU needed).

Each operator is built into a one-node graph with kiln's Builder, run by CPUExecutor and compared
with torch on seeded random inputs: broadcasting along each axis and from a lower rank, size-1
dimensions, ranks 1 and 4, and every dtype the operator accepts (f32, f16, bf16; i64 for add and
mul), and i64 values past 2^24 (float32 holds 24 bits: computing through it rounds them). Then
whole graphs: a deep DAG whose nodes are read twice each (a run loop that evaluates a node per use,
recursively, takes more than 10^21 steps), a chain 1500 nodes deep (recursion from the outputs passes
Python's limit of 1000 frames), a buffer written by slice_update in one run and read in the next,
two updates chained on one buffer (the second writes into what the first returned, which must be
the buffer, not a copy), a write no output reads (every node runs, in order: a graph sharing the
buffer reads it), offsets at the first and the last position and out of range (past the end,
partly past it, below 0: KilnRunError, not a clamped write), input errors, outputs that a later
run must leave alone, and outputs that are inputs or constants (or reshapes of them), which the
caller may change after the run without changing anything else.

Tolerances: elementwise ops are one rounding from the exact result, as torch's are: f32 is
compared within 1e-6, f16/bf16 within one unit in the last place (rtol 1e-3 / 8e-3). matmul is
compared with float32 accumulation cast back (the contract), within rtol 1e-5 in f32 and one
half-precision ulp otherwise. A wrong axis, a dropped write or a shifted offset is off by O(1).

TASK.mistakes names the class of mistake each case is there to catch; lab4/solutions/broken.py
has a broken variant for each.

The point tests import kiln inside their bodies: the grading process loads this file too and
must not run student code.
"""

from __future__ import annotations

import time

import pytest
import torch

from grader.tasks import PythonTask

TASK = PythonTask(
    lab="lab4",
    number="02",
    title="the CPU executor",
    sources=["kiln/cpu.py"],
    mistakes={
        "broadcast alignment": "(3, 5) + (5,), (4, 1, 5) + (3, 1) and (2, 3, 4, 5) + (3, 1, 5), both ways round:"
        " a lower rank aligns on the right, and a (3, 1) column is not a (1, 3) row",
        "int64 through float": "i64 add and mul on odd values past 2^30 and products near 2^41, compared exactly",
        "run-time offsets": "the KV cache written at the first and the last position, offsets given per run",
        "out-of-range offsets": "offsets past the end, partly past it and below 0 on each axis must raise"
        " KilnRunError: clamping writes a row nobody asked for",
        "state across runs": "a buffer written in one run and read in the next",
        "chained updates": "two slice_updates chained on one buffer in a run, read back in the next run",
        "outputs alias buffers": "the cache, and a reshape of it, returned and then written by the next run",
        "outputs alias inputs": "outputs that are an input, a constant or a reshape of one, changed by the"
        " caller after the run",
        "lazy evaluation": "a slice_update no output reads, whose write a graph sharing the buffer reads",
        "deep graphs": "a chain 1500 nodes deep: recursion from the outputs meets Python's limit",
    },
)

FLOATS = [torch.float32, torch.float16, torch.bfloat16]
TOL = {
    torch.float32: {"rtol": 1e-6, "atol": 1e-6},
    torch.float16: {"rtol": 1e-3, "atol": 1e-3},
    torch.bfloat16: {"rtol": 8e-3, "atol": 8e-3},
    torch.int64: {"rtol": 0, "atol": 0},
}


def rand(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.int64:
        return torch.randint(-50, 50, shape, generator=g)
    return torch.randn(shape, generator=g).to(dtype)


def run_op(op, tensors, **attrs):
    """Build `op(x0, x1, ...)` as a graph of inputs x0, x1, ... and run it on the CPU executor."""
    import kiln
    from kiln.cpu import CPUExecutor

    b = kiln.Builder(op)
    xs = [b.input(f"x{i}", tuple(t.shape), t.dtype) for i, t in enumerate(tensors)]
    b.output(b.op(op, *xs, **attrs))
    (out,) = CPUExecutor(b.graph).run({f"x{i}": t for i, t in enumerate(tensors)})
    return out


def check(got, want):
    assert isinstance(got, torch.Tensor), f"expected a torch tensor, got {type(got).__name__}"
    assert got.dtype == want.dtype, f"dtype {got.dtype}, expected {want.dtype}"
    assert tuple(got.shape) == tuple(want.shape), f"shape {list(got.shape)}, expected {list(want.shape)}"
    assert got.device.type == "cpu"
    torch.testing.assert_close(got, want, **TOL[want.dtype])


# (a, b) shape pairs: equal, each axis broadcast in turn, both ways at once, a lower rank, rank 1 and 4
BROADCAST = [
    ((3, 5), (3, 5)),
    ((1, 5), (3, 5)),
    ((3, 1), (3, 5)),
    ((3, 5), (5,)),
    ((4, 1, 5), (3, 1)),
    ((1,), (7,)),
    ((7,), (7,)),
    ((2, 3, 4, 5), (3, 1, 5)),
    ((2, 1, 4, 1), (1, 3, 1, 5)),
    ((1, 1, 1, 1), (2, 3, 4, 5)),
]


@pytest.mark.points(4)
@pytest.mark.parametrize("op", ["add", "mul"])
def test_add_mul_broadcast(op):
    f = torch.add if op == "add" else torch.mul
    for k, (sa, sb) in enumerate(BROADCAST):
        for dtype in [*FLOATS, torch.int64]:
            a, b = rand(sa, dtype, 2 * k), rand(sb, dtype, 2 * k + 1)
            check(run_op(op, [a, b]), f(a, b))
            check(run_op(op, [b, a]), f(b, a))


MATMUL = [
    ((4, 8), (8, 3)),
    ((1, 1), (1, 1)),
    ((2, 5, 8), (8, 3)),
    ((2, 5, 8), (2, 8, 3)),
    ((2, 1, 5, 8), (3, 8, 4)),
    ((1, 5, 8), (4, 8, 2)),
    ((3, 17, 33), (33, 1)),
]


@pytest.mark.points(3)
def test_matmul():
    for k, (sa, sb) in enumerate(MATMUL):
        for dtype in FLOATS:
            a, b = rand(sa, dtype, 2 * k), rand(sb, dtype, 2 * k + 1)
            want = torch.matmul(a.float(), b.float()).to(dtype)
            check(run_op("matmul", [a, b]), want)


@pytest.mark.points(2)
def test_relu_silu():
    for k, shape in enumerate([(1,), (9,), (3, 1), (2, 3, 4, 5)]):
        for dtype in FLOATS:
            x = rand(shape, dtype, k)
            check(run_op("relu", [x]), torch.relu(x))
            check(run_op("silu", [x]), torch.nn.functional.silu(x))


@pytest.mark.points(3)
def test_reshape_permute_slice():
    for dtype in [*FLOATS, torch.int64]:
        x = rand((2, 3, 4, 5), dtype, 7)
        check(run_op("reshape", [x], shape=[6, 20]), x.reshape(6, 20))
        check(run_op("reshape", [x], shape=[120]), x.reshape(120))
        for dims in ([0, 1, 2, 3], [3, 2, 1, 0], [0, 2, 3, 1], [1, 0, 3, 2]):
            got = run_op("permute", [x], dims=dims)
            check(got, x.permute(dims))
            assert got.is_contiguous(), "permute returns a contiguous tensor"
        got = run_op("slice", [x], starts=[1, 0, 1, 2], ends=[2, 3, 3, 5])
        check(got, x[1:2, 0:3, 1:3, 2:5])
        assert got.is_contiguous(), "slice returns a contiguous tensor"
        y = rand((9,), dtype, 8)
        check(run_op("slice", [y], starts=[8], ends=[9]), y[8:9])
        check(run_op("permute", [y], dims=[0]), y)


@pytest.mark.points(3)
def test_mlp_graph():
    """A two-layer MLP with a bias from the builder (constants, permute, matmul, add, relu)."""
    import kiln
    from kiln.cpu import CPUExecutor

    w1, b1 = rand((16, 12), torch.float32, 1), rand((16,), torch.float32, 2)
    w2, b2 = rand((5, 16), torch.float32, 3), rand((5,), torch.float32, 4)
    x = rand((6, 12), torch.float32, 5)
    b = kiln.Builder("mlp")
    xin = b.input("x", (6, 12), "float32")
    h = (xin @ b.constant("fc1.weight", w1).permute(1, 0) + b1).relu()
    y = h @ b.constant("fc2.weight", w2).permute(1, 0) + b2
    b.output(y, h)
    got_y, got_h = CPUExecutor(b.graph).run({"x": x})
    want_h = torch.relu(x @ w1.T + b1)
    torch.testing.assert_close(got_h, want_h, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_y, want_h @ w2.T + b2, rtol=1e-5, atol=1e-5)


@pytest.mark.points(3)
def test_deep_shared_dag():
    from kiln.cpu import CPUExecutor
    from kiln.models import fibonacci

    levels = 100
    a, b = rand((8,), torch.float32, 1).abs(), rand((8,), torch.float32, 2).abs()
    graph = fibonacci(levels)
    start = time.perf_counter()
    (got,) = CPUExecutor(graph).run({"a": a, "b": b})
    took = time.perf_counter() - start
    prev, cur = a, b
    for _ in range(levels):
        prev, cur = cur, prev + cur
    torch.testing.assert_close(got, cur, rtol=1e-6, atol=0)
    assert took < 2.0, f"{levels} levels took {took:.1f} s: evaluate each node once, in order"


def write(ex, v, pos):
    (out,) = ex.run({"v": v, "pos": torch.tensor(pos, dtype=torch.int64)})
    return out


@pytest.mark.points(3)
def test_buffer_persists_across_runs():
    from kiln.cpu import CPUExecutor
    from kiln.models import kv_cache

    ex = CPUExecutor(kv_cache())
    v1, v2 = rand((1, 2, 3), torch.float32, 1), rand((1, 2, 3), torch.float32, 2)
    want = torch.zeros(4, 6, 3)
    want[1, 2:4] = v1[0]
    check(write(ex, v1, [1, 2, 0]), want)
    want[2, 0:2] = v2[0]
    check(write(ex, v2, [2, 0, 0]), want)  # run 1's write is still there


@pytest.mark.points(3)
def test_runtime_offsets_first_and_last():
    from kiln.cpu import CPUExecutor
    from kiln.models import kv_cache

    ex = CPUExecutor(kv_cache())
    first, last = rand((1, 2, 3), torch.float32, 3), rand((1, 2, 3), torch.float32, 4)
    want = torch.zeros(4, 6, 3)
    want[0, 0:2] = first[0]
    check(write(ex, first, [0, 0, 0]), want)
    want[3, 4:6] = last[0]
    check(write(ex, last, [3, 4, 0]), want)  # the last slot: offsets at their largest


@pytest.mark.points(3)
def test_outputs_independent_of_later_runs():
    import kiln
    from kiln.cpu import CPUExecutor
    from kiln.models import kv_cache

    ex = CPUExecutor(kv_cache())
    v1 = rand((1, 2, 3), torch.float32, 5)
    out1 = write(ex, v1, [0, 0, 0])
    kept = out1.clone()
    write(ex, rand((1, 2, 3), torch.float32, 6), [1, 0, 0])
    check(out1, kept)  # run 2 wrote into the cache, not into run 1's result

    # a reshape of the cache is a view too
    b = kiln.Builder("view")
    cache = b.buffer("cache", (2, 4), "float32")
    v = b.input("v", (1, 4), "float32")
    pos = b.input("pos", (2,), "int64")
    b.output(cache.slice_update(v, pos).reshape(8))
    ex = CPUExecutor(b.graph)
    out1 = ex.run({"v": torch.ones(1, 4), "pos": torch.tensor([0, 0])})[0]
    ex.run({"v": torch.full((1, 4), 2.0), "pos": torch.tensor([1, 0])})
    check(out1, torch.tensor([1.0, 1, 1, 1, 0, 0, 0, 0]))


@pytest.mark.points(2)
def test_int64_past_2_to_the_24():
    """i64 add and mul on values a float32 cannot hold (it has 24 bits of significand): exact."""
    g = torch.Generator().manual_seed(11)
    big = torch.randint(2**30, 2**40, (3, 5), generator=g) * torch.tensor([1, -1, 1, -1, 1])
    odd = big | 1  # odd values: float32 rounds every one of them
    small = torch.randint(2**20, 2**21, (5,), generator=g) + 1
    check(run_op("add", [odd, big]), odd + big)
    check(run_op("add", [odd, small]), odd + small)  # broadcast from a lower rank too
    check(run_op("mul", [small, small]), small * small)  # products near 2^41
    check(run_op("mul", [odd[:, :1].contiguous(), small]), odd[:, :1] * small)


def deep_chain(nodes: int):
    import kiln

    b = kiln.Builder("deep")
    x = b.input("x", (4,), "float32")
    t = x
    for _ in range(nodes):
        t = t + x
    b.output(t)
    return b.graph


@pytest.mark.points(1)
def test_thousands_of_nodes_deep():
    """A chain 1500 nodes deep: a recursive evaluator meets Python's recursion limit (1000)."""
    from kiln.cpu import CPUExecutor

    x = torch.tensor([1.0, -2.0, 0.5, 3.0])  # t = (k + 1) x, exact in float32
    (got,) = CPUExecutor(deep_chain(1500)).run({"x": x})
    check(got, 1501 * x)


@pytest.mark.points(2)
def test_writes_nobody_reads_still_happen():
    """Every node runs, in order, including a slice_update no output reads: the write is state that
    a later run, or another graph sharing the buffer, reads."""
    import kiln
    from kiln.cpu import CPUExecutor

    b = kiln.Builder("writer")
    cache = b.buffer("cache", (4, 3), "float32")
    v = b.input("v", (1, 3), "float32")
    pos = b.input("pos", (2,), "int64")
    cache.slice_update(v, pos)  # read by no output: it still writes the cache
    b.output(v * 2.0)
    writer = CPUExecutor(b.graph)

    r = kiln.Builder("reader")
    r.output(r.buffer("cache", (4, 3), "float32").reshape(12))
    reader = CPUExecutor(r.graph, share_with=writer)

    rows = rand((2, 1, 3), torch.float32, 12)
    for row, at in zip(rows, (1, 3), strict=True):
        (doubled,) = writer.run({"v": row, "pos": torch.tensor([at, 0])})
        check(doubled, row * 2.0)
    want = torch.zeros(4, 3)
    want[1], want[3] = rows[0, 0], rows[1, 0]
    (got,) = reader.run({})
    check(got, want.reshape(12))


@pytest.mark.points(2)
def test_chained_updates_write_the_buffer():
    """Two slice_updates in a row on one buffer: the second writes into what the first returned,
    which is the buffer itself, so both writes persist into the next run."""
    import kiln
    from kiln.cpu import CPUExecutor

    b = kiln.Builder("chained")
    cache = b.buffer("cache", (4, 3), "float32")
    k, v = b.input("k", (1, 3), "float32"), b.input("v", (1, 3), "float32")
    pk, pv = b.input("pk", (2,), "int64"), b.input("pv", (2,), "int64")
    b.output(cache.slice_update(k, pk).slice_update(v, pv))
    ex = CPUExecutor(b.graph)
    rows = rand((4, 1, 3), torch.float32, 13)
    want = torch.zeros(4, 3)
    for step in range(2):
        a, c = 2 * step, 2 * step + 1
        (got,) = ex.run({"k": rows[a], "v": rows[c], "pk": torch.tensor([a, 0]), "pv": torch.tensor([c, 0])})
        want[a], want[c] = rows[a, 0], rows[c, 0]
        check(got, want)  # run 2 still has both of run 1's rows


@pytest.mark.points(2)
def test_offsets_out_of_range_raise():
    """An offset that puts the value outside the buffer, past the end or below 0, partly or wholly,
    raises KilnRunError naming the node: clamping it into range writes where nobody asked."""
    from kiln.cpu import CPUExecutor
    from kiln.models import kv_cache
    from kiln.runtime import KilnRunError

    graph = kv_cache()  # cache (4, 6, 3), v (1, 2, 3)
    node = graph.of_op("slice_update")[0]
    ex = CPUExecutor(graph)
    v = rand((1, 2, 3), torch.float32, 14)
    for pos in ([4, 0, 0], [3, 5, 0], [0, 0, 1], [-1, 0, 0], [0, -1, 0], [9, 9, 9]):
        with pytest.raises(KilnRunError) as err:
            ex.run({"v": v, "pos": torch.tensor(pos)})
        assert node.name in str(err.value), f"offsets {pos}: the message should name %{node.name}: {err.value}"
    want = torch.zeros(4, 6, 3)
    want[3, 4:6] = v[0]
    check(write(ex, v, [3, 4, 0]), want)  # the last position is in range


@pytest.mark.points(2)
def test_outputs_do_not_alias_inputs_or_constants():
    """An output that is an input, a constant or a reshape of one belongs to the caller too: the
    caller changing their input afterwards, or writing into the output, changes nothing else."""
    import kiln
    from kiln.cpu import CPUExecutor

    weight = rand((3, 4), torch.float32, 15)
    b = kiln.Builder("aliases")
    x = b.input("x", (2, 6), "float32")
    w = b.constant("w", weight.clone())
    b.output(x.reshape(12), x, w.reshape(12), w)
    ex = CPUExecutor(b.graph)
    given = rand((2, 6), torch.float32, 16)
    outs = ex.run({"x": given})
    kept = given.clone()
    given.add_(100.0)  # the caller reuses their input tensor
    check(outs[0], kept.reshape(12))
    check(outs[1], kept)
    for out in outs:
        out.mul_(0.0)  # the caller writes into what they were given
    outs = ex.run({"x": given})
    check(outs[2], weight.reshape(12))  # the constant is intact
    check(outs[3], weight)


def bad_inputs():
    ok = {"v": torch.zeros(1, 2, 3), "pos": torch.zeros(3, dtype=torch.int64)}
    wide = torch.zeros(3, 2, 1).permute(2, 1, 0)  # (1, 2, 3), not contiguous
    return {
        "missing": ({"v": ok["v"]}, ["pos", "missing"]),
        "extra": ({**ok, "w": torch.zeros(1)}, ["w"]),
        "shape": ({**ok, "v": torch.zeros(1, 3, 2)}, ["v", "shape"]),
        "dtype": ({**ok, "pos": torch.zeros(3, dtype=torch.int32)}, ["pos", "dtype"]),
        "contiguous": ({**ok, "v": wide}, ["v", "contiguous"]),
        "not a tensor": ({**ok, "v": [[0.0] * 3] * 2}, ["v"]),
        "device": ({**ok, "v": torch.zeros(1, 2, 3, device="meta")}, ["v", "meta"]),
    }


@pytest.mark.points(2)
def test_input_errors():
    from kiln.cpu import CPUExecutor
    from kiln.models import kv_cache
    from kiln.runtime import KilnRunError

    ex = CPUExecutor(kv_cache())
    for case, (inputs, words) in bad_inputs().items():
        with pytest.raises(KilnRunError) as err:
            ex.run(inputs)
        for w in words:
            assert w in str(err.value), f"{case}: the message should name {w!r}: {err.value}"
    # nothing was written by the refused runs
    ok = write(ex, torch.ones(1, 2, 3), [3, 4, 0])
    assert ok.sum().item() == 6.0


@pytest.mark.points(1)
def test_registered_operator_runs():
    """Lab 5 adds operators through the registries; the run loop must dispatch through CPU_KERNELS."""
    import kiln
    from kiln import ops
    from kiln.cpu import CPU_KERNELS, register_cpu

    if "test_square" not in ops.REGISTRY:
        ops.register(ops.OpDef("test_square", 1, lambda ts, attrs: ts[0]))
    if "test_square" not in CPU_KERNELS:
        register_cpu("test_square")(lambda node, args: args[0] * args[0])
    from kiln.cpu import CPUExecutor

    b = kiln.Builder("square")
    x = b.input("x", (5,), "float32")
    b.output(b.op("test_square", x) + x)
    v = rand((5,), torch.float32, 9)
    check(CPUExecutor(b.graph).run({"x": v})[0], v * v + v)


def test_cpu_executor(grade):
    grade(TASK)

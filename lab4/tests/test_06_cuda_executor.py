"""Checks for lab4/kiln/cuda.py: the CUDA executor, eager (use_graph=False), on your kernels of
tasks 03-05 and your planner of task 01 (with --solutions, the reference of each).

The meta arrays first, on the host: `broadcast_meta` against numpy's rule (shapes aligned on the
right, stride 0 where an operand broadcasts), `matmul_batches` by walking every batch index of
its calls and comparing the matrices it reaches with the broadcast ones, and `strided_meta` by
reading a flat tensor through the meta with torch's as_strided, as the kernel would.

Then every operator as a one-node graph on the GPU, compared with torch on seeded inputs:
broadcasting along each axis and from a lower rank, size-1 dimensions, ranks 1 to 4; a matmul
whose batch broadcast no single stride expresses ((2, 1, M, K) @ (3, K, N)); permutations and
slices of rank 1 to 4; reshape as a view. Then whole graphs: an MLP built with kiln's Builder,
the 100-level Fibonacci DAG (every node read twice: the planner must keep them alive), a buffer
written by slice_update and read in the next run, offsets at the first and the last position,
outputs that a later run must leave alone (the arena is reused), input errors raised before any
kernel is launched (the test wraps `kiln.cuda.load_kernels` and counts entry-point calls), and a
launch that fails (a test operator whose launch returns cudaErrorInvalidValue) named by its node.

Streams and capture. The caller writes the inputs on a stream of its own, behind a slow kernel
(torch.cuda._sleep): a run that does not wait for the caller's current stream (or waits for the
default stream, which is idle) copies the inputs too early, and a kernel launched on any stream but
ex.stream runs before the copies it depends on. ex.replay() without a graph, called from such a busy
stream (lab 5's decode loop calls it), catches slice_update's copy of the offsets queued on the
current stream instead of ex.stream. Then the launches are captured into a CUDA graph as task 07
does and replayed with new offsets: a launch that reads the offsets on the host cannot be
captured, and one that fixed them earlier writes at the old position.

TASK.mistakes names the class of mistake each case is there to catch; lab4/solutions/broken.py
has a broken variant for each.

Tolerances: add, mul, relu and slicing are exact in float32; silu within 1e-5 (expf); matmul
against a float64 reference within 1e-4 (float32 accumulation over K <= 64).

The point tests import kiln inside their bodies: the grading process loads this file too and
must not run student code.
"""

from __future__ import annotations

import pytest
import torch

from grader.tasks import PythonTask

KERNELS = ["kiln/kernels/pointwise.cu", "kiln/kernels/matmul.cu", "kiln/kernels/layout.cu"]

TASK = PythonTask(
    lab="lab4",
    number="06",
    title="the CUDA executor",
    sources=["kiln/cuda.py"],
    builds_on=[*KERNELS, "kiln/planner.py"],
    gpu=True,
    timeout=300,
    mistakes={
        "broadcast alignment": "test_broadcast_meta: (3, 5) + (5,) and other lower-rank operands align on the right",
        "batch broadcast": "(2, 1, M, K) @ (3, K, N): a batch no single pair of strides walks",
        "permute order": "the 3-cycle permutations (2, 0, 1) and (3, 1, 0, 2): the inverse permutation differs",
        "slice offset": "slices that start inside the input, on every axis",
        "run-time offsets": "the KV cache written at the first and the last position, offsets given per run",
        "outputs alias the arena": "an output kept while the next run writes the same arena slot",
        "launch errors": "a test operator whose launch returns cudaErrorInvalidValue, named by its node",
        "caller stream": "inputs written on the caller's own stream behind a slow kernel: run orders after"
        " the caller's current stream, not the default one",
        "wrong stream": "the same busy caller stream, and replay() without a graph called from it: every"
        " kernel and copy (slice_update's offsets too) goes to ex.stream",
        "under capture": "the launches captured into a CUDA graph and replayed with new offsets: no host read,"
        " nothing fixed before the capture",
    },
)


def rand(shape, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype)


def executor(graph, **kw):
    from kiln.cuda import CudaExecutor

    return CudaExecutor(graph, use_graph=False, **kw)


def run_op(op, tensors, **attrs):
    """`op(x0, x1, ...)` as a graph of inputs x0, x1, ..., run once on the GPU; the output on the CPU."""
    import kiln

    b = kiln.Builder(op)
    xs = [b.input(f"x{i}", tuple(t.shape), t.dtype) for i, t in enumerate(tensors)]
    b.output(b.op(op, *xs, **attrs))
    (out,) = executor(b.graph).run({f"x{i}": t.cuda() for i, t in enumerate(tensors)})
    return out


def check(got, want, rtol=0.0, atol=0.0):
    assert isinstance(got, torch.Tensor), f"expected a torch tensor, got {type(got).__name__}"
    assert got.device.type == "cuda", f"the output is on {got.device}: run returns CUDA tensors"
    assert got.dtype == want.dtype, f"dtype {got.dtype}, expected {want.dtype}"
    assert tuple(got.shape) == tuple(want.shape), f"shape {list(got.shape)}, expected {list(want.shape)}"
    torch.testing.assert_close(got.cpu(), want, rtol=rtol, atol=atol)


def pad(shape, rank=4, fill=1):
    return [fill] * (rank - len(shape)) + list(shape)


def contiguous(shape):
    strides, step = [0] * len(shape), 1
    for d in range(len(shape) - 1, -1, -1):
        strides[d] = step
        step *= shape[d]
    return strides


# (a, b) shape pairs: equal, each axis broadcast in turn, both ways at once, a lower rank, ranks 1 to 4
BROADCAST = [
    ((3, 5), (3, 5)),
    ((1, 5), (3, 5)),
    ((3, 1), (3, 5)),
    ((3, 5), (5,)),
    ((4, 1, 5), (3, 1)),
    ((1,), (7,)),
    ((7,), (1,)),
    ((2, 3, 4, 5), (3, 1, 5)),
    ((2, 1, 4, 1), (1, 3, 1, 5)),
    ((1, 1, 1, 1), (2, 3, 4, 5)),
    ((5, 1, 1, 2), (1, 4, 3, 1)),
    ((33, 1, 65), (1, 31, 1)),
]


@pytest.mark.points(2)
def test_broadcast_meta():
    """out's shape padded to 4, then a's and b's contiguous strides with 0 where they broadcast."""
    from kiln.cuda import broadcast_meta

    got = broadcast_meta((2, 3, 4), (2, 3, 4), (3, 1))
    assert list(got[:4]) == [1, 2, 3, 4], f"out shape part {got[:4]}, expected [1, 2, 3, 4]"
    for sa, sb in BROADCAST:
        out = torch.broadcast_shapes(sa, sb)
        meta = [int(v) for v in broadcast_meta(out, sa, sb)]
        assert len(meta) == 12, f"{sa} and {sb}: meta has {len(meta)} values, kiln_binary reads 12"
        assert meta[:4] == pad(out), f"{sa} and {sb}: out shape part {meta[:4]}, expected {pad(out)}"
        for k, shape in ((0, sa), (1, sb)):
            want = [0 if p == 1 else s for p, s in zip(pad(shape), contiguous(pad(shape)), strict=True)]
            got = meta[4 + 4 * k : 8 + 4 * k]
            # along an axis where out has size 1 the stride is never multiplied by anything but 0
            for d in range(4):
                if pad(out)[d] > 1:
                    assert got[d] == want[d], (
                        f"{sa} and {sb} -> {tuple(out)}: operand {'ab'[k]} strides {got}, expected {want}"
                        f" (aligned on the right, 0 where it broadcasts) at padded axis {d}"
                    )


# (a's shape, b's shape): no batch, equal batches, one side broadcast, batches no single stride walks
MATMUL = [
    ((4, 8), (8, 3)),
    ((1, 1), (1, 1)),
    ((2, 5, 8), (8, 3)),
    ((5, 8), (2, 8, 3)),
    ((2, 5, 8), (2, 8, 3)),
    ((2, 1, 5, 8), (3, 8, 4)),
    ((1, 5, 8), (4, 8, 2)),
    ((3, 17, 33), (33, 1)),
    ((2, 3, 5, 8), (2, 3, 8, 4)),
    ((2, 3, 5, 8), (1, 3, 8, 4)),
    ((1, 3, 5, 8), (2, 1, 8, 4)),
    ((2, 3, 5, 8), (8, 4)),
    ((3, 1, 7, 64), (1, 4, 64, 9)),
]


@pytest.mark.points(2)
def test_matmul_batches():
    """Walk every call's batch: each output matrix is written once, from the operands' broadcast matrices."""
    from kiln.cuda import matmul_batches

    for sa, sb in MATMUL:
        m, k = sa[-2:]
        n = sb[-1]
        out_batch = tuple(torch.broadcast_shapes(sa[:-2], sb[:-2]))
        calls = matmul_batches(out_batch, sa[:-2], sb[:-2], m, n, k)
        seen = {}
        for call in calls:
            ao, bo, co, batch, sta, stb = (int(v) for v in call)
            for i in range(batch):
                seen.setdefault(co + i * m * n, []).append((ao + i * sta, bo + i * stb))
        # the reference: the batch index's position in each operand, as numpy broadcasting reads it
        count = 1
        for d in out_batch:
            count *= d
        ia = torch.arange(max(1, torch.Size(sa[:-2]).numel())).reshape(sa[:-2] or (1,))
        ib = torch.arange(max(1, torch.Size(sb[:-2]).numel())).reshape(sb[:-2] or (1,))
        if out_batch:
            ia, ib = ia.expand(out_batch).reshape(-1), ib.expand(out_batch).reshape(-1)
        want = {j * m * n: [(int(ia[j]) * m * k, int(ib[j]) * k * n)] for j in range(count)}
        assert seen == want, f"{sa} @ {sb}: the calls {calls} reach {seen}, expected {want}"


@pytest.mark.points(1)
def test_strided_meta():
    """A flat input read through the meta (torch's as_strided, the kernel's indexing) is the permute or slice."""
    from kiln.cuda import strided_meta

    x = rand((2, 3, 4, 5), 1)
    for dims in [(0, 1, 2, 3), (3, 1, 0, 2), (1, 0, 3, 2)]:
        want = x.permute(dims)
        meta = [int(v) for v in strided_meta(want.shape, [x.stride(d) for d in dims], 0)]
        assert len(meta) == 9, f"meta has {len(meta)} values, kiln_strided_copy reads 9"
        got = x.reshape(-1).as_strided(meta[:4], meta[4:8], meta[8]).reshape(want.shape)
        assert torch.equal(got, want), f"permute {dims}: meta {meta} reads the wrong elements"
    y = rand((7, 9), 2)
    meta = [int(v) for v in strided_meta((3, 4), [9, 1], 2 * 9 + 5)]
    assert meta == [1, 1, 3, 4, 0, 0, 9, 1, 23], f"slice [2:5, 5:9] of (7, 9): meta {meta}"
    got = y.reshape(-1).as_strided(meta[:4], meta[4:8], meta[8]).reshape(3, 4)
    assert torch.equal(got, y[2:5, 5:9])


@pytest.mark.points(3)
@pytest.mark.parametrize("op", ["add", "mul"])
def test_add_mul_broadcast(op):
    f = torch.add if op == "add" else torch.mul
    for k, (sa, sb) in enumerate(BROADCAST):
        a, b = rand(sa, 2 * k), rand(sb, 2 * k + 1)
        check(run_op(op, [a, b]), f(a, b))
        check(run_op(op, [b, a]), f(b, a))


@pytest.mark.points(2)
def test_relu_silu():
    for k, shape in enumerate([(1,), (9,), (3, 1), (2, 3, 4, 5), (1, 1, 1, 1), (1000, 33)]):
        x = rand(shape, k) * 4
        check(run_op("relu", [x]), torch.relu(x))
        want = (x.double() * torch.sigmoid(x.double())).float()
        check(run_op("silu", [x]), want, rtol=1e-5, atol=1e-5)


@pytest.mark.points(3)
def test_matmul():
    for k, (sa, sb) in enumerate(MATMUL):
        a, b = rand(sa, 2 * k), rand(sb, 2 * k + 1)
        want = torch.matmul(a.double(), b.double()).float()
        check(run_op("matmul", [a, b]), want, rtol=1e-4, atol=1e-4)


@pytest.mark.points(3)
def test_reshape_permute_slice():
    x = rand((2, 3, 4, 5), 1)
    for dims in [(0, 1, 2, 3), (3, 1, 0, 2), (1, 0, 3, 2), (2, 3, 0, 1)]:
        check(run_op("permute", [x], dims=list(dims)), x.permute(dims).contiguous())
    y = rand((6, 7, 8), 2)
    check(run_op("permute", [y], dims=[2, 0, 1]), y.permute(2, 0, 1).contiguous())
    check(run_op("permute", [y[0]], dims=[1, 0]), y[0].T.contiguous())
    check(run_op("slice", [x], starts=[1, 0, 2, 1], ends=[2, 3, 4, 4]), x[1:2, :, 2:4, 1:4].contiguous())
    check(run_op("slice", [y], starts=[5, 3, 0], ends=[6, 7, 8]), y[5:6, 3:7, :].contiguous())
    z = rand((9,), 3)
    check(run_op("slice", [z], starts=[8], ends=[9]), z[8:9])
    check(run_op("slice", [z], starts=[0], ends=[9]), z)
    check(run_op("reshape", [x], shape=[6, 20]), x.reshape(6, 20))

    # a reshape feeds a kernel and is an output: both read its owner's memory
    import kiln

    b = kiln.Builder("views")
    xin = b.input("x", (2, 3, 4, 5), "float32")
    r = (xin + 1.0).reshape(6, 20)
    b.output(r.permute(1, 0), r)
    got_t, got_r = executor(b.graph).run({"x": x.cuda()})
    check(got_r, (x + 1.0).reshape(6, 20))
    check(got_t, (x + 1.0).reshape(6, 20).T.contiguous())


@pytest.mark.points(3)
def test_mlp_graph():
    """A two-layer MLP with a bias from the builder (constants, permute, matmul, add, relu)."""
    import kiln

    w1, b1 = rand((64, 48), 1), rand((64,), 2)
    w2, b2 = rand((10, 64), 3), rand((10,), 4)
    x = rand((16, 48), 5)
    b = kiln.Builder("mlp")
    xin = b.input("x", (16, 48), "float32")
    h = (xin @ b.constant("fc1.weight", w1).permute(1, 0) + b1).relu()
    y = h @ b.constant("fc2.weight", w2).permute(1, 0) + b2
    b.output(y, h)
    got_y, got_h = executor(b.graph).run({"x": x.cuda()})
    want_h = torch.relu(x.double() @ w1.double().T + b1.double())
    check(got_h, want_h.float(), rtol=1e-4, atol=1e-4)
    check(got_y, (want_h @ w2.double().T + b2.double()).float(), rtol=1e-4, atol=1e-4)


@pytest.mark.points(2)
def test_deep_shared_dag():
    from kiln.models import fibonacci

    levels = 100
    a, b = rand((8,), 1).abs(), rand((8,), 2).abs()
    (got,) = executor(fibonacci(levels)).run({"a": a.cuda(), "b": b.cuda()})
    prev, cur = a, b
    for _ in range(levels):
        prev, cur = cur, prev + cur
    check(got, cur, rtol=1e-6, atol=0)


def write(ex, v, pos):
    (out,) = ex.run({"v": v.cuda(), "pos": torch.tensor(pos, dtype=torch.int64).cuda()})
    return out


@pytest.mark.points(3)
def test_buffer_persists_across_runs():
    from kiln.models import kv_cache

    ex = executor(kv_cache())
    v1, v2 = rand((1, 2, 3), 1), rand((1, 2, 3), 2)
    want = torch.zeros(4, 6, 3)
    want[1, 2:4] = v1[0]
    check(write(ex, v1, [1, 2, 0]), want)
    want[2, 0:2] = v2[0]
    check(write(ex, v2, [2, 0, 0]), want)  # run 1's write is still there


@pytest.mark.points(3)
def test_runtime_offsets_first_and_last():
    from kiln.models import kv_cache

    ex = executor(kv_cache())
    first, last = rand((1, 2, 3), 3), rand((1, 2, 3), 4)
    want = torch.zeros(4, 6, 3)
    want[0, 0:2] = first[0]
    check(write(ex, first, [0, 0, 0]), want)
    want[3, 4:6] = last[0]
    check(write(ex, last, [3, 4, 0]), want)  # the last slot: offsets at their largest

    # a rank-1 cache and a rank-4 one: the offsets are padded like the shapes
    import kiln

    for shape, vshape, pos in (((10,), (3,), [7]), ((2, 3, 4, 5), (1, 1, 2, 5), [1, 2, 2, 0])):
        b = kiln.Builder("cache")
        cache = b.buffer("cache", shape, "float32")
        v = b.input("v", vshape, "float32")
        p = b.input("pos", (len(shape),), "int64")
        b.output(cache.slice_update(v, p))
        value = rand(vshape, 5)
        want = torch.zeros(shape)
        want[tuple(slice(o, o + s) for o, s in zip(pos, vshape, strict=True))] = value
        check(write(executor(b.graph), value, pos), want)


@pytest.mark.points(2)
def test_outputs_independent_of_later_runs():
    import kiln
    from kiln.models import kv_cache

    ex = executor(kv_cache())
    out1 = write(ex, rand((1, 2, 3), 5), [0, 0, 0])
    kept = out1.clone()
    write(ex, rand((1, 2, 3), 6), [1, 0, 0])
    check(out1, kept.cpu())  # run 2 wrote into the cache, not into run 1's result

    # a computed output lives in the arena, which the next run overwrites
    b = kiln.Builder("twice")
    x = b.input("x", (5,), "float32")
    b.output(x * 2.0)
    ex = executor(b.graph)
    (first,) = ex.run({"x": torch.ones(5, device="cuda")})
    ex.run({"x": torch.full((5,), 3.0, device="cuda")})
    check(first, torch.full((5,), 2.0))


SLEEP_CYCLES = 100_000_000  # torch.cuda._sleep: tens of milliseconds of GPU time, far past a run's host work


@pytest.mark.gpu
@pytest.mark.points(2)
def test_waits_for_the_callers_stream():
    """The caller runs on a stream of its own, where a slow kernel is still queued ahead of the
    writes that fill the inputs: run must order its work after everything queued on the caller's
    current stream (not the default stream's, which is idle), and launch on ex.stream only."""
    import kiln

    b = kiln.Builder("stream")
    x = b.input("x", (64, 33), "float32")
    y = b.input("y", (33,), "float32")
    b.output((x * y + x).relu())
    ex = executor(b.graph)
    caller = torch.cuda.Stream()
    for k in range(2):
        xv, yv = rand((64, 33), 40 + k), rand((33,), 50 + k)
        ready = (xv.cuda(), yv.cuda())
        xin, yin = torch.zeros(64, 33, device="cuda"), torch.zeros(33, device="cuda")
        caller.wait_stream(torch.cuda.current_stream())  # the tensors above exist before the caller uses them
        with torch.cuda.stream(caller):
            torch.cuda._sleep(SLEEP_CYCLES)  # the caller's stream is busy ...
            xin.copy_(ready[0])  # ... and only then writes this run's inputs
            yin.copy_(ready[1])
            (got,) = ex.run({"x": xin, "y": yin})
        torch.cuda.synchronize()
        check(got, torch.relu(xv * yv + xv))


@pytest.mark.gpu
@pytest.mark.points(2)
def test_launches_replay_under_capture():
    """The launches (ex.launches) captured into a CUDA graph as task 07 will (a warm-up, then every
    launch on ex.stream), then replayed with new values and new offsets written into the input
    slots: each replay writes where its own offsets say. A launch that reads the offsets on the
    host cannot be captured, and one that fixed them before the capture replays the old position."""
    from kiln.cuda import collection_paused
    from kiln.models import kv_cache

    ex = executor(kv_cache(scale=2.0))
    ex.launch_all()  # warm-up, outside the capture
    ex.stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    codes = []
    with collection_paused(), torch.cuda.graph(graph, stream=ex.stream):
        for _, launch in ex.launches:  # as task 07's capture does: each launch, nothing around it
            codes.append(launch())
    assert not any(codes), f"a launch returned a CUDA error while being captured: {codes}"
    cache = ex.tensors[ex.graph.buffers[0]]
    want = torch.zeros(4, 6, 3)
    with torch.cuda.stream(ex.stream):
        cache.zero_()  # what the warm-up wrote
    for k, pos in enumerate([[3, 4, 0], [0, 0, 0], [1, 2, 0], [2, 3, 0]]):
        v = rand((1, 2, 3), 60 + k)
        want[pos[0], pos[1] : pos[1] + 2] = 2.0 * v[0]
        with torch.cuda.stream(ex.stream):
            ex.input_slot("v").copy_(v.cuda())
            ex.input_slot("pos").copy_(torch.tensor(pos, dtype=torch.int64).cuda())
            graph.replay()
        ex.stream.synchronize()
        assert torch.equal(ex.output_slot(0).cpu(), want), (
            f"replay {k + 1}, offsets {pos}: the cache is not where the offsets say (read them on the device,"
            f" at each run, from their slot)"
        )


@pytest.mark.gpu
@pytest.mark.points(1)
def test_every_copy_on_the_executors_stream():
    """ex.replay() without a graph calls launch_all() from whatever stream the caller has current (lab
    5's decode loop does this): every launch queues all its work, slice_update's copy of the offsets
    included, on ex.stream. The caller's stream here is busy, so work queued there runs late."""
    from kiln.models import kv_cache

    ex = executor(kv_cache())
    caller = torch.cuda.Stream()
    want = torch.zeros(4, 6, 3)
    for k, pos in enumerate([[2, 3, 0], [1, 0, 0], [3, 4, 0]]):
        v = rand((1, 2, 3), 70 + k)
        want[pos[0], pos[1] : pos[1] + 2] = v[0]
        with torch.cuda.stream(ex.stream):
            ex.input_slot("v").copy_(v.cuda())
            ex.input_slot("pos").copy_(torch.tensor(pos, dtype=torch.int64).cuda())
        with torch.cuda.stream(caller):
            torch.cuda._sleep(SLEEP_CYCLES)
            ex.replay()
        ex.stream.synchronize()
        got = ex.output_slot(0).cpu()
        torch.cuda.synchronize()  # the caller's own queue drains before the next step
        assert torch.equal(got, want), (
            f"step {k + 1}, offsets {pos}: the cache is wrong when the launches are queued from a busy"
            f" stream: copy the offsets on ex.stream"
        )


class CountingLib:
    """The kernel library, counting the calls of its entry points."""

    def __init__(self, lib):
        self.lib = lib
        self.calls = 0

    def __getattr__(self, name):
        fn = getattr(self.lib, name)
        if not name.startswith("kiln_"):
            return fn

        def counted(*args):
            self.calls += 1
            return fn(*args)

        return counted


def counting(monkeypatch):
    from kiln import cuda

    lib = CountingLib(cuda.load_kernels())
    monkeypatch.setattr(cuda, "load_kernels", lambda: lib)
    return lib


def bad_inputs():
    ok = {"v": torch.zeros(1, 2, 3, device="cuda"), "pos": torch.zeros(3, dtype=torch.int64, device="cuda")}
    wide = torch.zeros(3, 2, 1, device="cuda").permute(2, 1, 0)  # (1, 2, 3), not contiguous
    return {
        "missing": ({"v": ok["v"]}, ["pos", "missing"]),
        "extra": ({**ok, "w": torch.zeros(1, device="cuda")}, ["w"]),
        "shape": ({**ok, "v": torch.zeros(1, 3, 2, device="cuda")}, ["v", "shape"]),
        "dtype": ({**ok, "pos": torch.zeros(3, dtype=torch.int32, device="cuda")}, ["pos", "dtype"]),
        "contiguous": ({**ok, "v": wide}, ["v", "contiguous"]),
        "device": ({**ok, "v": torch.zeros(1, 2, 3)}, ["v", "cpu"]),
    }


@pytest.mark.points(2)
def test_input_errors_before_any_launch(monkeypatch):
    from kiln.models import kv_cache
    from kiln.runtime import KilnRunError

    lib = counting(monkeypatch)
    ex = executor(kv_cache())
    assert lib.calls == 0, f"building the executor called the kernels {lib.calls} times: only run launches"
    for case, (inputs, words) in bad_inputs().items():
        with pytest.raises(KilnRunError) as err:
            ex.run(inputs)
        for w in words:
            assert w in str(err.value), f"{case}: the message should name {w!r}: {err.value}"
        assert lib.calls == 0, f"{case}: {lib.calls} kernel call(s) before the inputs were refused"
    ok = write(ex, torch.ones(1, 2, 3), [3, 4, 0])
    assert lib.calls >= 1, "a run with good inputs called no kernel: launch through ex.lib (load_kernels())"
    assert ok.sum().item() == 6.0, "a refused run changed the cache"


@pytest.mark.points(1)
def test_failing_launch_names_its_node():
    """A launch that returns an error (1: cudaErrorInvalidValue) is reported at once, by its node."""
    import kiln
    from kiln import ops
    from kiln.cuda import CUDA_LOWERINGS, error_string, register_cuda
    from kiln.runtime import KilnRunError

    if "test_fails" not in ops.REGISTRY:
        ops.register(ops.OpDef("test_fails", 1, lambda ts, attrs: ts[0]))
    if "test_fails" not in CUDA_LOWERINGS:
        register_cuda("test_fails")(lambda ex, node: lambda: 1)
    b = kiln.Builder("fails")
    x = b.input("x", (4,), "float32")
    y = b.op("test_fails", x.relu())
    b.output(y.relu())
    with pytest.raises(KilnRunError) as err:
        executor(b.graph).run({"x": torch.ones(4, device="cuda")})
    msg = str(err.value)
    assert f"%{y.node.name}" in msg and "test_fails" in msg, f"the message should name %{y.node.name}: {msg}"
    assert "invalid argument" in msg or error_string(1) in msg, f"the message should give the CUDA error: {msg}"


@pytest.mark.points(1)
def test_compile():
    import kiln
    from kiln.cpu import CPUExecutor

    b = kiln.Builder("small")
    x = b.input("x", (3, 4), "float32")
    b.output((x * x).silu())
    # fold=False: task 08's pass is graded by task 08, and a student's unfinished one must cost
    # this task nothing
    assert isinstance(kiln.compile(b.graph, device="cpu", fold=False), CPUExecutor)
    v = rand((3, 4), 1)
    (got,) = kiln.compile(b.graph, device="cuda", fold=False, use_graph=False).run({"x": v.cuda()})
    check(got, torch.nn.functional.silu((v * v).double()).float(), rtol=1e-5, atol=1e-5)


def test_cuda_executor(grade):
    grade(TASK)

"""Checks for lab4/kiln/capture.py: the whole forward pass captured into one CUDA graph, which every
run replays (CudaExecutor(graph, use_graph=True), the default). It runs on your kernels (tasks
03-05), planner (01) and CUDA executor (06); with --solutions, the reference of each.

Every case compares the graph executor with the eager one (use_graph=False) on the same inputs:
both run the same kernels in the same order, so the results must be bit for bit equal. The cases:
every operator (broadcasting add and mul, relu, silu, a batched matmul that needs several
launches, permute, slice), an MLP, and a chain of 200 nodes; new inputs on every run
(replays must read the arena slots the run copied them into, not the first run's values);
slice_update with offsets that change on every run, at the first and the last position (the
kernel reads them on the device: a value passed at capture time would stay frozen); buffers that
keep what earlier replays wrote, and start from zeros whatever the capture's warm-up wrote.

Zero launches per run: the test wraps `kiln.cuda.load_kernels` in a proxy that counts calls of
the kernel entry points before the executor is built. Building it (the warm-up and the capture)
calls them; a run must not call any: it replays the graph.

A launch that passes the warm-up and fails while being captured must stop the build with a
KilnRunError naming its node (a graph with a hole would replay stale results). And a run that
replays while the caller's own stream is still writing the inputs (behind a slow kernel) must
replay after that work: this exercises the replay path of your run (task 06) on a busy stream.

TASK.mistakes names the class of mistake each case is there to catch; lab4/solutions/broken.py
has a broken variant for each.

Timing is not graded here: lab4/bench_graph.py measures the per-run time, graph against eager.

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
    number="07",
    title="one CUDA graph per run",
    sources=["kiln/capture.py"],
    builds_on=[*KERNELS, "kiln/planner.py", "kiln/cuda.py"],
    gpu=True,
    timeout=300,
    mistakes={
        "wrong capture stream": "new inputs every run: a capture of another stream records nothing, and"
        " every replay returns what the capture-time launches computed",
        "incomplete capture": "every operator, graph against eager bit for bit: a launch left out keeps the"
        " warm-up's result",
        "capture errors": "a test operator that passes the warm-up and fails in the capture: the executor"
        " must refuse to build, naming the node",
    },
)


def rand(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g)


def both(graph):
    """The graph executor under test and the eager one to compare with."""
    from kiln.cuda import CudaExecutor

    return CudaExecutor(graph, use_graph=True), CudaExecutor(graph, use_graph=False)


def same(graph, inputs, what):
    """Graph and eager give bit-identical outputs (the same kernels, in the same order)."""
    fast, slow = both(graph)
    assert fast.cuda_graph is not None, "use_graph=True must keep the captured graph in ex.cuda_graph"
    got, want = fast.run(inputs), slow.run(inputs)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.shape == w.shape and g.dtype == w.dtype, f"{what}: output {i} is {g.dtype}{list(g.shape)}"
        if not torch.equal(g, w):
            diff = (g - w).abs().max().item()
            raise AssertionError(f"{what}: output {i} of the graph differs from eager (max |diff| {diff:g})")
    return got


def one_op(op, shapes, **attrs):
    import kiln

    b = kiln.Builder(op)
    xs = [b.input(f"x{i}", s, "float32") for i, s in enumerate(shapes)]
    b.output(b.op(op, *xs, **attrs))
    return b.graph, {f"x{i}": rand(s, 10 + i).cuda() for i, s in enumerate(shapes)}


OPS = [
    ("add", [(4, 1, 5), (3, 1)], {}),
    ("mul", [(2, 1, 4, 1), (1, 3, 1, 5)], {}),
    ("relu", [(1000,)], {}),
    ("silu", [(3, 33)], {}),
    ("matmul", [(2, 1, 5, 8), (3, 8, 4)], {}),
    ("matmul", [(16, 48), (48, 10)], {}),
    ("permute", [(2, 3, 4, 5)], {"dims": [3, 1, 0, 2]}),
    ("slice", [(6, 7, 8)], {"starts": [1, 2, 3], "ends": [4, 7, 5]}),
]


@pytest.mark.points(2)
def test_graph_equals_eager_every_op():
    for op, shapes, attrs in OPS:
        graph, inputs = one_op(op, shapes, **attrs)
        same(graph, inputs, f"{op} of {shapes}")


def mlp():
    import kiln

    b = kiln.Builder("mlp")
    x = b.input("x", (16, 48), "float32")
    h = (x @ b.constant("fc1.weight", rand((64, 48), 1)).permute(1, 0) + rand((64,), 2)).relu()
    y = h @ b.constant("fc2.weight", rand((10, 64), 3)).permute(1, 0) + rand((10,), 4)
    b.output(y)
    return b.graph


@pytest.mark.points(2)
def test_mlp_graph_equals_eager():
    same(mlp(), {"x": rand((16, 48), 5).cuda()}, "the MLP")


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


@pytest.mark.points(3)
def test_a_run_launches_nothing(monkeypatch):
    from kiln import cuda

    lib = CountingLib(cuda.load_kernels())
    monkeypatch.setattr(cuda, "load_kernels", lambda: lib)
    ex = cuda.CudaExecutor(mlp(), use_graph=True)
    built = lib.calls
    assert built > 0, "building the executor called no kernel: the capture must call every launch"
    for seed in range(3):
        ex.run({"x": rand((16, 48), seed).cuda()})
    assert lib.calls == built, (
        f"3 runs called the kernels {lib.calls - built} times: a run replays the captured graph, launching nothing"
    )


@pytest.mark.points(3)
def test_new_inputs_every_run():
    from kiln.cuda import CudaExecutor

    graph = mlp()
    fast, slow = CudaExecutor(graph, use_graph=True), CudaExecutor(graph, use_graph=False)
    for seed in range(4):
        x = rand((16, 48), 100 + seed).cuda()
        (got,), (want,) = fast.run({"x": x}), slow.run({"x": x})
        assert torch.equal(got, want), f"run {seed + 1}: the replay did not compute on this run's input"


@pytest.mark.points(3)
def test_offsets_move_every_replay():
    """The offsets change on every run; each replay must write where this run's offsets say."""
    from kiln.cuda import CudaExecutor
    from kiln.models import kv_cache

    ex = CudaExecutor(kv_cache(scale=2.0), use_graph=True)
    want = torch.zeros(4, 6, 3)
    # the first position, the last, places between, and the first again
    for k, pos in enumerate([[0, 0, 0], [3, 4, 0], [1, 2, 0], [2, 3, 0], [0, 0, 0], [3, 4, 0]]):
        v = rand((1, 2, 3), 20 + k)
        want[pos[0], pos[1] : pos[1] + 2] = 2.0 * v[0]
        (got,) = ex.run({"v": v.cuda(), "pos": torch.tensor(pos, dtype=torch.int64, device="cuda")})
        if not torch.equal(got.cpu(), want):
            rows = sorted({(int(i), int(j)) for i, j, _ in (got.cpu() != want).nonzero().tolist()})
            raise AssertionError(
                f"run {k + 1}, offsets {pos}: the cache differs at (row, position) {rows[:6]}: the offsets"
                f" must be read on the device at each replay (and earlier writes kept)"
            )


@pytest.mark.points(2)
def test_buffers_persist_and_start_at_zero():
    """Replays accumulate in the buffer; the capture's warm-up pass leaves no trace in it."""
    import kiln
    from kiln.cuda import CudaExecutor

    b = kiln.Builder("acc")
    acc = b.buffer("acc", (2, 8), "float32")
    row = b.input("row", (1, 8), "float32")
    pos = b.input("pos", (2,), "int64")
    # reads the buffer, then writes the next row: a running sum kept across runs
    total = acc[0:1, :] + row + 1.0
    b.output(acc.slice_update(total, pos))
    ex = CudaExecutor(b.graph, use_graph=True)
    want = torch.zeros(2, 8)
    for k in range(5):
        r = rand((1, 8), 30 + k)
        want[0:1] = want[0:1] + r + 1.0
        (got,) = ex.run({"row": r.cuda(), "pos": torch.tensor([0, 0], device="cuda")})
        torch.testing.assert_close(got.cpu(), want, rtol=1e-6, atol=1e-6, msg=lambda m, k=k: f"run {k + 1}: {m}")
    assert got.cpu()[1].abs().sum().item() == 0.0, "row 1 was never written: it must still be zeros"


@pytest.mark.points(2)
def test_chain_of_200_nodes():
    from kiln.models import chain

    graph = chain(200)
    assert len([n for n in graph.nodes if n.op not in ("input", "constant")]) == 200
    same(graph, {"x": rand((4, 64), 3).cuda()}, "a chain of 200 nodes")


@pytest.mark.gpu
@pytest.mark.points(1)
def test_a_launch_failing_in_the_capture_names_its_node():
    """A launch that passed the warm-up and fails while being captured (a test operator whose second
    call returns cudaErrorInvalidValue) is reported when the executor is built, by its node: a graph
    with a launch missing would replay wrong results without a word."""
    import kiln
    from kiln import ops
    from kiln.cuda import CUDA_LOWERINGS, CudaExecutor, register_cuda
    from kiln.runtime import KilnRunError

    def lower(ex, node):
        calls = []

        def launch():
            calls.append(1)
            return 0 if len(calls) == 1 else 1  # the warm-up's call succeeds, the capture's fails

        return launch

    if "test_fails_in_capture" not in ops.REGISTRY:
        ops.register(ops.OpDef("test_fails_in_capture", 1, lambda ts, attrs: ts[0]))
    if "test_fails_in_capture" not in CUDA_LOWERINGS:
        register_cuda("test_fails_in_capture")(lower)
    b = kiln.Builder("fails")
    x = b.input("x", (4,), "float32")
    y = b.op("test_fails_in_capture", x.relu())
    b.output(y.relu())
    with pytest.raises(KilnRunError) as err:
        CudaExecutor(b.graph, use_graph=True)
    msg = str(err.value)
    assert f"%{y.node.name}" in msg, f"the message should name %{y.node.name} (test_fails_in_capture): {msg}"


@pytest.mark.gpu
@pytest.mark.points(1)
def test_replays_after_the_callers_stream():
    """A run that replays the graph while the caller's own stream is still busy writing the inputs
    (a slow kernel ahead of the writes) computes on this run's inputs, every run."""
    from kiln.cuda import CudaExecutor

    graph = mlp()
    fast, slow = CudaExecutor(graph, use_graph=True), CudaExecutor(graph, use_graph=False)
    caller = torch.cuda.Stream()
    for seed in range(2):
        x = rand((16, 48), 200 + seed).cuda()
        (want,) = slow.run({"x": x})
        xin = torch.zeros(16, 48, device="cuda")
        caller.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(caller):
            torch.cuda._sleep(100_000_000)  # tens of milliseconds: far past the run's host work
            xin.copy_(x)
            (got,) = fast.run({"x": xin})
        torch.cuda.synchronize()
        assert torch.equal(got, want), f"run {seed + 1}: the replay read the input before the caller wrote it"


def test_cuda_graph(grade):
    grade(TASK)

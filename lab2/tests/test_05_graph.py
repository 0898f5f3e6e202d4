"""Checks for lab2/05_graph.cu: a sum of n floats as a tree of one-block kernels (one per 16384
floats, then one per 16 partial sums up to a single root), built once per n as an explicit CUDA
graph and launched with one cudaGraphLaunch, timed against reduce_launches, given in the file, which
launches the same kernels one by one.

The tolerance is task 10's, for the same reason: the tree adds in float32 in its own order, and is
compared with the float64 sum. The inputs are |randn| + 0.5, all positive, so no sum cancels and a
summation whose longest chain of additions has d additions is off by at most
gamma_d = d·u/(1 - d·u), u = 2^-24 (Higham, §4.2), relative to the exact sum. The longest chain
here is about 50 additions at n = 2^26: about 20 in a level-0 node (each thread adds 8 float4 loads
of 4 values, then 5 shuffle steps in its warp and 5 over the warps' sums) and about 10 in each of
the 3 levels above. rtol = 1e-5 admits d <= 167, so it holds with a wide margin at every n of the
contract, while a lost element or node changes the sum by more: the mean input is about 1.3, so one
element >= 0.5 counts up to n ~ 4·10^4, and a whole level-0 node (16384 values) at every n. A short
last node counts where it is a large enough share of the sum: n = 16385 (a second node of one
element) and 270339 (a 17th node of 8195 elements, alone under the second of two level-1 nodes)
catch a lost one; at n = 2^20 + 3 the last node's 3 elements are below the tolerance. Like every
deterministic task, two runs on the same input must agree bit for bit.

Two checks run first. `graph_follows_n`: n = 1000, then 2^20 + 3, then 1000 again, each right (a
graph kept after n changed sums the old n's elements). `graph_follows_pointers`: the same n with two
input and output arrays, called back to back, both right (a graph whose nodes hold the first call's
pointers reads the first input again and never writes the second output).

A third, `graph_edges_hold_under_replay`, looks for dependency edges that are missing or point at
the wrong nodes: a race between nodes, which the cases rarely see, since their few level-0 nodes
run at once and finish together. It launches the graph of n = 2^26 32 times back to back, in turn
on two inputs whose sums differ threefold, each launch writing its own element of out. n = 2^26
gives level 0 4096 nodes, far more than run at once, so they run in waves; the inputs start one
float into their buffers, so every level-0 node takes the scalar path of block_sum and runs
longer. A node that starts before one it reads from finds the partial sums of the previous launch,
of the other input, and its launch is off by a whole node's share, far past rtol; launches on the
same input must also agree bit for bit. It costs a few milliseconds on the GPU.
"""

from grader.child.context import RunContext
from grader.tasks import NO_LIBRARIES, Case, CudaTask, Entry, In, Int, Out, PerfTarget
from grader.tasks.rules import calls, never_calls, replays_graph
from grader.tasks.seeds import seed_for
from grader.tasks.spec import Rng

ARGS = [In("in"), Out("out"), Int("n")]
SIZES = [1, 1000, 16385, 270339, (1 << 20) + 3]  # one node; two level-0 nodes; three levels
TIMING = 1 << 22  # 256 + 16 + 1 = 273 nodes of a few µs each
RTOL = 1e-5


def positive(rng, n):
    return rng.randn(n).abs_().add_(0.5)


def make_inputs(p, rng):
    return {"in": positive(rng, p["n"]), "n": p["n"]}


def reference(v):
    import torch

    return {"out": v["in"].double().sum().reshape(1).to(torch.float32)}


def torch_sum(v, o):
    import torch

    torch.sum(v["in"], dim=0, keepdim=True, out=o["out"])


def bytes_moved(v):
    return 4 * v["n"]


def entry(symbol):
    return Entry(symbol, ARGS, reference=reference, baseline=torch_sum, bytes_moved=bytes_moved)


def _wrong(got: float, x) -> bool:
    exact = float(x.double().sum())
    return not abs(got - exact) <= RTOL * abs(exact)


def graph_follows_n(ctx: RunContext) -> None:
    """n changes between calls: the graph must be rebuilt for the new n each time."""
    import torch

    fn = ctx.entry("reduce_graph")
    rng = Rng(seed_for(ctx.task, "graph_follows_n"), "cuda")
    big = (1 << 20) + 3
    x = positive(rng, big)
    sizes = [1000, big, 1000]
    for i, n in enumerate(sizes):
        out = torch.full((1,), float("nan"), device="cuda")
        ctx.check_rc("reduce_graph", fn({"in": x[:n], "out": out, "n": n}), f"n={n}")
        torch.cuda.synchronize()
        got = float(out[0])
        if _wrong(got, x[:n]):
            before = f", right after a call with n={sizes[i - 1]}," if i else ""
            hint = ""
            if got != got:  # NaN: the grader's fill
                hint = ": out[0] was never written (it still holds the NaN the grader put there)"
            elif i and not _wrong(got, x[: sizes[i - 1]]):
                hint = (
                    f": that is the sum of the first {sizes[i - 1]} elements, the previous call's n. A graph"
                    " sums the n it was built for: build it again when n changes"
                )
            ctx.fail(
                f"reduce_graph(n={n}){before} is wrong: it wrote {got!r}, expected"
                f" {float(x[:n].double().sum())!r}{hint}"
            )


def graph_follows_pointers(ctx: RunContext) -> None:
    """Same n, new arrays: the graph's launch must read this call's input and write this call's out."""
    import torch

    fn = ctx.entry("reduce_graph")
    rng = Rng(seed_for(ctx.task, "graph_follows_pointers"), "cuda")
    n = (1 << 20) + 3
    xs = [positive(rng, n), positive(rng, n)]
    outs = [torch.full((1,), float("nan"), device="cuda") for _ in xs]
    for x, out in zip(xs, outs, strict=True):  # back to back, no synchronization in between
        ctx.check_rc("reduce_graph", fn({"in": x, "out": out, "n": n}), f"n={n}")
    torch.cuda.synchronize()
    for k, (x, out) in enumerate(zip(xs, outs, strict=True)):
        got = float(out[0])
        if got != got:  # NaN: never written
            ctx.fail(
                f"two calls with n={n} and different arrays: the output of call {k + 1} is wrong, never written."
                " The instantiated graph keeps the arguments its nodes were built with: give it this call's"
                " in and out before each launch (the bind node)"
            )
        if _wrong(got, x):
            ctx.fail(
                f"two calls with n={n} and different arrays: call {k + 1} is wrong: it wrote {got!r}, expected"
                f" {float(x.double().sum())!r} (the sum of its own input)"
            )


# graph_edges_hold_under_replay: the largest n, so that level 0 has 4096 nodes, more than run at once
REPLAYS = 32
MAX_N = 1 << 26


def graph_edges_hold_under_replay(ctx: RunContext) -> None:
    """REPLAYS launches back to back at n = 2^26, alternating between two inputs whose sums differ
    threefold, each one float into its buffer (so every level-0 node takes the slower scalar path),
    each launch writing its own element of out. A node that starts before a node it reads from reads
    what the previous launch, of the other input, left in the partial sums: its launch is wrong by a
    whole node's share. Launches on the same input must also agree bit for bit."""
    import torch

    fn = ctx.entry("reduce_graph")
    rng = Rng(seed_for(ctx.task, "graph_edges_hold_under_replay"), "cuda")
    n = MAX_N
    xs = [positive(rng, n + 1)[1:], positive(rng, n + 1).mul_(3.0)[1:]]
    exact = [float(x.double().sum()) for x in xs]
    out = torch.full((REPLAYS,), float("nan"), device="cuda")
    for i in range(REPLAYS):  # no synchronization in between
        ctx.check_rc("reduce_graph", fn({"in": xs[i % 2], "out": out[i : i + 1], "n": n}), f"launch {i + 1} at n={n}")
    torch.cuda.synchronize()
    got = out.tolist()
    for i, g in enumerate(got):
        want = exact[i % 2]
        if not abs(g - want) <= RTOL * abs(want):
            ctx.fail(
                f"{REPLAYS} launches of reduce_graph at n={n} (2^26, the input one float into its buffer), back to"
                f" back, alternating between two inputs: launch {i + 1} is wrong: it wrote {g!r}, expected {want!r}."
                " A node read partial sums before the nodes that write them had run (they held the previous"
                " launch's, of the other input): give every node an edge from each node whose result it reads,"
                " and the level-0 nodes one from the bind node"
            )
    for parity in (0, 1):
        values = sorted({got[i] for i in range(parity, REPLAYS, 2)})
        if len(values) > 1:
            ctx.fail(
                f"{REPLAYS} launches of reduce_graph at n={n} on the same two inputs in turn: the launches on one"
                f" input wrote {len(values)} different sums ({values[0]!r} to {values[-1]!r}), where the tree adds"
                " in one fixed order: a node ran before one it depends on"
            )


# The mistakes these checks are designed to catch, each with the input or check that exposes it
# (lab2/solutions/broken.py has a variant of each).
MISTAKES = {
    "missing edge": "graph_edges_hold_under_replay: 32 launches at n = 2^26, 4096 slow leaves, two inputs in turn",
    "stale graph": "graph_follows_n: n = 1000, then 2^20 + 3, then 1000",
    "pointers of the call": "graph_follows_pointers and every check: the instantiated graph gets each call's arrays",
    "root output": "every case: out[0] keeps the grader's NaN",
}

TASK = CudaTask(
    lab="lab2",
    number="05",
    title="an explicit CUDA graph",
    mistakes=MISTAKES,
    sources=["05_graph.cu"],
    entries=[entry("reduce_graph"), entry("reduce_launches")],
    cases=[Case(f"n={n}", n=n) for n in SIZES] + [Case("n=2^22", n=TIMING)],
    make_inputs=make_inputs,
    output_shapes=lambda v: {"out": (1,)},
    tolerance={"f32": (0.0, RTOL)},
    timing_case="n=2^22",
    checks=[graph_follows_n, graph_follows_pointers, graph_edges_hold_under_replay],
    rules=[
        NO_LIBRARIES,
        # judged on what reduce_graph's compiled code reaches and, on a GPU, on one observed call
        calls("cudaGraphAddKernelNode", "build the graph node by node with cudaGraphAddKernelNode", "reduce_graph"),
        calls(
            r"cudaGraphInstantiate\w*", "instantiate the graph (once per n) with cudaGraphInstantiate", "reduce_graph"
        ),
        replays_graph("run the tree with one cudaGraphLaunch per call, the graph built once per n", "reduce_graph"),
        never_calls(
            r"cudaStreamBeginCapture\w*",
            "this task builds its graph with the explicit API; recording a stream (capture) is task 04's way",
        ),
    ],
    perf=[PerfTarget("reduce_graph", "speedup_over:reduce_launches", 1.3, 2, gate=True)],
)


def test_graph(grade):
    grade(TASK)

"""Checks for lab2/04_streams.cu: a chunked host -> device -> kernel -> host pipeline, three ways:
pipeline_serial (given: every chunk on the default stream, one after another), pipeline_streams
(the chunks spread over streams, so that uploads, kernels and downloads overlap) and pipeline_graph
(the same work captured once into a CUDA graph and replayed). Both student versions are timed
against pipeline_serial with the grader's host timer (the copies are part of the work).

The inputs. x and y are host arrays in pageable memory (the grader allocates them with torch on the
CPU, never pinned), so the file stages them through its own pinned buffer. Every x[i] is a random
integer in [0, MODULUS); y[i] is x[i] after ROUNDS steps of v -> (2 v + INCREMENT) mod MODULUS.

The tolerance is zero. Every value the kernel ever holds is an integer below 3 * MODULUS < 2^24, and
float32 holds every integer up to 2^24 exactly: 2 v + INCREMENT (one FFMA) and v - MODULUS are exact,
so the result does not depend on rounding, on the GPU or on the order of anything, and must equal
the reference bit for bit. The reference is the closed form: with w = v + INCREMENT each step
doubles w (mod MODULUS), so y = (A x + INCREMENT (A - 1)) mod MODULUS with A = 2^ROUNDS mod
MODULUS, computed in int64 (A x < 2^44). A zero, a pass-through of x, a chunk left undone (its x
still in the staging buffer), a chunk computed twice or a download that landed late all differ from
it. A stale graph or a staging buffer that did not grow show only when the size changes between
calls, which the cases do (1, 1000, 2^20 = one whole chunk, 2^20 + 3 = a chunk of 3 elements at the
end, 2^24) and the check `sizes_change_between_calls` does on purpose, before the cases.

MODULUS, INCREMENT and ROUNDS must stay equal to the constants of the same names in 04_streams.cu.

A kernel launched off its chunk's stream (on the legacy default stream, which the non-blocking
streams neither wait for nor hold up) is ordered after neither of its copies: pipeline_streams
returns the staged x, and pipeline_graph's capture fails. A graph captured again when n changes
but not when the buffers move replays copies into freed buffers in the size sequence.
"""

from grader.child.context import RunContext
from grader.tasks import NO_LIBRARIES, Case, CudaTask, Entry, HostIn, HostOut, Int, PerfTarget
from grader.tasks.rules import calls, calls_each_time, pinned_copies, replays_graph

MODULUS = 4194301
INCREMENT = 2718281
ROUNDS = 512
CHUNK = 1 << 20  # floats per chunk in 04_streams.cu: the sizes below are chosen around it

MULTIPLIER = pow(2, ROUNDS, MODULUS)  # A: each step doubles v + INCREMENT
OFFSET = INCREMENT * (MULTIPLIER - 1) % MODULUS

ARGS = [HostIn("x"), HostOut("y"), Int("n")]
SIZES = [1, 1000, CHUNK, CHUNK + 3]
TIMING = 1 << 24  # 16 chunks of 4 MiB: 64 MiB up and 64 MiB down


def make_inputs(p, rng):
    return {"x": rng.integers(0, MODULUS, p["n"]).float(), "n": p["n"]}


def scramble(x):
    """y for x, as float32, on x's device (the GPU's when there is one: it is the faster)."""
    import torch

    device = "cuda" if torch.cuda.is_available() else x.device
    v = x.to(device=device, dtype=torch.int64)
    return ((v * MULTIPLIER + OFFSET) % MODULUS).to(torch.float32).to(x.device)


def reference(v):
    return {"y": scramble(v["x"])}


# (entry point, n): sizes that go up and down between calls. The first call makes the buffers hold
# 3 chunks, so the graph built for 5000 is replayed on 2^20 + 3 without any reallocation (a graph
# that is never rebuilt leaves elements 5000 and on as the staged x); 2^20 + 77 has as many chunks
# as 2^20 + 3 (cudaGraphExecUpdate can reuse the nodes), 3000 fewer; pipeline_streams at 2^22 + 5
# grows the buffers past the first size (a staging buffer that never grows overflows there), and the
# graph of n = 3000 that follows must notice that the buffers moved although its own n did not.
SEQUENCE = [
    ("pipeline_serial", 3 * CHUNK + 1),
    ("pipeline_graph", 5000),
    ("pipeline_graph", 5000),
    ("pipeline_graph", CHUNK + 3),
    ("pipeline_graph", CHUNK + 77),
    ("pipeline_graph", 3000),
    ("pipeline_streams", 4 * CHUNK + 5),
    ("pipeline_graph", 3000),
    ("pipeline_streams", 77),
]


def sizes_change_between_calls(ctx: RunContext) -> None:
    """Each call of SEQUENCE, on fresh inputs, must return exactly the reference: the buffers grow
    when n does, and a graph is rebuilt when n or the buffers changed."""
    import numpy as np

    from grader.tasks.seeds import seed_for
    from grader.tasks.spec import Rng

    before = "the first call"
    for k, (symbol, n) in enumerate(SEQUENCE):
        x = make_inputs({"n": n}, Rng(seed_for(ctx.task, f"sequence/{k}"), "cpu"))["x"].contiguous()
        y = np.full(n, np.nan, dtype=np.float32)
        where = f"{symbol}(n={n}), call {k + 1} of a sequence of sizes (after {before})"
        ctx.check_rc(symbol, ctx.entry(symbol)({"x": x.numpy(), "y": y, "n": n}), where)
        expected = scramble(x).numpy()
        wrong = np.flatnonzero(y != expected)
        if wrong.size:
            i = int(wrong[0])
            stale = int((y[wrong] == x.numpy()[wrong]).sum())
            ctx.fail(
                f"{where}: {wrong.size} of {n} elements wrong, the first at index {i} ({y[i]:.0f} instead of "
                f"{expected[i]:.0f}); {stale} of them still hold their input (never computed). Was a graph "
                f"replayed for another size, or for buffers that have since moved? Does every buffer grow "
                f"when n does?"
            )
        before = f"{symbol}(n={n})"


def entry(symbol):
    return Entry(symbol, ARGS, reference=reference)


# The mistakes these checks are designed to catch, each with the input or check that exposes it
# (lab2/solutions/broken.py has a variant of each).
MISTAKES = {
    "returns before the downloads": "every call: y is read as soon as the call returns",
    "stale graph": "sizes_change_between_calls: n changes, and the buffers move under a graph of the same n",
    "buffer never grows": "sizes_change_between_calls: pipeline_streams(2^22 + 5) after a first call of 3 x 2^20 + 1",
    "wrong stream": "every call, and the capture: a kernel off its chunk's stream is ordered after neither copy",
    "no overlap": "the 1.2x performance targets over pipeline_serial at n = 2^24",
}

TASK = CudaTask(
    lab="lab2",
    number="04",
    title="streams, pinned memory and a CUDA graph",
    mistakes=MISTAKES,
    sources=["04_streams.cu"],
    entries=[entry("pipeline_serial"), entry("pipeline_streams"), entry("pipeline_graph")],
    cases=[Case(f"n={n}", n=n) for n in SIZES] + [Case("n=2^24", n=TIMING)],
    make_inputs=make_inputs,
    tolerance={"f32": (0.0, 0.0)},
    timing_case="n=2^24",
    checks=[sizes_change_between_calls],
    rules=[
        NO_LIBRARIES,
        # judged on what each entry point's compiled code reaches and, on a GPU, on one observed call
        pinned_copies("the staging buffer is pinned (cudaMallocHost)", entries=["pipeline_streams", "pipeline_graph"]),
        calls_each_time("cudaMemcpyAsync", "the chunks' copies are asynchronous (cudaMemcpyAsync)", "pipeline_streams"),
        calls(r"cudaStreamCreate\w*", "the chunks run on streams you create", ["pipeline_streams", "pipeline_graph"]),
        calls("cudaStreamBeginCapture", "pipeline_graph records its work by stream capture", "pipeline_graph"),
        calls("cudaStreamWaitEvent", "the capture forks and joins its streams with events", "pipeline_graph"),
        replays_graph("pipeline_graph replays its graph with cudaGraphLaunch", "pipeline_graph"),
    ],
    perf=[
        PerfTarget("pipeline_streams", "speedup_over:pipeline_serial", 1.2, 2, gate=True),
        PerfTarget("pipeline_graph", "speedup_over:pipeline_serial", 1.2, 2, gate=True),
    ],
)


def test_streams(grade):
    grade(TASK)

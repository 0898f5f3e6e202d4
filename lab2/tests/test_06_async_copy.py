"""Checks for lab2/06_async_copy.cu: y = a * x for HOST arrays, through the GPU, with the copies
in chunks through pinned staging buffers on two streams (copy_pinned), timed against
copy_pageable, given in the file, which uses cudaMemcpy on the caller's pageable arrays.

x is standard normal, a uniform in [-2, 2]; both arrive as the grader's ordinary (pageable) host
memory. There is no tolerance: y[i] = a * x[i] is one float32 multiplication, which IEEE 754
rounds correctly, so it has exactly one right answer (the float64 product of the two float32
values, exact in float64, rounded once to float32). A chunk copied twice, copied from the wrong
slot or never copied back is wrong at every element it touches. The sizes: one element, a
thousand (one short chunk), one element past a whole chunk (2^21 + 1: a second chunk of one
element), three chunks of which the last holds 3 elements (2^22 + 3), and the timing size, 2^24
floats (64 MiB each way, 8 chunks).

A check runs first, `caller_buffers_not_left_registered`: after one call on fresh arrays, the
grader tries to register x and y itself (cuMemHostRegister, in the driver). Success means the call
left them as it found them, and the grader unregisters them again; the error
CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED means the call page-locked them and never unregistered
them, which the contract forbids: the caller may free them at once, and a registration kept for a
freed range (a cache keyed by pointer) pins memory that is no longer the caller's. Any other answer
from the driver leaves the question open (a note, no verdict).

A second check, `back_to_back_calls_each_see_their_own_inputs`, makes 40 short calls in a row
(n = 1, 7, 1000, 4099), each on new values. A call that copies its last chunk out of the staging
buffer without waiting for the copy back into it hands y what the previous call left there; the
cases alone can miss that, since the grader calls a case more than once with the same inputs, and
a stale result of the same inputs is right.

A kernel launched on the legacy default stream instead of its slot's stream is ordered after
neither copy: the 40 back-to-back calls and the cases get x unscaled.
"""

import ctypes

from grader.child.context import RunContext
from grader.tasks import NO_LIBRARIES, Case, CudaTask, Entry, Float, HostIn, HostOut, Int, PerfTarget
from grader.tasks.rules import calls_each_time, pinned_copies
from grader.tasks.seeds import seed_for
from grader.tasks.spec import Rng

ARGS = [HostIn("x"), HostOut("y"), Int("n"), Float("a")]
SIZES = [1, 1000, (1 << 21) + 1, (1 << 22) + 3]
TIMING = 1 << 24
ALREADY_REGISTERED = 712  # CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED (cuda.h)


def make_inputs(p, rng):
    return {"x": rng.randn(p["n"]), "n": p["n"], "a": rng.scalar()}


def as_float32(a: float) -> float:
    """The value the entry point receives: ctypes passes a as a C float."""
    return float(ctypes.c_float(a).value)


def reference(v):
    return {"y": (v["x"].double() * as_float32(v["a"])).float()}


def torch_round_trip(v, o):
    # torch's own way from pageable memory: copy in, multiply, copy back
    o["y"].copy_((v["x"].cuda() * v["a"]).cpu())


def bytes_moved(v):
    return 8 * v["n"]  # x to the device and y back, over the host link


def entry(symbol):
    return Entry(symbol, ARGS, reference=reference, baseline=torch_round_trip, bytes_moved=bytes_moved)


def _register_probe(cuda: ctypes.CDLL, address: int, nbytes: int) -> int:
    """cuMemHostRegister on [address, address + nbytes), undone at once when it succeeds."""
    register = getattr(cuda, "cuMemHostRegister_v2", None) or cuda.cuMemHostRegister
    register.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
    register.restype = ctypes.c_int
    rc = register(ctypes.c_void_p(address), ctypes.c_size_t(nbytes), ctypes.c_uint(0))
    if rc == 0:
        cuda.cuMemHostUnregister.argtypes = [ctypes.c_void_p]
        cuda.cuMemHostUnregister(ctypes.c_void_p(address))
    return rc


def call_on_fresh_arrays(ctx: RunContext, fn, rng: Rng, n: int, where: str):
    """copy_pinned on host arrays allocated for this one call, as a caller would: (x, y, how many
    elements of y differ from the one right answer)."""
    import numpy as np

    x = rng.randn(n).cpu().numpy().copy()  # an allocation of its own
    a = rng.scalar()
    y = np.full(n, np.nan, dtype=np.float32)
    ctx.check_rc("copy_pinned", fn({"x": x, "y": y, "n": n, "a": a}), where)
    expected = (x.astype(np.float64) * as_float32(a)).astype(np.float32)
    return x, y, int((y != expected).sum())


def caller_buffers_not_left_registered(ctx: RunContext) -> None:
    """One call on fresh arrays, then the arrays must be registrable again: nothing left pinned."""
    rng = Rng(seed_for(ctx.task, "caller_buffers_not_left_registered"), "cuda")
    n = (1 << 22) + 3
    x, y, bad = call_on_fresh_arrays(ctx, ctx.entry("copy_pinned"), rng, n, f"n={n}")
    if bad:
        ctx.fail(f"copy_pinned(n={n}) on fresh arrays: {bad} of {n} elements of `y` are wrong")
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        ctx.note("could not load libcuda to check that x and y were left unregistered")
        return
    for name, arr in (("x", x), ("y", y)):
        rc = _register_probe(cuda, arr.ctypes.data, arr.nbytes)
        if rc == ALREADY_REGISTERED:
            ctx.fail(
                f"after copy_pinned(n={n}) returned, `{name}` is still registered with CUDA (page-locked): "
                "cudaHostUnregister every range you cudaHostRegister before returning, on every path; the "
                "caller may free its arrays right after the call"
            )
        if rc != 0:
            ctx.note(f"could not check whether `{name}` was left registered (cuMemHostRegister returned {rc})")
            return


def back_to_back_calls_each_see_their_own_inputs(ctx: RunContext) -> None:
    """Forty short calls in a row, each on new values: a call that hands back its staging buffer
    before its own copy back has landed returns the previous call's results."""
    fn = ctx.entry("copy_pinned")
    rng = Rng(seed_for(ctx.task, "back_to_back_calls_each_see_their_own_inputs"), "cuda")
    for i in range(40):
        n = (1, 7, 1000, 4099)[i % 4]
        _, _, bad = call_on_fresh_arrays(ctx, fn, rng, n, f"n={n}, call {i + 1} of 40")
        if bad:
            ctx.fail(
                f"copy_pinned(n={n}), call {i + 1} of 40 in a row, each on new values: {bad} of {n} elements of "
                "`y` are wrong. Did the host copy a chunk out of its staging buffer before the copy back into it "
                "had finished (a missing wait for the last chunk's event)? An earlier call's results were still there"
            )


# The mistakes these checks are designed to catch, each with the input or check that exposes it
# (lab2/solutions/broken.py has a variant of each).
MISTAKES = {
    "missing wait": "back_to_back_calls_each_see_their_own_inputs: 40 short calls on new values",
    "staging buffer reused too early": "n = 2^22 + 3 and 2^24, several chunks whose copies overlap the host's",
    "caller memory left registered": "caller_buffers_not_left_registered: the grader registers x and y after a call",
    "wrong stream": "the 40 back-to-back calls, every case: a kernel off its slot's stream waits for no copy",
}

TASK = CudaTask(
    lab="lab2",
    number="06",
    title="pinned memory and asynchronous copies",
    mistakes=MISTAKES,
    sources=["06_async_copy.cu"],
    entries=[entry("copy_pinned"), entry("copy_pageable")],
    cases=[Case(f"n={n}", n=n) for n in SIZES] + [Case("n=2^24", n=TIMING)],
    make_inputs=make_inputs,
    tolerance={"f32": (0.0, 0.0)},
    timing_case="n=2^24",
    checks=[caller_buffers_not_left_registered, back_to_back_calls_each_see_their_own_inputs],
    rules=[
        NO_LIBRARIES,
        # judged on what copy_pinned's compiled code reaches and, on a GPU, on one observed call
        calls_each_time("cudaMemcpyAsync", "move the chunks with cudaMemcpyAsync on your streams", "copy_pinned"),
        pinned_copies(
            "stage the chunks in pinned buffers you allocate once (cudaMallocHost or cudaHostAlloc)", "copy_pinned"
        ),
    ],
    perf=[PerfTarget("copy_pinned", "speedup_over:copy_pageable", 1.5, 2, gate=True)],
)


def test_async_copy(grade):
    grade(TASK)

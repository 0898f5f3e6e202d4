"""Checks for lab2/10_reduction.cu: the reduction ladder, six kernels that sum n floats, from
interleaved addressing to a grid-stride loop with float4 loads, timed against torch.sum.

The tolerance. The six rungs add the same numbers in different orders, and float32 addition is
not associative, so no order is "the" answer: each is compared with the float64 sum. The inputs
are |randn| + 0.5, all positive, so no sum cancels and sum(|x|) = |sum(x)|: a summation whose
longest chain of additions from an input to the result has d additions is then off by at most
gamma_d = d·u/(1 - d·u) relative to the exact sum, u = 2^-24 (Higham, Accuracy and Stability of
Numerical Algorithms, §4.2), whatever the order and whatever n. rtol = 1e-5 admits d <= 167: a
tree over 2^31 elements has depth 31 (plus one add per pass for the rungs that add during
load), and the grid-stride rung chains n / (threads in the grid) additions per thread, about 62
for 2^26 floats on an H100's 1056 x 256 threads; random rounding errors stay far below the
worst case besides. Values >= 0.5 make every element count: one dropped element changes the sum
by more than the tolerance up to n ~ 4·10^4 (the cases n <= 4097 catch a lost tail), one dropped
block of 256 up to n ~ 2·10^7 (n = 2^20 + 3 and 2^24 catch it), a dropped pass or block of the
grid-stride rung at every size.

The case "n=4097 view one float in" makes rung 6 peel the floats before the first 16-byte
boundary: float4 loads from the view's own start fault (misaligned address).
"""

from grader.tasks import NO_LIBRARIES, Case, CudaTask, Entry, In, Out, PerfTarget, Rule, Size, uses_shared_memory
from grader.tasks.ladder import Ladder
from grader.tasks.rules import executes

ARGS = [In("in"), Out("out"), Size("n")]
SIZES = [1, 2, 31, 32, 33, 1000, 1024, 1025, 4097, (1 << 20) + 3]
TIMING = 1 << 26


def make_inputs(p, rng):
    n, offset = p["n"], p.get("offset", 0)
    # offset = 1: a view that starts one float (4 bytes) past a 16-byte boundary, for the float4 rung
    x = rng.randn(n + offset).abs_().add_(0.5)[offset:]
    return {"in": x, "n": n}


def reference(v):
    import torch

    return {"out": v["in"].double().sum().reshape(1).to(torch.float32)}


def torch_sum(v, o):
    import torch

    torch.sum(v["in"], dim=0, keepdim=True, out=o["out"])


def bytes_moved(v):
    return 4 * v["n"]  # every float read once; the one written is negligible


def entry(symbol):
    return Entry(symbol, ARGS, reference=reference, baseline=torch_sum, bytes_moved=bytes_moved)


RUNGS = ["reduce_1", "reduce_2", "reduce_3", "reduce_4", "reduce_5", "reduce_6"]

# The mistakes these checks are designed to catch, each with the input or check that exposes it
# (lab2/solutions/broken.py has a variant of each).
MISTAKES = {
    "tail": "n = 1 to 4097 not a multiple of 4 or of a block: every element counts",
    "missing __syncwarp": "the sanitizer (racecheck) on rung 4's last warp, and repeated runs agreeing bit for bit",
    "unaligned view": "n = 4097 view one float in: rung 6's float4 loads need an aligned head",
}

TASK = CudaTask(
    lab="lab2",
    number="10",
    title="reduction ladder",
    mistakes=MISTAKES,
    sources=["10_reduction.cu"],
    entries=[entry(s) for s in RUNGS],
    cases=[Case(f"n={n}", n=n) for n in SIZES]
    + [
        Case("n=4097 view one float in", n=4097, offset=1),
        Case("n=2^24", n=1 << 24),
        Case("n=2^26", n=TIMING),
        Case("n=2^31+17", huge=True, n=(1 << 31) + 17),  # size_t indices (make grade only: 8 GiB of input)
    ],
    make_inputs=make_inputs,
    output_shapes=lambda v: {"out": (1,)},
    tolerance={"f32": (0.0, 1e-5)},
    timing_case="n=2^26",
    rules=[
        NO_LIBRARIES,
        # the SASS of the kernels each rung reaches (the shuffle also in the kernel a call launched):
        # a shuffle in a dead helper or a float4 never loaded is no instruction
        executes(r"SHFL\.(DOWN|BFLY)", "rung 5 exchanges values between lanes with __shfl_down_sync", "reduce_5"),
        executes(r"LDG(\.\w+)*\.128", "rung 6 loads four floats at a time (float4)", "reduce_6", each_call=False),
        # __syncwarp leaves no instruction in the SASS of a converged warp: only the text can show it
        Rule("require", r"__syncwarp\s*\(", "rung 4's last warp orders its shared-memory steps with __syncwarp"),
        uses_shared_memory("every rung combines its threads' sums in shared memory"),
    ],
    perf=[
        PerfTarget("reduce_6", "share_of_copy", 0.85, 2, gate=True),
        PerfTarget("reduce_6", "speedup", 0.9, 2, gate=True),
    ],
    ladder=Ladder(
        name="reduction",
        rungs=RUNGS,
        sweep=[Case("n=2^20", n=1 << 20), Case("n=2^24", n=1 << 24), Case("n=2^26", n=TIMING)],
        baselines={"torch": torch_sum},
        metric="gbps",
        labels={
            "reduce_1": "1 interleaved addressing (divergent)",
            "reduce_2": "2 sequential addressing",
            "reduce_3": "3 first add during load",
            "reduce_4": "4 unrolled last warp (`__syncwarp`)",
            "reduce_5": "5 warp shuffles",
            "reduce_6": "6 grid-stride, float4 loads",
        },
    ),
)


def test_reduction(grade):
    grade(TASK)

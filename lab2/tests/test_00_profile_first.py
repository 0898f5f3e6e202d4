"""Checks for lab2/00_profile_first.cu: iters rounds of a 3-point moving average (clamped edges),
computed by smooth_fast and timed against smooth_slow, given in the file (correct, but with an
allocation, a synchronization and a host round trip every round, and one thread per block).

The inputs. x is standard normal; n = 1, 2 and 3 are the sizes where both ends clamp (at n = 1
an element is its own left and right neighbour), 1000 and 2^20 + 3 are not multiples of the 256
threads of a block; each size runs 1, 2 and 10 rounds, so that both parities of iters are
checked (the last round must land in y whichever buffer the first one writes) and errors at the
edges, which spread one element inwards per round, reach the interior.

The tolerance is 0: smooth_fast must give smooth_slow's bits exactly. Float32 addition is not
associative, so a different summation order would change the last bit (task 10 compares with a
tolerance for that reason), but here no order is free: average3, given in the file, adds left +
mid, then + right, and divides by 3. IEEE 754 rounds each of those three operations correctly,
nvcc at -O3 keeps them as add.f32, add.f32 and div.rn.f32 (no multiply, so nothing to contract
into an FMA; no reordering without --use_fast_math), and each round's inputs are the previous
round's outputs, identical by induction. The reference repeats the same three operations in
float32 with torch. One trap, avoided: torch on CUDA divides by a Python scalar as a
multiplication by its reciprocal, and s * (1/3) differs from s / 3 in the last bit for about a
third of random float32 s, so the reference divides by a tensor of threes, a true division. A
kernel that multiplies by 1/3, sums in another order or clamps one end wrong is off by at least
one unit in the last place somewhere in 2^20 elements; zeros, a pass-through of x and an fp16
rounding fail by far.

The timing case, n = 2^20 and 4 rounds, is small on purpose: the slow version costs a host round
trip of 8 MiB and a launch of 2^20 one-thread blocks per round (estimated at a few hundred
microseconds or more per round), and make profile-lab2 profiles at most 20 launches and prints
the first 8: 4 rounds of smooth_slow, then 4 of smooth_fast. The per-round ratio, which the
target measures, does not depend much on the number of rounds.

The target, 50x over smooth_slow: by the chapter's estimates the reference is hundreds of times
faster (a few microseconds per round against at least 130 us of PCIe copies plus the one-thread
kernel), while a version that fixes the host side but keeps one thread per block gets well under
50x (its 2^20 one-thread blocks take about 0.6 ms a round to start, empty or not, against the
2.3 ms a round measured for smooth_slow: some 4x) and must earn nothing (lab2/solutions/broken.py).
"""

from grader.tasks import NO_LIBRARIES, Case, CudaTask, Entry, In, Int, Out, PerfTarget, Rule
from grader.tasks.rules import no_runtime_calls

ARGS = [In("x"), Out("y"), Int("n"), Int("iters")]
SIZES = [1, 2, 3, 1000, (1 << 20) + 3]
ITERS = [1, 2, 10]
TIMING = (1 << 20, 4)


def label(n, iters):
    names = {(1 << 20) + 3: "2^20+3", 1 << 20: "2^20"}
    return f"n={names.get(n, n)} iters={iters}"


def make_inputs(p, rng):
    return {"x": rng.randn(p["n"]), "n": p["n"], "iters": p["iters"]}


def smooth_round(v):
    """One round in float32, with average3's operations in average3's order."""
    import torch

    padded = torch.cat([v[:1], v, v[-1:]])  # (n + 2,): each end repeated, the clamped neighbours
    s = padded[:-2] + padded[1:-1]  # left + mid
    s += padded[2:]  # + right
    return s.div_(torch.full_like(s, 3.0))  # a true division: not s / 3 (see the docstring)


def reference(v):
    y = v["x"]
    for _ in range(v["iters"]):
        y = smooth_round(y)
    return {"y": y}


def bytes_moved(v):
    # the bytes no version can avoid, x read and y written once: the rounds between can stay in L2
    # (2^20 floats per buffer), so counting them would let a fast run report more than DRAM can do
    return 8 * v["n"]


ENTRY = r"COURSE_API\s+cudaError_t\s+"

# A Rule reads the whole file (comments and strings stripped). The negative lookahead scopes this
# one to smooth_fast: a forbidden call with no definition of smooth_fast after it is in smooth_fast's
# body (the last function of the file, written in its TODO region), while smooth_slow's calls and
# those of the scratch helper, both above it, are left alone.
HOST_WORK_IN_FAST = Rule(
    "forbid",
    rf"(?s)\bcuda(?:Malloc\w*|Free\w*|Memcpy\w*|\w*Synchronize)\s*\((?!.*{ENTRY}smooth_fast\b)",
    "smooth_fast must not allocate, free, copy or synchronize, in its loop or around it: take the buffer"
    " from your scratch helper (allocated once, above smooth_fast), keep every round on the device, and"
    " leave the waiting to the grader",
)

# The mistakes these checks are designed to catch, each with the input or check that exposes it
# (lab2/solutions/broken.py has a variant of each).
MISTAKES = {
    "allocation per round": "the source rule on smooth_fast's body: a cudaMalloc, cudaFree, copy or synchronize in it",
    "edges": "n = 1, 2 and 3, where both ends clamp, compared bit for bit",
    "odd rounds": "iters = 1 and 10 beside 2: the last round must land in y whichever buffer the first writes",
    "slow kernel kept": "the 50x performance target on n = 2^20 with 4 rounds: one thread per block earns nothing",
}

TASK = CudaTask(
    lab="lab2",
    number="00",
    title="profile first",
    mistakes=MISTAKES,
    sources=["00_profile_first.cu"],
    entries=[
        # smooth_slow first: make profile-lab2 TASK=00 profiles the entry points in this order
        Entry("smooth_slow", ARGS, reference=reference, bytes_moved=bytes_moved),
        Entry("smooth_fast", ARGS, reference=reference, bytes_moved=bytes_moved),
    ],
    cases=[Case(label(n, k), n=n, iters=k) for n in SIZES for k in ITERS]
    + [Case(label(*TIMING), n=TIMING[0], iters=TIMING[1])],
    make_inputs=make_inputs,
    tolerance={"f32": (0.0, 0.0)},
    timing_case=label(*TIMING),
    rules=[
        NO_LIBRARIES,
        HOST_WORK_IN_FAST,
        # the same rule on what a call did (on a GPU): a macro or a helper spelling the calls
        # differently still allocates, copies or waits in the observed call; the scratch buffer's
        # one cudaMalloc belongs to the first call of a size, which is not the observed one
        no_runtime_calls(
            r"cuda(?:Malloc\w*|Free\w*|Memcpy\w*|\w*Synchronize)",
            "smooth_fast must not allocate, free, copy or synchronize once its scratch buffer exists",
            entries="smooth_fast",
        ),
    ],
    perf=[PerfTarget("smooth_fast", "speedup_over:smooth_slow", 50.0, 2, gate=True)],
)


def test_profile_first(grade):
    grade(TASK)

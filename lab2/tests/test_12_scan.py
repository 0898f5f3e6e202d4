"""Checks for lab2/12_scan.cu: the scan ladder, three inclusive prefix sums of n floats, from a
Hillis–Steele block scan in three phases to a single-pass scan with decoupled look-back, timed
against torch.cumsum.

The tolerance. Each rung adds the same numbers in its own order, and float32 addition is not
associative, so each output is compared with the float64 prefix sum. The inputs are |randn| + 0.5,
all positive, so no prefix cancels: a prefix whose longest chain of additions from an input to the
output has d additions is off by at most gamma_d = d·u/(1 - d·u) relative to the exact sum,
u = 2^-24 (Higham, Accuracy and Stability of Numerical Algorithms, §4.2), whatever the order.
The chains of the reference rungs:
- rung 1 (Hillis–Steele, tiles of 512): a tile's scan and its total are trees of depth
  log2 512 = 9. Level k of the three-phase recursion scans values that are already sums of depth
  9k, and adding the scanned totals back costs one addition per level: with L levels the depth is
  9 (L - 1) + 9 + (L - 1) = 10 L - 1, so 29 at n = 2^26 (L = 3) and 39 at n = 2^31 + 17 (L = 4).
- rung 2 (Blelloch, tiles of 1024): the up-sweep has depth 10, the down-sweep adds at most 10
  more, adding the element back 1: a tile's scan has depth 21 and its total depth 10. The same
  recursion gives 10 (L - 1) + 21 + (L - 1) = 11 L + 10: 43 at 2^26 (L = 3), 54 at 2^31 + 17 (L = 4).
- rung 3 (tiles of 4096): 31 sequential additions in a thread, 5 shuffle steps in the warp, 2
  across the 4 warps, 2 to combine them: 40 inside the tile (38 for the tile's total); the sums
  of whole tiles are carried in float64, which adds nothing measurable (for these inputs it is
  exact: every full tile's total is a float >= 2048, a multiple of 2^-12, and every sum of them
  stays below 2^35, within float64's 53 bits); rounding that prefix to float32 and adding it: 2
  more. d = 42 at every n.
The largest, d = 54, gives gamma_54 = 3.2e-6; with the float32 rounding of the reference itself
(u/2 = 3e-8) rtol = 4e-6 holds for every rung at every size, and still admits d <= 66 for a
student's variant (1024-thread blocks, say). Values >= 0.5 make every element count: a dropped
element shifts every later prefix by >= 0.5, more than the tolerance up to prefixes of ~1e5
(the cases n <= 4097 catch a lost tail); a block offset that is missing, or added to the wrong
block, is off by a whole tile's sum, 50% or more at the second tile; an exclusive scan is off by
100% at element 0.

Phase 3 runs 256 threads per tile of 512 (rung 1) or 1024 (rung 2) elements: from n = 1000 on, an
offset added to the first 256 elements of each tile only is caught.

Rung 3's look-back is checked by the sizes with many tiles (n = 2^20 + 3: 257 tiles; 2^24 and
2^26: 4096 and 16384): a look-back that takes the nearest tile's value as the whole prefix, or
that also adds the values beyond the nearest published prefix, is then off on most tiles, since
which tiles have published what when a block looks depends on timing, and with hundreds of tiles
in flight both situations occur in every run.
"""

from grader.tasks import NO_LIBRARIES, Case, CudaTask, Entry, In, Out, PerfTarget, Size, uses_shared_memory
from grader.tasks.ladder import Ladder
from grader.tasks.rules import executes

ARGS = [In("in"), Out("out"), Size("n")]
SIZES = [1, 2, 31, 32, 33, 1000, 1024, 1025, 4097, 8193, (1 << 20) + 3]
TIMING = 1 << 26
CHUNK = 1 << 28  # the reference's float64 cumsum, a chunk at a time: 2 GB of temporaries, not 17


def make_inputs(p, rng):
    n, offset = p["n"], p.get("offset", 0)
    # offset = 1: a view that starts one float (4 bytes) past a 16-byte boundary, for vector loads
    x = rng.randn(n + offset).abs_().add_(0.5)[offset:]
    return {"in": x, "n": n}


def reference(v):
    import torch

    x = v["in"]
    out = torch.empty_like(x)
    carry = torch.zeros((), dtype=torch.float64, device=x.device)
    for start in range(0, x.numel(), CHUNK):
        part = x[start : start + CHUNK].double().cumsum(0).add_(carry)
        out[start : start + CHUNK] = part
        carry = part[-1]
    return {"out": out}


def torch_cumsum(v, o):
    import torch

    torch.cumsum(v["in"], 0, out=o["out"])


def bytes_moved(v):
    return 8 * v["n"]  # every float read once and written once


def entry(symbol):
    return Entry(symbol, ARGS, reference=reference, baseline=torch_cumsum, bytes_moved=bytes_moved)


RUNGS = ["scan_1", "scan_2", "scan_3"]

# The mistakes these checks are designed to catch, each with the input or check that exposes it
# (lab2/solutions/broken.py has a variant of each).
MISTAKES = {
    "block offset": "n = 513 to 2^24, two or more tiles: a missing or misplaced offset is a whole tile off",
    "missing barrier": "the sanitizer (racecheck) on the small cases",
    "tail": "n = 1, 31, 33, 1025, 4097, 8193: a last partial tile",
    "exclusive scan": "every case: element 0 must be in[0]",
    "tile longer than its block": "n = 1000 and larger: phase 3's 256 threads cover a tile of 512 or 1024",
    "look-back stops early": "n = 2^20 + 3 and larger: the nearest tile has often published only its own total",
    "look-back past the prefix": "n = 2^20 + 3 and larger: a window of 32 tiles often holds several published prefixes",
}

TASK = CudaTask(
    lab="lab2",
    number="12",
    title="scan ladder",
    mistakes=MISTAKES,
    sources=["12_scan.cu"],
    entries=[entry(s) for s in RUNGS],
    cases=[Case(f"n={n}", n=n) for n in SIZES]
    + [
        Case("n=4097 view one float in", n=4097, offset=1),
        Case("n=2^24", n=1 << 24),
        Case("n=2^26", n=TIMING),
        Case("n=2^31+17", huge=True, n=(1 << 31) + 17),  # size_t indices (make grade only: 8 GiB in, 8 out)
    ],
    make_inputs=make_inputs,
    tolerance={"f32": (0.0, 4e-6)},
    timing_case="n=2^26",
    rules=[
        NO_LIBRARIES,
        # the SASS of the kernels rung 3 reaches, and of the one a call of it launched
        executes(r"SHFL\.UP", "rung 3 scans the thread totals of a warp with __shfl_up_sync", "scan_3"),
        uses_shared_memory("the block scans stage their tile in shared memory"),
    ],
    perf=[PerfTarget("scan_3", "speedup", 1.0, 2, gate=True)],
    ladder=Ladder(
        name="scan",
        rungs=RUNGS,
        sweep=[Case("n=2^20", n=1 << 20), Case("n=2^24", n=1 << 24), Case("n=2^26", n=TIMING)],
        baselines={"torch": torch_cumsum},
        metric="gbps",
        labels={
            "scan_1": "1 Hillis–Steele, three phases",
            "scan_2": "2 Blelloch (work-efficient), three phases",
            "scan_3": "3 registers + shuffles, single pass (decoupled look-back)",
        },
    ),
)


def test_scan(grade):
    grade(TASK)

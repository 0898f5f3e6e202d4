"""Checks for lab2/11_transpose.cu: the transpose ladder, three kernels that write out = in^T for
a row-major float32 matrix, from one thread per element to a padded shared-memory tile, timed
against torch's `out.copy_(x.t())` (what `x.t().contiguous()` runs).

The inputs are standard normal, so the elements of a matrix are distinct (with probability 1)
and none is zero: an element fetched from the wrong place, a tile entry never loaded (shared
memory holds whatever was there), or a zero from a lazy kernel all differ from the right value,
and an element never written still holds the grader's NaN poison. The tolerance is zero
(atol = rtol = 0). A transpose does no arithmetic: every element of out is a copy of one
element of in, bit for bit, so any difference at all is an error, and a tolerance would only
let a kernel that computes something pass as a transpose.

The shapes: 1 x 1, a single row and a single column (1 x 33, 33 x 1: tiles that overhang the
matrix on one side, and a row whose transpose is the same bytes), 31 x 65 and 65 x 31 (partial
tiles on both edges, non-square both ways, so swapped rows and cols in an index go wrong),
1000 x 1000 (square, not a multiple of 32), 2048 x 8192 (wide), 4096 x 4096 (timed), and
2200000 x 1 (68750 rows of tiles: more than the 65535 a grid's y dimension allows, which the
given one-dimensional grid handles).

The exact comparison on every shape but 1x1 also catches a tile stored in its transposed place but
read back along its rows, hence not transposed within itself.
"""

from grader.tasks import (
    NO_LIBRARIES,
    Case,
    CudaTask,
    Entry,
    In,
    Int,
    Out,
    PerfTarget,
    uses_shared_memory,
    uses_syncthreads,
)
from grader.tasks.ladder import Ladder

ARGS = [In("in"), Out("out"), Int("rows"), Int("cols")]
SHAPES = [(1, 1), (1, 33), (33, 1), (31, 65), (65, 31), (1000, 1000), (2048, 8192), (2_200_000, 1)]
TIMING = (4096, 4096)
TILED = r"transpose_(tiled|padded)_kernel"  # the kernels of rungs 2 and 3


def label(shape):
    return "x".join(str(s) for s in shape)


def case(shape):
    return Case(label(shape), rows=shape[0], cols=shape[1])


def make_inputs(p, rng):
    rows, cols = p["rows"], p["cols"]
    return {"in": rng.randn(rows, cols), "rows": rows, "cols": cols}


def reference(v):
    return {"out": v["in"].t().contiguous()}


def torch_transpose(v, o):
    o["out"].copy_(v["in"].t())  # one strided copy kernel: stores coalesced, loads cols * 4 bytes apart


def bytes_moved(v):
    return 8 * v["rows"] * v["cols"]  # every element read once and written once


def entry(symbol):
    return Entry(symbol, ARGS, reference=reference, baseline=torch_transpose, bytes_moved=bytes_moved)


RUNGS = ["transpose_1", "transpose_2", "transpose_3"]

# The mistakes these checks are designed to catch, each with the input or check that exposes it
# (lab2/solutions/broken.py has a variant of each).
MISTAKES = {
    "tile overhang": "1x1, 1x33, 31x65 and 65x31: tiles that hang over the edges, behind the grader's fence",
    "missing barrier": "the sanitizer (racecheck) on the small cases",
    "non-square": "1x33, 33x1, 31x65 and 2048x8192: out's rows are `rows` long, not `cols`",
    "bank conflicts": "rung 3's performance targets on 4096x4096",
    "tile not transposed": "1x33 and every non-trivial shape: the bits of out compared exactly",
}

TASK = CudaTask(
    lab="lab2",
    number="11",
    title="transpose ladder",
    mistakes=MISTAKES,
    sources=["11_transpose.cu"],
    entries=[entry(s) for s in RUNGS],
    cases=[case(s) for s in [*SHAPES, TIMING]],
    make_inputs=make_inputs,
    tolerance={"f32": (0.0, 0.0)},
    timing_case=label(TIMING),
    rules=[
        NO_LIBRARIES,
        uses_shared_memory("rungs 2 and 3 stage each tile through a __shared__ array", kernels=TILED),
        uses_syncthreads(
            "in rungs 2 and 3 a thread stores tile elements that other warps loaded: a __syncthreads() "
            "between the tile's loads and its reads",
            kernels=TILED,
        ),
    ],
    perf=[
        PerfTarget("transpose_3", "share_of_copy", 0.85, 2, gate=True),
        PerfTarget("transpose_3", "speedup", 2.5, 2, gate=True),
    ],
    ladder=Ladder(
        name="transpose",
        rungs=RUNGS,
        sweep=[case((1024, 1024)), case(TIMING), case((8192, 8192))],
        baselines={"torch": torch_transpose},
        metric="gbps",
        labels={
            "transpose_1": "1 naive (stores strided)",
            "transpose_2": "2 shared-memory tile `[32][32]`",
            "transpose_3": "3 padded tile `[32][33]`",
        },
    ),
)


def test_transpose(grade):
    grade(TASK)

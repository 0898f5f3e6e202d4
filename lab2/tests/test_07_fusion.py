"""Checks for lab2/07_fusion.cu: y = silu(x + bias) over a row-major matrix in one kernel, timed
against bias_silu_unfused, given in the file (add_bias, then silu_inplace re-reading its output).

x is standard normal times 4 (so SiLU's negative side, its curve and its linear side all appear)
and bias standard normal. Shapes include cols that are not a multiple of 4 or 32. The reference is
float64; the tolerance is float32's default, as for lab 1's SiLU.

Every shape but 4096x4096 has cols that are not a multiple of the 256-thread block: a kernel
without its column guard writes past the end of y, inside the grader's fence.
"""

from grader.tasks import NO_LIBRARIES, Case, CudaTask, Entry, In, Int, Out, PerfTarget
from grader.tasks.rules import launches

ARGS = [In("x"), In("bias"), Out("y"), Int("rows"), Int("cols")]
SHAPES = [(1, 1), (3, 5), (33, 17), (1000, 1000), (70000, 3)]
TIMING = (4096, 4096)


def label(shape):
    return "x".join(str(s) for s in shape)


def make_inputs(p, rng):
    rows, cols = p["rows"], p["cols"]
    return {"x": rng.randn(rows, cols) * 4.0, "bias": rng.randn(cols), "rows": rows, "cols": cols}


def reference(v):
    import torch

    return {"y": torch.nn.functional.silu(v["x"].double() + v["bias"].double())}


def torch_unfused(v, o):
    import torch

    # two kernels, as bias_silu_unfused: the add writes y, the in-place SiLU reads it back
    torch.nn.functional.silu(torch.add(v["x"], v["bias"], out=o["y"]), inplace=True)


def fused_bytes(v):
    return 8 * v["rows"] * v["cols"] + 4 * v["cols"]  # x read and y written once; bias once


def unfused_bytes(v):
    return 16 * v["rows"] * v["cols"] + 4 * v["cols"]  # y also written, read back and written again


# The mistakes these checks are designed to catch, each with the input or check that exposes it
# (lab2/solutions/broken.py has a variant of each).
MISTAKES = {
    "bias broadcast axis": "3x5 and 33x17: bias indexed by the row reads other values",
    "rows past the grid": "70000x3: more rows than gridDim.y holds",
    "column tail": "1x1, 3x5 and 33x17: cols not a multiple of the block, written past y's end",
}

TASK = CudaTask(
    lab="lab2",
    number="07",
    title="fusion (bias + SiLU)",
    mistakes=MISTAKES,
    sources=["07_fusion.cu"],
    entries=[
        Entry("bias_silu", ARGS, reference=reference, baseline=torch_unfused, bytes_moved=fused_bytes),
        Entry("bias_silu_unfused", ARGS, reference=reference, baseline=torch_unfused, bytes_moved=unfused_bytes),
    ],
    cases=[Case(label(s), rows=s[0], cols=s[1]) for s in [*SHAPES, TIMING]],
    make_inputs=make_inputs,
    timing_case=label(TIMING),
    rules=[
        NO_LIBRARIES,
        # on a GPU, what one call of bias_silu launched: a second kernel (or a kernel of torch's) is no fusion
        launches(1, "bias_silu is one fused kernel: the bias and the SiLU in one pass over y", "bias_silu"),
    ],
    perf=[PerfTarget("bias_silu", "speedup_over:bias_silu_unfused", 1.4, 2, gate=True)],
)


def test_fusion(grade):
    grade(TASK)

"""Deliberately broken lab 2 submissions, written as edits to the reference solutions.

tests/test_broken_variants.py applies each edit, grades the result and expects the verdict
given here, as for lab 1 (lab1/solutions/broken.py). Keeping them as edits means they follow
the solutions: if a solution changes so that an edit no longer applies, the test says so
instead of grading a stale copy.
"""

from __future__ import annotations

from grader.tests.variants import Variant

FUSED_ROWS = (
    "    for (int r = blockIdx.y; r < rows; r += gridDim.y) {\n"
    "        const size_t i = (size_t)r * cols + col;\n"
    "        y[i] = silu(x[i] + b);\n"
    "    }\n"
)

VARIANTS: dict[str, Variant] = {
    "01_coalescing.misses_the_tail": Variant(
        "01_coalescing.cu",
        [("        if (start + 2 * pairs < n) c[n - 1] = a[n - 1] + b[n - 1];\n", "")],
        {"wrong"},
        # the misaligned-views check runs before the cases and fails first (n = 2, all three one
        # element in): its message says "is wrong for", not "never written"
        "wrong",
        "the odd last element after the last whole pair is never added",
    ),
    "07_fusion.bias_by_row": Variant(
        "07_fusion.cu",
        [
            ("    const float b = bias[col];\n", ""),
            ("        y[i] = silu(x[i] + b);\n", "        y[i] = silu(x[i] + bias[r]);\n"),
        ],
        {"wrong"},
        "wrong",
        "indexes bias by the row instead of the column (right only for 1x1; 3x5 reads bias in bounds)",
    ),
    "07_fusion.no_row_loop": Variant(
        "07_fusion.cu",
        [
            (
                FUSED_ROWS,
                "    const size_t i = (size_t)blockIdx.y * cols + col;  // one row per block row\n"
                "    y[i] = silu(x[i] + b);\n",
            )
        ],
        {"wrong"},
        "never written",
        "no loop over the rows beyond gridDim.y: rows 65535 and on of the 70000-row case stay unwritten",
    ),
    "10_reduction.last_warp_race": Variant(
        "10_reduction.cu",
        [
            (
                "            partial[t] = v;\n            __syncwarp();\n            v += partial[t + offset];\n",
                "            partial[t] = v;\n            v += partial[t + offset];\n",
            )
        ],
        {"sanitizer", "wrong"},
        "",
        "rung 4's last warp reads its neighbour's shared-memory value with no __syncwarp after the write"
        " (one __syncwarp is left, so the source rule that requires it is satisfied)",
    ),
    "10_reduction.drops_the_tail": Variant(
        "10_reduction.cu",
        [
            ("    const size_t tail = count - head - 4 * vecs;\n", ""),
            ("    if (tid < tail) v += in[head + 4 * vecs + tid];\n", ""),
        ],
        {"wrong"},
        "wrong",
        "rung 6 forgets the (up to 3) elements after the last whole float4",
    ),
}

# one grading run per batch: each batch mixes tasks, so a hang or a crash must not stop the rest
BATCHES = [
    ["01_coalescing.misses_the_tail", "07_fusion.bias_by_row", "10_reduction.drops_the_tail"],
    ["07_fusion.no_row_loop"],
]
SANITIZED = ["10_reduction.last_warp_race"]  # graded with compute-sanitizer as well
# verdicts the build decides (the rules judge what was compiled): graded on a machine without a GPU too
AT_BUILD: list[str] = []
HUGE: list[str] = []  # graded with the cases past 2^31 elements (tens of GB of GPU memory)
# graded with timing on (quick): they pass every correctness check and game only the timed calls
TIMED: list[str] = []

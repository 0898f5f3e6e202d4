"""Checks for lab1/02_matrix_add.cu: C = A + B over (rows, cols) row-major with 16x16 blocks."""

from grader.tasks import NO_LIBRARIES, Case, CudaTask, Entry, In, Int, Out

SHAPES = [(1, 1), (1, 2), (2, 1), (16, 16), (17, 17), (31, 33), (33, 31), (100, 257), (1000, 1000), (4096, 4096)]


def make_inputs(p, rng):
    r, c = p["rows"], p["cols"]
    return {"A": rng.randn(r, c), "B": rng.randn(r, c), "rows": r, "cols": c}


def baseline(v, o):
    import torch

    torch.add(v["A"], v["B"], out=o["C"])


TASK = CudaTask(
    lab="lab1",
    number="02",
    title="matrix add (2D blocks)",
    sources=["02_matrix_add.cu"],
    entries=[
        Entry(
            "matrix_add",
            [In("A"), In("B"), Out("C"), Int("rows"), Int("cols")],
            reference=lambda v: {"C": v["A"] + v["B"]},
            baseline=baseline,
            bytes_moved=lambda v: 12 * v["rows"] * v["cols"],
        )
    ],
    cases=[Case(f"{r}x{c}", rows=r, cols=c) for r, c in SHAPES],
    make_inputs=make_inputs,
    output_shapes=lambda v: {"C": (v["rows"], v["cols"])},
    timing_case="4096x4096",
    rules=[NO_LIBRARIES],
)


def test_matrix_add(grade):
    grade(TASK)
